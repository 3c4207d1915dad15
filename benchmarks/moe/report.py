"""Routing statistics of the trained MoE traces (tests/data/fixture-moe.trace.npz,
benchmarks/data/trained-20261203/bench-moe/bench-moe.trace.npz), beside the Mixtral-8x7B
decode trace of the shared data and the named priors, written to benchmarks/data/routing-report.json and
as a benchmark result.

    python benchmarks/moe/report.py [--shared ../shared/data] [--no-fit]

Per trace: per-layer skew (busiest expert's share of slots against 1/E; share of the E/8 and E/4 most
used experts), previous-token reuse (against k/E for random routing), lookahead precision and recall by
depth (against the documented lookahead prior). Sampling noise is shown by the same numbers for uniform
routing drawn at the trace's own size. `fit` is the prior (Zipf exponent, locality) fitted to the trace
with the planner's own fitting code, to place it between `mixtral-like` and `olmoe-like`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from strata_plan.core.routing import compute_stats, load_prior, load_trace, stats_from_prior
from strata_plan.core.routing.compute import layer_stats
from strata_plan.core.routing.sample import sample_experts
from strata_plan.core.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data"
BENCH = DATA / "trained-20261203" / "bench-moe"
TRACES = {"fixture-moe": (ROOT / "tests" / "data" / "fixture-moe.trace.npz", ROOT / "tests" / "data" / "fixture-moe"),
          "bench-moe": (BENCH / "bench-moe.trace.npz", BENCH / "config.json")}
TRAIN_LOGS = {"fixture-moe": ROOT / "tests" / "data" / "fixture-moe" / "train_log.json",
              "bench-moe": BENCH / "train_log.json"}
PRIORS = ("uniform", "mixtral-like", "olmoe-like")


def summarize(stats) -> dict:
    """The numbers the report compares, from a RoutingStats."""
    E, k = stats.n_experts, stats.top_k
    layers = [{"top1_share": round(max(l.popularity), 4), "top1_over_uniform": round(max(l.popularity) * E, 2),
               "static_hit_E8": round(l.static_at(E / 8), 4), "static_hit_E4": round(l.static_at(E / 4), 4),
               "prev_reuse": round(l.prev_reuse, 4)} for l in stats.layers]
    mean = {key: round(float(np.mean([row[key] for row in layers])), 4) for key in layers[0]}
    look = [{"depth": la.depth, "precision": round(la.precision, 4), "recall": round(la.recall, 4),
             "provenance": la.provenance, "pairs": la.pairs} for la in stats.lookahead]
    return {"n_experts": E, "top_k": k, "n_layers": stats.n_layers, "tokens": stats.tokens,
            "random_reuse": round(k / E, 4), "uniform_top1": round(1 / E, 4), "mean": mean, "layers": layers,
            "lookahead": look}


def noise_floor(n_tokens: int, n_layers: int, n_experts: int, top_k: int, seq_len: int) -> dict:
    """The same skew numbers for uniform random routing of the same size: what sampling noise alone shows."""
    ex, _, seq = sample_experts(0.0, 0.0, n_layers, n_experts, top_k, n_tokens, seed=7, seq_len=seq_len)
    rows = [layer_stats(ex[:, i], seq, n_experts) for i in range(n_layers)]
    return {"top1_share": round(float(np.mean([max(r.popularity) for r in rows])), 4),
            "static_hit_E8": round(float(np.mean([r.static_at(n_experts / 8) for r in rows])), 4),
            "static_hit_E4": round(float(np.mean([r.static_at(n_experts / 4) for r in rows])), 4)}


def training_balance(path: Path, n_experts: int) -> dict:
    """How even the load was over whole training batches (many files): the busiest expert's share of a
    step's slots, mean over MoE layers, at the first and the last logged step, and the final bias range."""
    t = json.loads(path.read_text())["train"]
    first, last = t["load_max_share"][0], t["load_max_share"][-1]
    return {"tokens_per_step": t["tokens_per_step"], "uniform_share": round(1 / n_experts, 4),
            f"busiest_share_step_{first[0]}": round(float(np.mean(first[1])), 4),
            f"busiest_share_step_{last[0]}": round(float(np.mean(last[1])), 4),
            "final_bias_abs_max": [round(b, 3) for b in t["final_bias_abs_max"]]}


def fitted_prior(trace, stats) -> dict:
    from strata_plan.core.routing.fit import fit
    target = np.mean([np.sort(np.asarray(l.popularity))[::-1] for l in stats.layers], axis=0)
    r = fit(target, trace.top_k, target_reuse=stats.mean_prev_reuse)
    return {"zipf_s": r.zipf_s, "locality": r.locality, "popularity_rmse": round(r.popularity_rmse, 5),
            "static_hit_error": round(r.static_hit_error, 4)}


def prior_rows(n_layers: int, n_experts: int, top_k: int) -> dict:
    out = {}
    for name in PRIORS:
        p = load_prior(name)
        s = summarize(stats_from_prior(p, n_layers, n_experts, top_k))
        out[name] = {"zipf_s": p.zipf_s, "locality": p.locality, "mean": s["mean"], "lookahead": s["lookahead"]}
    return out


def trace_row(trace, do_fit: bool) -> dict:
    """The report's numbers for one trace: its statistics, the noise floor at its size, its fitted prior."""
    stats = compute_stats(trace)
    row = summarize(stats)
    seq_len = int(np.bincount(trace.sequence).max())
    row["uniform_same_size"] = noise_floor(trace.n_tokens, trace.n_layers, trace.n_experts, trace.top_k, seq_len)
    if do_fit:
        row["fitted_prior"] = fitted_prior(trace, stats)
    return row


def build(shared: Path | None, do_fit: bool) -> dict:
    report: dict = {"traces": {}}
    for name, (file, cfg) in TRACES.items():
        trace = load_trace(DATA / file, load_spec(str(cfg)))
        row = trace_row(trace, do_fit)
        row["priors_at_this_geometry"] = prior_rows(trace.n_layers, trace.n_experts, trace.top_k)
        row["training_balance"] = training_balance(TRAIN_LOGS[name], trace.n_experts)
        row["source"] = trace.source
        report["traces"][name] = row
    folder = shared / "routing" / "mixtral8x7b_vllm_routing" if shared else None
    if folder and folder.is_dir():
        from strata_plan.core.routing.convert import trace_from_jsonl
        paths = sorted(folder.glob("*_routing.jsonl"))
        row = trace_row(trace_from_jsonl(paths), do_fit)
        row["source"] = "shared/data/routing/mixtral8x7b_vllm_routing (" + ", ".join(p.name for p in paths) + ")"
        report["traces"]["mixtral-8x7b (vLLM decode)"] = row
    return report


def print_table(report: dict) -> None:
    print(f"{'trace':28} {'E':>4} {'k':>2} {'L':>3} {'tokens':>6}  {'top1 x unif':>11} {'noise':>6} "
          f"{'E/4 hit':>7} {'noise':>6}  {'reuse':>6} {'random':>6}  lookahead d1..d4")
    for name, r in report["traces"].items():
        m, u = r["mean"], r["uniform_same_size"]
        look = " ".join(f"{la['precision']:.2f}" + ("" if la["provenance"] == "trace" else "*") for la in r["lookahead"])
        print(f"{name:28} {r['n_experts']:>4} {r['top_k']:>2} {r['n_layers']:>3} {r['tokens']:>6}  "
              f"{m['top1_over_uniform']:>11.2f} {u['top1_share'] * r['n_experts']:>6.2f} {m['static_hit_E4']:>7.3f} "
              f"{u['static_hit_E4']:>6.3f}  {m['prev_reuse']:>6.3f} {r['random_reuse']:>6.3f}  {look}")
    print("(* = the documented lookahead prior, not measured; noise = uniform routing sampled at the trace's size)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data", help="the shared data folder")
    p.add_argument("--no-fit", action="store_true", help="skip fitting a prior to each trace (slow part)")
    p.add_argument("--out", type=Path, default=DATA / "routing-report.json")
    p.add_argument("--result-dir", type=Path, default=None, help="where the benchmark result goes (default results/)")
    args = p.parse_args(argv)
    report = build(args.shared, not args.no_fit)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print_table(report)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _result import write_result
    metrics = {name.split(" ")[0]: {"top1_over_uniform": r["mean"]["top1_over_uniform"],
                                    "static_hit_E4": r["mean"]["static_hit_E4"], "prev_reuse": r["mean"]["prev_reuse"],
                                    **{f"lookahead_d{la['depth']}": la["precision"] for la in r["lookahead"]}}
               for name, r in report["traces"].items()}
    write_result("routing-trained-moe", metrics, out_dir=args.result_dir,
                 notes="routing statistics of the trained MoE traces vs the Mixtral decode trace; "
                       "see benchmarks/data/routing-report.json and benchmarks/TRAINING.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
