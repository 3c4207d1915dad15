"""The Gluon prefill GEMM timed with programs other than one a tile: K splits and stream-K (P programs
sharing all the tiles' K steps), beside one a tile, at several stage counts (NS 4 leaves room for one
program an SM, NS 3 for two). Checks every variant against the first one's output.

    python3 benchmarks/tools/probe_gluon_programs.py OUT.json [NS:P[:NW] ...]

P is a number or `tiles` / `2tiles` (skipped past the SM count) / `2tiles2` (past twice that: two an SM);
NS:P:NW runs NW warps (default 4; 8: 128-row tiles, `tiles` counts those).
Default: 3:tiles 3:2tiles 3:132 3:264. CUDA-graph medians, q2_g16 / q1_g32 / q4_g128 at kimi-k3.1-pro's
gate and down shapes, bf16 matmul beside them."""
from __future__ import annotations

import json
import sys

import torch

from strata_plan.kernels import bench as B
from strata_plan.kernels import ops
from strata_plan.kernels.triton_common import FORMAT_CODES, format_constants

CASES = (("q2_g16_s8m4", "gate", (3584, 7168), (16, 128, 256, 512, 1024, 2048, 4096)),
         ("q2_g16_s8m4", "down", (7168, 3584), (512, 2048)),
         ("q1_g32_s8m4", "gate", (3584, 7168), (512, 2048)),
         ("q4_g128_f16", "gate", (3584, 7168), (512, 2048)),
         ("q4_g128_f16", "down", (7168, 3584), (512, 2048)))


def programs(spec: str, tiles: int, sms: int) -> int | None:
    p = tiles if spec == "tiles" else 2 * tiles if spec.startswith("2tiles") else int(spec)
    return None if (spec == "2tiles" and p > sms) or (spec == "2tiles2" and p > 2 * sms) else p


def main() -> None:
    out, specs = sys.argv[1], [s.split(":") for s in (sys.argv[2:] or ["3:tiles", "3:2tiles", "3:132", "3:264"])]
    gg, dev = ops.gluon_module(), torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    res = {"gpu": torch.cuda.get_device_name(dev), "command": " ".join(["python3"] + sys.argv)}
    for fmt, name, (n, k), ms in CASES:
        c = format_constants(FORMAT_CODES.index(fmt))
        mats = ops._matrix_args(B.random_packed(fmt, n, k, dev))
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            o = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
            row, base = {}, None
            for ns, spec, *opt in specs:
                nw = int(opt[0]) if opt else 4
                tiles = gg.tiles(m, n, 256, nw)
                p = programs(spec, tiles, sms)
                key = f"ns{ns}_P{p}" + (f"_w{nw}" if nw != 4 else "")
                if p is None or key in row:
                    continue
                part = torch.empty(gg.part_numel(p, 256, nw), device=dev)
                cnt = torch.zeros(tiles, dtype=torch.int32, device=dev)

                def f():
                    gg.gemm_gluon(x, mats, c, n, o, bt=256, ns=int(ns), num_warps=nw, programs=p, part=part, cnt=cnt)
                f()
                torch.cuda.synchronize()
                base = o.clone() if base is None else base
                err = ((o.float() - base.float()).norm() / base.float().norm()).item()
                row[key] = {"ms": round(B.graph_ms(f, reps=10), 4), "rel_err_vs_first": float(f"{err:.2e}")}
            w = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
            row["bf16_ms"] = round(B.graph_ms(lambda: torch.matmul(x, w.T), reps=10), 4)
            res[f"{fmt}_{name}_M{m}"] = row
            print(fmt, name, m, {kk: v["ms"] if isinstance(v, dict) else v for kk, v in row.items()}, flush=True)
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
