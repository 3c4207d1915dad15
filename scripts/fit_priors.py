#!/usr/bin/env python
"""Fit the named routing priors to the real data in ../shared/data/routing and show the fit.

    python scripts/fit_priors.py            # fit, print the table, compare with the shipped priors
    python scripts/fit_priors.py --write    # also (re)write strata_plan/core/routing/priors/*.yaml

mixtral-like: Zipf s to Mixtral-8x7B popularity (Fiddler's MMLU tables + the OLMoE paper's Mixtral
counts), locality to the Mixtral decode trace's previous-token reuse. olmoe-like: Zipf s to OLMoE-1B-7B's
expert counts; locality borrowed from mixtral-like (no OLMoE data has token order). Out-of-sample
checks: the Mixtral trace's own popularity, and OLMoE-SFT/DPO's counts.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from strata_plan.core.routing import compute_stats, load_prior, save_prior
from strata_plan.core.routing import fit as F
from strata_plan.core.routing.convert import trace_from_jsonl
from strata_plan.core.routing.priors import PRIORS_DIR, SCHEMA_NAME, SCHEMA_VERSION, Prior, PriorFit

ROOT = Path(__file__).resolve().parents[1]
METHOD = ("target: mean over (file, layer) of sorted expert shares, sources weighted equally. s minimises the RMSE "
          "of the static-hit curve (running sum of shares by rank) of the prior's pooled sample (256 chains x 512 "
          "tokens, seed 12345); locality solves reuse(prior) = target. scripts/fit_priors.py")


def targets(data: Path) -> dict:
    """Every target and check curve, from the shared data."""
    trace = trace_from_jsonl(F.mixtral_trace_paths(data))
    st = compute_stats(trace)
    return {
        "fiddler": [c for _, c in F.fiddler_counts(data)],
        "mistral": [c for _, c in F.olmoe_counts(data, "mistral")],
        "olmoe": [c for _, c in F.olmoe_counts(data, "olmoe")],
        "olmoe-sft": [c for _, c in F.olmoe_counts(data, "olmoe-sft")],
        "olmoe-dpo": [c for _, c in F.olmoe_counts(data, "olmoe-dpo")],
        "trace": [np.array(layer.popularity) * layer.accesses for layer in st.layers],
        "trace_reuse": st.mean_prev_reuse,
        "trace_tokens": trace.n_tokens,
    }


def fit_all(data: Path) -> tuple[list[Prior], list[tuple[str, str, float, float]]]:
    t = targets(data)
    mix_target = F.target_curve(t["fiddler"], t["mistral"])
    mix = F.fit(mix_target, top_k=2, target_reuse=t["trace_reuse"])
    olm_target = F.target_curve(t["olmoe"])
    olm = F.fit(olm_target, top_k=8, locality=mix.locality)
    rel = "routing/"
    mixtral = Prior(
        schema=SCHEMA_NAME, version=SCHEMA_VERSION, name="mixtral-like",
        description=("Mixtral-8x7B-like routing (8 experts, top-2: mild skew). Zipf s fitted to Fiddler's MMLU popularity "
                     "(base and instruct, 7 subjects x 32 layers) and the OLMoE paper's Mixtral counts (5 domains x layers "
                     f"0/7/15); locality fitted to the vLLM decode trace ({t['trace_tokens']} tokens x 32 layers)."),
        zipf_s=mix.zipf_s, locality=mix.locality,
        fit=PriorFit(data=(rel + "fiddler_mixtral_popularity", rel + "olmoe_paper_routing_counts/mistral/expert_counts",
                           rel + "mixtral8x7b_vllm_routing (prev_reuse)"),
                     n_experts=8, top_k=2, popularity=_r(mix_target), prev_reuse=round(t["trace_reuse"], 6),
                     popularity_rmse=round(mix.popularity_rmse, 6), static_hit_error=round(mix.static_hit_error, 6),
                     prev_reuse_error=round(mix.prev_reuse_error, 6), method=METHOD))
    olmoe = Prior(
        schema=SCHEMA_NAME, version=SCHEMA_VERSION, name="olmoe-like",
        description=("OLMoE-1B-7B-like routing (64 fine-grained experts, top-8: skewed); the skewed prior for models "
                     "without a trace. Zipf s fitted to the OLMoE paper's expert counts (6 domains x layers 0/7/15, "
                     "208,896 tokens each); locality borrowed from mixtral-like."),
        zipf_s=olm.zipf_s, locality=olm.locality,
        fit=PriorFit(data=(rel + "olmoe_paper_routing_counts/olmoe/expert_counts",), n_experts=64, top_k=8,
                     popularity=_r(olm_target), prev_reuse=None, popularity_rmse=round(olm.popularity_rmse, 6),
                     static_hit_error=round(olm.static_hit_error, 6), prev_reuse_error=None,
                     locality_from="mixtral-like: no OLMoE data has token order (the count tables are unordered)",
                     method=METHOD))
    uniform = Prior(schema=SCHEMA_NAME, version=SCHEMA_VERSION, name="uniform",
                    description=("Every expert equally likely and tokens independent (zipf_s 0, locality 0): the "
                                 "pessimistic bound for static sets and caches. Not fitted."),
                    zipf_s=0.0, locality=0.0)
    checks = [("mixtral-like", "Mixtral decode trace popularity (out of sample)", mix.curve, F.target_curve(t["trace"])),
              ("mixtral-like", "Fiddler only", mix.curve, F.target_curve(t["fiddler"])),
              ("mixtral-like", "OLMoE-paper Mixtral counts only", mix.curve, F.target_curve(t["mistral"])),
              ("olmoe-like", "OLMoE-SFT counts (out of sample)", olm.curve, F.target_curve(t["olmoe-sft"])),
              ("olmoe-like", "OLMoE-DPO counts (out of sample)", olm.curve, F.target_curve(t["olmoe-dpo"]))]
    rows = [(p, what, F.rmse(c, tgt), F.static_error(c, tgt)) for p, what, c, tgt in checks]
    return [uniform, mixtral, olmoe], rows


def _r(a) -> tuple[float, ...]:
    a = np.asarray(a, float)
    return tuple(round(float(v), 7) for v in a / a.sum())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data", help="the shared data folder")
    ap.add_argument("--write", action="store_true", help="write strata_plan/core/routing/priors/*.yaml")
    args = ap.parse_args(argv)
    if not (args.data / "routing").is_dir():
        print(f"fit_priors: {args.data}/routing not found; pass --data", file=sys.stderr)
        return 2
    priors, checks = fit_all(args.data)
    con = Console()
    t = Table("prior", "zipf_s", "locality", "popularity RMSE", "static-hit max err", "reuse err", "shipped s / locality",
              title="fitted routing priors (errors: prior minus data)")
    for p in priors:
        f = p.fit
        try:
            old = load_prior(p.name)
            shipped = f"{old.zipf_s} / {old.locality}"
        except Exception:   # noqa: BLE001 - not shipped yet
            shipped = "(none)"
        t.add_row(p.name, f"{p.zipf_s}", f"{p.locality}", f"{f.popularity_rmse:.4f}" if f else "-",
                  f"{f.static_hit_error:.4f}" if f else "-",
                  f"{f.prev_reuse_error:+.4f}" if f and f.prev_reuse_error is not None else "-", shipped)
    con.print(t)
    c = Table("prior", "checked against", "popularity RMSE", "static-hit max err", title="checks")
    for row in checks:
        c.add_row(row[0], row[1], f"{row[2]:.4f}", f"{row[3]:.4f}")
    con.print(c)
    for p in priors:
        if p.fit:
            con.print(f"{p.name}: data  {np.round(p.fit.popularity[:8], 4).tolist()}")
    if args.write:
        for p in priors:
            con.print(f"wrote {save_prior(p, PRIORS_DIR / f'{p.name}.yaml')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
