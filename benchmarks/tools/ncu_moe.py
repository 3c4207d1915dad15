"""One kimi-k3.1-pro MoE layer (top 8 in the seed's tier mix, batch 1) run a few times, for Nsight Compute.

    ncu --clock-control none --section SpeedOfLight --section Occupancy ... \
        -k regex:"gate_up_kernel|down_kernel" python3 benchmarks/tools/ncu_moe.py '{"rows1": 128}' [hidden inter]

The JSON argument overrides the launch config this GPU gets (`strata_plan/kernels/tuned.py: config_for`). ncu flushes the caches before each
profiled launch, so one layer's weights are enough (no rotation needed as in bench_kernels.py)."""
from __future__ import annotations

import json
import sys

import torch

from strata_plan.kernels import bench as B
from strata_plan.kernels import ops
from strata_plan.kernels.formats import tier_mix
from strata_plan.kernels.tuned import config_for, make


def main() -> None:
    cfg = make("moe", json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}, config_for("moe", "mix", 1, 0, 0, "cuda"))
    hidden, inter = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (7168, 3584)
    dev = torch.device("cuda")
    names = tier_mix().names(8)
    arena, offsets = B.random_expert_blobs(names, hidden, inter, dev)
    fm = ops.ExpertFormats.from_names(names, dev)
    ids = torch.arange(8, device=dev, dtype=torch.int32)[None]
    wts = torch.softmax(torch.randn(1, 8, device=dev), -1)
    x = torch.randn(1, hidden, dtype=torch.bfloat16, device=dev)
    out = torch.empty(1, hidden, dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        ops.fused_moe(x, ids, wts, arena, offsets, fm, hidden, inter, out=out, config=cfg)
    torch.cuda.synchronize()
    print("config", cfg, "experts", names)


if __name__ == "__main__":
    main()
