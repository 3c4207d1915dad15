"""The warp-specialized prefill GEMM (kernels/gluon_ws.py) beside the shipped Gluon GEMM and bf16 matmul.

    python3 benchmarks/probe_gluon_ws.py OUT.json [--sustained-s 2] [--quick]

Checks every variant's output against the shipped kernel's first (relative error; both expand the same
bf16 weights), then times CUDA-graph replays (bursts) and, with --sustained-s, every cell back to back
(kernels.bench.sustained). Shapes: kimi-k3.1-pro's gate (3584 x 7168) and down (7168 x 3584) at M = 512
and 2048. Variants: (warps of the MMA partition, x stages NS, A tiles NA)."""
from __future__ import annotations

import argparse
import json

import torch

from strata_plan.kernels import bench as B
from strata_plan.kernels import gluon_ws, ops
from strata_plan.kernels.triton_common import FORMAT_CODES, format_constants
from strata_plan.kernels.tuned import config_for

SHAPES = {"gate": (3584, 7168), "down": (7168, 3584)}
FORMATS = ("q2_g16_s8m4", "q1_g32_s8m4", "q4_g128_f16")
# (MMA warps, x stages, A tiles, expand warps, their registers); --quick: all; otherwise the first
VARIANTS = ((4, 3, 2, 8, 160), (4, 3, 3, 8, 160), (8, 3, 3, 4, 152))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sustained-s", type=float, default=0.0)
    ap.add_argument("--quick", action="store_true", help="q2_g16 gate at M = 2048 only, every variant")
    ap.add_argument("--formats", default=",".join(FORMATS))
    a = ap.parse_args()
    dev = torch.device("cuda")
    res = {"gpu": torch.cuda.get_device_name(dev), "cells": {}}
    cells = [("q2_g16_s8m4", "gate", 2048)] if a.quick else [
        (f, s, m) for f in a.formats.split(",") for s in SHAPES for m in (512, 2048)]
    for fmt, shape, m in cells:
        n, k = SHAPES[shape]
        c = format_constants(FORMAT_CODES.index(fmt))
        p = B.random_packed(fmt, n, k, dev)
        mats = ops._matrix_args(p)
        x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        w = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
        o = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
        cfg = config_for("gemm", fmt, m, n, k, dev)
        ref = ops.packed_linear(x, p, config=cfg).float()
        row = {"bf16_ms": B.graph_ms(lambda: torch.matmul(x, w.T), reps=10),
               "shipped_ms": B.graph_ms(lambda: ops.packed_linear(x, p, out=o, config=cfg), reps=10)}
        calls = {"bf16": lambda: torch.matmul(x, w.T), "shipped": lambda: ops.packed_linear(x, p, out=o, config=cfg)}
        for nw, ns, na, xw, rg in (VARIANTS if a.quick else VARIANTS[:1]):
            key = f"ws_w{nw}_ns{ns}_na{na}_xw{xw}"
            o.fill_(float("nan"))

            def f(nw=nw, ns=ns, na=na, xw=xw, rg=rg):
                gluon_ws.gemm_ws(x, mats, c, n, o, bt=256, ns=ns, na=na, num_warps=nw, xw=xw, regs=rg)
            f()
            torch.cuda.synchronize()
            err = float((o.float() - ref).norm() / ref.norm())
            row[key] = {"rel_err_vs_shipped": err}
            if not err < 1e-2:
                print(fmt, shape, m, key, "WRONG", err, flush=True)
                continue
            row[key]["ms"] = B.graph_ms(f, reps=10)
            calls[key] = f
        if a.sustained_s > 0:
            row["sustained"] = {name: B.sustained(fn, a.sustained_s) for name, fn in calls.items()}
        res["cells"][f"{fmt} {shape} M={m}"] = row
        print(fmt, shape, m, json.dumps(row), flush=True)
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
