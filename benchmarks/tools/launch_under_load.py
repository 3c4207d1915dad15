"""Diagnostic (GPU, about 20 s): does a chain of small kernels in a CUDA graph run slower while another stream keeps
the PCIe link busy? The lookahead's copies ran beside the decode step's main chain, whose kernels kept their durations
while the gaps between them widened (benchmarks/tools/step_kernels.py); a longer copy (fewer thread blocks) widened
them more. This separates the link from the SMs.

    python3 benchmarks/tools/launch_under_load.py          # prints us a kernel; writes $OUT/launch_under_load.json

The chain: a graph of N in-place adds on a one-element tensor (`profiler.gpu.add_chain`, the launch floor's probe),
replayed and timed with CUDA events on the main stream, alone and while a side stream runs, started just before it and lasting longer:
  zero_copy   `kernels.stream_read` reading registered pinned RAM in place (as fused_moe and the lookahead's copy read
              it: the SMs pull the bytes over PCIe), at its default programs and at 16
  dma         a pinned host -> device copy (the copy engine moves the bytes, no SM)
  hbm         device -> device copies of the same size, 8 of them (the SMs and HBM busy, the link idle)
Median of 7 replays each. Not a benchmark: no results file."""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import torch

from strata_plan.kernels.stream_read import programs_for, stream_read
from strata_plan.profiler.gpu import ZeroCopyProbe, add_chain, replay_us

N = 512                  # kernels in the chain
LOAD = 1 << 30           # bytes the side stream moves (about 20 ms over PCIe: longer than the chain)


def chain_us(g: torch.cuda.CUDAGraph, load=None, side: torch.cuda.Stream | None = None, n: int = N, reps: int = 7,
             warmup: int = 0) -> float:
    """Microseconds a kernel of the n-kernel chain's replay (median of `reps` after `warmup`), with `load()`
    enqueued on `side` just before each."""
    out = []
    for _ in range(warmup + reps):
        torch.cuda.synchronize()
        if load is not None:
            with torch.cuda.stream(side):
                load()
        out.append(replay_us(g) / n)
    torch.cuda.synchronize()
    return statistics.median(out[warmup:])


def main() -> None:
    dev = torch.device("cuda")
    g, _ = add_chain(N)
    side = torch.cuda.Stream()
    probe = ZeroCopyProbe(LOAD, dev)
    host = torch.empty(LOAD, dtype=torch.uint8, pin_memory=True)
    dst, src = torch.empty(LOAD, dtype=torch.uint8, device=dev), torch.empty(LOAD, dtype=torch.uint8, device=dev)
    out16 = torch.empty(16, dtype=torch.int64, device=dev)
    loads = {
        "alone": None,
        f"zero_copy ({programs_for(dev, LOAD)} programs)": lambda: probe.read(0, LOAD),
        "zero_copy (16 programs)": lambda: stream_read(probe.arena, probe.base, LOAD, out16),
        "dma": lambda: dst.copy_(host, non_blocking=True),
        "hbm": lambda: [dst.copy_(src) for _ in range(8)],
    }
    for f in loads.values():              # compiled and warmed
        if f is not None:
            with torch.cuda.stream(side):
                f()
    torch.cuda.synchronize()
    got = {name: chain_us(g, f, side) for name, f in loads.items()}
    print(f"{torch.cuda.get_device_name()}: us a kernel of a {N}-kernel graph chain, median of 7")
    for name, us in got.items():
        print(f"  {name:28s} {us:6.2f}  ({us / got['alone']:.2f}x alone)")
    probe.close()
    out = Path(os.environ.get("OUT", "."))
    (out / "launch_under_load.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "us": got}, indent=1))


if __name__ == "__main__":
    main()
