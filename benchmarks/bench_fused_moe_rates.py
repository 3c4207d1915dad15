"""The profiler's fused MoE rates on this GPU (strata_plan/profiler/moe.py), written into a copy of a shipped profile.

    STRATA_GIT_SHA=<sha> python benchmarks/bench_fused_moe_rates.py --profile h200 --out-dir OUT [--repeats 10]

Measures the fused MoE decode call at the profiler's expert shapes and the prefill expansion rate (a
whole 384-expert kimi-k3.1-pro layer at M = 512 and 2048), exactly as `strata-plan profile` does, and
writes OUT/<profile>.yaml: the shipped profile with `fused_moe_decode` and `fused_moe_prefill` replaced
by these measurements (everything else unchanged), and the result JSON (benchmark `profiler-fused-moe`,
benchmarks/_result.py) with the microseconds a layer and milliseconds a chunk. Copy the YAML over
strata_plan/profiles/<profile>.yaml and the JSON into benchmarks/results/, then `python benchmarks/summarize.py`.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

from _result import write_result  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200", help="shipped profile to add the measurements to (default h200)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    import torch

    from strata_plan.profiler import moe
    from strata_plan.profiler.run import fused_moe_entries
    from strata_plan.profiles.schema import load_profile, save_profile
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    res = moe.measure(moe.MoESettings(repeats=args.repeats), "cuda")
    prof = load_profile(args.profile)
    gpu = dataclasses.replace(prof.gpu, **fused_moe_entries(res))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = save_profile(dataclasses.replace(prof, gpus=(gpu, *prof.gpus[1:])), out / f"{args.profile}.yaml")
    metrics = {"decode": {f"{h}x{i}": {"top_k": k, "layer_bytes": b, "GBps": v, "us_per_layer": round(res.decode_us[(h, i)], 2)}
                          for h, i, k, b, v in res.decode},
               "prefill": {f"M{m}": {"experts": e, "Gweights_expanded_per_s": v, "ms": round(res.prefill_ms[m], 3)}
                           for _, _, _, e, m, v in res.prefill},
               "gpu": torch.cuda.get_device_name(0)}
    for h, i, k, b, v in res.decode:
        print(f"fused MoE decode {h}x{i} top-{k}: {res.decode_us[(h, i)]:.1f} us a layer, {v:.0f} GB/s")
    for *_, e, m, v in res.prefill:
        print(f"fused MoE prefill M={m}, {e} experts: {res.prefill_ms[m]:.2f} ms, {v:.0f} G weights expanded/s")
    notes = ("The profiler's fused MoE rates (strata_plan/profiler/moe.py, as `strata-plan profile` measures them): decode GB/s "
             "of one layer's top-k experts in the tier mix at each expert shape, and weights expanded a second by the "
             f"prefill call on a whole layer; written into strata_plan/profiles/{args.profile}.yaml as fused_moe_decode / "
             "fused_moe_prefill, which the planner's decode kernel rate and prefill expansion term read.")
    print(f"wrote {path} and {write_result('profiler-fused-moe', metrics, out_dir=out, notes=notes)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
