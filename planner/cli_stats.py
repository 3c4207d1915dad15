"""`strata-plan stats`: routing statistics of a trace or a prior, as a per-layer table and the YAML the
planner reads (`strata-plan plan --stats`)."""
from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

from strata_plan.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("stats", help="routing statistics of a trace or a prior: per-layer table and statistics YAML")
    p.add_argument("source", nargs="+", metavar="TRACE|PRIOR",
                   help="a trace .npz, Mixtral *_routing.jsonl file(s), a prior name (uniform, olmoe-like, ...) or "
                        "prior YAML, or a statistics YAML to show")
    p.add_argument("--model", required=True, help="shipped model name or config.json the statistics are for")
    p.add_argument("--out", help="statistics YAML to write (default: stats-MODEL-SOURCE.yaml here)")
    p.add_argument("--tokens", type=int, help="priors: tokens sampled (default 2048)")
    p.add_argument("--seed", type=int, default=0, help="priors: sampling seed")
    p.add_argument("--warmup", type=int, default=0, help="traces: first tokens that only warm the caches up")
    p.add_argument("--save-trace", metavar="NPZ", help="also save the trace (converted JSONL, or sampled from the prior)")
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    p.set_defaults(func=cmd_stats)


def _kind(sources: list[str]) -> str:
    """'jsonl', 'npz', 'yaml' (prior or statistics file) or 'prior' (a shipped prior's name)."""
    from strata_plan.planner.routing import shipped_priors
    suffixes = {Path(s).suffix for s in sources}
    if suffixes == {".jsonl"}:
        return "jsonl"
    if len(sources) > 1:
        raise UserError("stats", " ".join(sources), "several sources given",
                        "pass one trace, prior or statistics file (several only for Mixtral .jsonl files)")
    s = sources[0]
    if Path(s).suffix == ".npz":
        return "npz"
    if Path(s).suffix in (".yaml", ".yml"):
        return "yaml"
    if s in shipped_priors():
        return "prior"
    raise UserError("stats", s, "is neither a trace (.npz, .jsonl) nor a prior",
                    f"pass a trace file, a prior YAML, or one of the shipped priors: {', '.join(shipped_priors())}")


def compute(args, spec):
    """(RoutingStats, Trace or None) for the command's source."""
    from strata_plan.planner import routing
    from strata_plan.planner.routing.convert import trace_from_jsonl
    from strata_plan.planner.routing.sample import sample_trace
    from strata_plan.yamlio import read_yaml
    kind = _kind(args.source)
    if kind in ("jsonl", "npz"):
        if args.tokens is not None:
            raise UserError("--tokens", str(args.tokens), "applies to priors only", "drop --tokens for a trace")
        trace = trace_from_jsonl(args.source, model=spec.name, n_experts=spec.n_routed) if kind == "jsonl" \
            else routing.load_trace(args.source[0])
        trace.check_model(spec, "; ".join(args.source))
        if not 0 <= args.warmup < trace.n_tokens:
            raise UserError("--warmup", str(args.warmup), f"must be 0..{trace.n_tokens - 1} (the trace has "
                            f"{trace.n_tokens} tokens)", "pass a smaller --warmup")
        return routing.compute_stats(trace, warmup=args.warmup), trace
    if kind == "yaml":
        data = read_yaml(args.source[0])
        if isinstance(data, dict) and data.get("schema") == "strata-plan/routing-stats":
            stats = routing.load_stats(args.source[0])
            if (stats.n_experts, stats.top_k, stats.n_layers) != (spec.n_routed, spec.top_k, spec.n_moe_layers):
                raise UserError(args.source[0], "layers", f"{stats.n_layers} layers x {stats.n_experts} experts, top-"
                                f"{stats.top_k}; {spec.name} has {spec.n_moe_layers} x {spec.n_routed}, top-{spec.top_k}",
                                "pass the --model the statistics were made for")
            return stats, None
    prior = routing.load_prior(args.source[0])
    tokens = args.tokens if args.tokens is not None else 2048
    if tokens < 1:
        raise UserError("--tokens", str(tokens), "must be at least 1", "pass e.g. --tokens 2048")
    stats = routing.stats_from_prior(prior, spec.n_moe_layers, spec.n_routed, spec.top_k, seed=args.seed,
                                     tokens=tokens, model=spec.name)
    trace = None
    if args.save_trace:
        trace = sample_trace(prior.zipf_s, prior.locality, spec.n_moe_layers, spec.n_routed, spec.top_k, tokens,
                             args.seed, model=spec.name, source=stats.source, permute=False)
    return stats, trace


def summary_rows(stats) -> tuple[list[str], list[dict]]:
    """Column names and one row per layer (a prior's identical layers collapse into one row)."""
    E = stats.n_experts
    s1, s2, s3 = max(1, E // 8), max(1, E // 4), max(1, E // 2)
    cols = ["layers", "top-1 share", f"static {s1}", f"static {s2}", f"static {s3}", f"static {s1} + LRU {s1}",
            f"LRU {s2}", "prev reuse"]
    rows = []
    groups = [(0, stats.n_layers - 1)] if stats.kind == "prior" else [(i, i) for i in range(stats.n_layers)]
    for a, b in groups:
        rows.append({"layers": f"{a}" if a == b else f"{a}-{b}", "top-1 share": max(stats.layers[a].popularity),
                     f"static {s1}": stats.static_hit(a, s1), f"static {s2}": stats.static_hit(a, s2),
                     f"static {s3}": stats.static_hit(a, s3), f"static {s1} + LRU {s1}": stats.cache_hit(a, s1, s1),
                     f"LRU {s2}": stats.cache_hit(a, 0, s2), "prev reuse": stats.layers[a].prev_reuse})
    if len(rows) > 1:
        rows.append({"layers": "mean", **{c: sum(r[c] for r in rows) / len(rows) for c in cols[1:]}})
    return cols, rows


def cmd_stats(args) -> int:
    from strata_plan.planner.routing import save_stats, save_trace
    from strata_plan.planner.spec import load_spec
    spec = load_spec(args.model)
    stats, trace = compute(args, spec)
    if args.save_trace and trace is None:
        raise UserError("--save-trace", args.save_trace, "a statistics file holds no trace", "pass a trace or a prior")
    out = Path(args.out) if args.out else Path(f"stats-{spec.name}-{Path(args.source[0]).stem}.yaml")
    save_stats(dataclasses.replace(stats, created=stats.created or datetime.date.today().isoformat()), out)
    saved = str(save_trace(trace, args.save_trace)) if args.save_trace else ""
    cols, rows = summary_rows(stats)
    look = [{"depth": la.depth, "precision": la.precision, "recall": la.recall, "provenance": la.provenance,
             "source": la.source} for la in stats.lookahead]
    if args.json:
        print(json.dumps({"model": stats.model, "kind": stats.kind, "source": stats.source,
                          "source_sha256": stats.source_sha256, "tokens": stats.tokens, "out": str(out),
                          "trace_out": saved, "rows": rows, "lookahead": look}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table
    con = Console()
    t = Table(*cols, title=f"routing statistics of {spec.name} ({stats.kind}: {stats.source}; {stats.tokens} tokens); "
                           "hit rates are shares of expert accesses")
    for r in rows:
        t.add_row(r["layers"], *(f"{r[c]:.3f}" for c in cols[1:]))
    con.print(t)
    lt = Table("lookahead depth", "precision", "recall", "provenance", "source", title="router lookahead")
    for la in look:
        src = la["source"] if len(la["source"]) <= 70 else la["source"][:69] + "…"
        lt.add_row(str(la["depth"]), f"{la['precision']:.3f}", f"{la['recall']:.3f}", la["provenance"], src)
    con.print(lt)
    con.print(f"wrote {out}" + (f" and {saved}" if saved else ""))
    return 0
