"""Diagnostic (GPU, seconds): the GPU time of the lookahead's slot kernels (`kernels.prefetch`) in a CUDA graph, beside
one small kernel (the launch floor the cost model charges each of them at).

    python3 benchmarks/tools/lookahead_kernels_probe.py [SLOTS ...]     # default 24 48 96; prints microseconds a call

A state of SLOTS staging slots for 9 MoE layers of 64 experts, top-6 (bench-moe's shape), every expert in RAM; each
kernel captured 200 times in one graph (the state it leaves is what the next call sees: after the first `release`
the slots are FREE, which costs `release` the same scan), median of 10 replays. Not a benchmark: no results file."""
import sys

import torch

from strata_plan.kernels import prefetch as pk
from strata_plan.profiler.moe import cuda_graph_seconds

L, E, K, N = 9, 64, 6, 200


def main() -> None:
    dev = torch.device("cuda")
    ids = torch.arange(K, dtype=torch.int64, device=dev)
    x = torch.zeros(16, device=dev)
    print(f"{torch.cuda.get_device_name()}: microseconds a call in a graph (median of 10 replays of {N})")
    floor = cuda_graph_seconds(lambda: [x.add_(1) for _ in range(N)], 10) / N * 1e6
    print(f"  one small kernel (x.add_): {floor:.2f}")
    for S in [int(a) for a in sys.argv[1:]] or [24, 48, 96]:
        st = pk.probe_state(S, L, E, K, dev)
        calls = {"resolve": lambda: pk.resolve(ids, 0, st), "release": lambda: pk.release(L - 1, st),
                 "claim": lambda: pk.claim(ids, 1, st)}
        got = {name: cuda_graph_seconds(lambda f=f: [f() for _ in range(N)], 10) / N * 1e6 for name, f in calls.items()}
        print(f"  S={S}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)


if __name__ == "__main__":
    main()
