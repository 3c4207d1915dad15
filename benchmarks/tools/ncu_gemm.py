"""The prefill GEMM (packed weights, kimi-k3.1-pro gate shape 3584 x 7168) run a few times, for Nsight
Compute.

    ncu --section WarpStateStats ... -k regex:gemm_kernel python3 benchmarks/tools/ncu_gemm.py '{"prefetch_scales": false}' [M] [fmt]

The JSON argument overrides the launch config this GPU gets (`strata_plan/kernels/tuned.py: config_for`); M
defaults to 2048, the format to q2_g16_s8m4. ncu flushes the caches before each profiled launch."""
from __future__ import annotations

import json
import sys

import torch

from strata_plan.kernels import bench as B
from strata_plan.kernels import ops
from strata_plan.kernels.tuned import config_for, make


def main() -> None:
    m = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    fmt = sys.argv[3] if len(sys.argv) > 3 else "q2_g16_s8m4"
    n, k = 3584, 7168
    cfg = make("gemm", json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}, config_for("gemm", fmt, m, n, k, "cuda"))
    p = B.random_packed(fmt, n, k, torch.device("cuda"))
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        ops.packed_linear(x, p, out=out, config=cfg)
    torch.cuda.synchronize()
    print("config", cfg, "format", fmt, "M", m)


if __name__ == "__main__":
    main()
