"""SM clock and board power while the prefill GEMM runs back to back, against bf16 torch.matmul: is the
packed GEMM's gap to bf16 the clock (power) or the schedule?

    python3 benchmarks/probe_clocks.py OUT.json [SECONDS [BT:NW ...]]

Each case is `kernels.bench.sustained` (a CUDA graph of 20 calls replayed back to back for SECONDS,
default 2, NVML's SM clock and power sampled): bf16 matmul, then the Gluon GEMM whole and, at M = 2048,
its PROF diagnostics 1-3 (MMA alone, dequantization alone, without the x copies), for each tile shape
BT:NW (tokens, warps; default 256:4). q2_g16 and q1_g32 at kimi-k3.1-pro's gate shape (3584 x 7168),
M = 2048 and 512. Energy a call = ms x W."""
from __future__ import annotations

import json
import sys

import torch

from strata_plan.kernels import bench as B
from strata_plan.kernels import ops
from strata_plan.kernels.triton_common import FORMAT_CODES, format_constants


def main() -> None:
    out, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    shapes = [tuple(int(v) for v in a.split(":")) for a in sys.argv[3:]] or [(256, 4)]
    gg, dev = ops.gluon_module(), torch.device("cuda")
    res = {"gpu": torch.cuda.get_device_name(dev), "command": " ".join(["python3"] + sys.argv)}
    n, k = 3584, 7168
    w = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
    for m in (2048, 512):
        x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        res[f"bf16_M{m}"] = row = B.sustained(lambda: torch.matmul(x, w.T), seconds)
        print("bf16", m, row, flush=True)
        for fmt in ("q2_g16_s8m4", "q1_g32_s8m4"):
            c = format_constants(FORMAT_CODES.index(fmt))
            mats = ops._matrix_args(B.random_packed(fmt, n, k, dev))
            o = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
            for bt, nw in shapes:
                for prof in (0, 1, 2, 3) if m == 2048 else (0,):
                    key = f"{fmt}_M{m}_bt{bt}_w{nw}_prof{prof}"
                    res[key] = row = B.sustained(lambda: gg.gemm_gluon(x, mats, c, n, o, bt=bt, ns=3, num_warps=nw,
                                                                       prof=prof), seconds)
                    print(key, row, flush=True)
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
