"""GPU probe of kernels/gluon_gemm.py: correctness against the torch reference, then times beside the
Triton GEMM and bf16 torch.matmul. python benchmarks/gluon_probe.py OUT_JSON [configs as JSON list]"""
import json, statistics, sys, time, traceback
import torch
from strata_plan.kernels import ops, quantize
from strata_plan.kernels import reference as R
from strata_plan.kernels import bench as B
from strata_plan.kernels import gluon_gemm as G
from strata_plan.kernels.triton_common import format_constants, FORMAT_CODES

dev = "cuda"
res = {"gpu": torch.cuda.get_device_name(0), "correct": {}, "times": {}}
cfgs = json.loads(sys.argv[2]) if len(sys.argv) > 2 else [{"bnw": 64, "bt": 128, "ns": 4}]
FMTS = ["q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "q4_g128_f16"]


def run(x, p, out, cfg):
    c = format_constants(FORMAT_CODES.index(p.fmt))
    G.gemm_gluon(x, ops._matrix_args(p), c, p.n, out, **cfg)


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


for fmt in FMTS:
    for (m, n, k) in ((33, 200, 1024), (300, 136, 1536), (1, 64, 512), (129, 3584 // 8, 7168 // 4)):
        for cfg in cfgs:
            key = f"{fmt} M{m} N{n} K{k} {json.dumps(cfg)}"
            try:
                p = quantize(torch.randn(n, k), fmt).to(dev)
                x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
                out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
                run(x, p, out, cfg)
                torch.cuda.synchronize()
                ref = R.linear(x.float(), p)
                tri = ops.packed_linear(x, p)
                res["correct"][key] = {"vs_ref": rel(out, ref), "triton_vs_ref": rel(tri, ref),
                                       "nan": bool(out.isnan().any())}
            except Exception as e:
                res["correct"][key] = {"error": traceback.format_exc()[-1500:]}
            print(key, res["correct"][key], flush=True)

for name, (n, k) in (("gate", (3584, 7168)), ("down", (7168, 3584))):
    w = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
    for m in (512, 2048):
        x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        bf = B.graph_ms(lambda: torch.matmul(x, w.T), reps=20)
        row = {"bf16_ms": round(bf, 4)}
        for fmt in FMTS:
            p = B.random_packed(fmt, n, k, dev)
            o = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
            row[fmt + " triton"] = round(B.graph_ms(lambda: ops.packed_linear(x, p, out=o), reps=20) / bf, 3)
            for cfg in cfgs:
                try:
                    row[f"{fmt} gluon {json.dumps(cfg)}"] = round(B.graph_ms(lambda: run(x, p, o, cfg), reps=20) / bf, 3)
                except Exception as e:
                    row[f"{fmt} gluon {json.dumps(cfg)}"] = repr(e)[:300]
        res["times"][f"{name} M{m}"] = row
        print(name, m, row, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
