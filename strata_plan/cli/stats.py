"""`strata-plan stats`: routing statistics of a trace or a prior (`core.routing.sources`), printed as a
per-layer table; with `--out`, also written as the YAML the planner reads (`strata-plan plan --stats`)."""
from __future__ import annotations

from strata_plan.cli._common import add_json, add_out, console, print_json, table


def register(sub) -> None:
    p = sub.add_parser("stats", help="routing statistics of a trace or a prior: per-layer table, and the statistics "
                                     "YAML with --out")
    p.add_argument("source", nargs="+", metavar="TRACE|PRIOR",
                   help="a trace .npz, Mixtral *_routing.jsonl file(s), a prior name (uniform, olmoe-like, ...) or "
                        "prior YAML, or a statistics YAML to show")
    p.add_argument("--model", required=True, help="shipped model name or config.json the statistics are for")
    add_out(p, "statistics YAML to write (default: print only)")
    p.add_argument("--tokens", type=int, help="priors: tokens sampled (default 2048)")
    p.add_argument("--seed", type=int, default=0, help="priors: sampling seed")
    p.add_argument("--warmup", type=int, default=0, help="traces: first tokens that only warm the caches up")
    p.add_argument("--save-trace", metavar="NPZ", help="also save the trace (converted JSONL, or sampled from the prior)")
    add_json(p, "machine-readable summary")
    p.set_defaults(func=cmd_stats)


def cmd_stats(args) -> int:
    import dataclasses
    import datetime

    from strata_plan.outpaths import check_out_file
    from strata_plan.core.routing import save_stats, save_trace
    from strata_plan.core.routing.sources import stats_for, summary_rows
    from strata_plan.core.spec import load_spec
    out = check_out_file(args.out, "--out", args.force) if args.out else None
    trace_out = check_out_file(args.save_trace, "--save-trace", args.force) if args.save_trace else None
    spec = load_spec(args.model)
    stats, trace = stats_for(args.source, spec, args.tokens, args.seed, args.warmup, want_trace=bool(trace_out))
    if out is not None:
        save_stats(dataclasses.replace(stats, created=stats.created or datetime.date.today().isoformat()), out)
    saved = str(save_trace(trace, trace_out)) if trace_out else ""
    cols, rows = summary_rows(stats)
    look = [{"depth": la.depth, "precision": la.precision, "recall": la.recall, "provenance": la.provenance,
             "source": la.source} for la in stats.lookahead]
    if args.json:
        print_json({"model": stats.model, "kind": stats.kind, "source": stats.source,
                    "source_sha256": stats.source_sha256, "tokens": stats.tokens, "out": str(out or ""),
                    "trace_out": saved, "rows": rows, "lookahead": look})
        return 0
    con = console()
    t = table(*cols, title=f"routing statistics of {spec.name} ({stats.kind}: {stats.source}; {stats.tokens} tokens); "
                           "hit rates are shares of expert accesses")
    for r in rows:
        t.add_row(r["layers"], *(f"{r[c]:.3f}" for c in cols[1:]))
    con.print(t)
    lt = table("lookahead depth", "precision", "recall", "provenance", "source", title="router lookahead")
    for la in look:
        lt.add_row(str(la["depth"]), f"{la['precision']:.3f}", f"{la['recall']:.3f}", la["provenance"], la["source"])
    con.print(lt)
    written = [str(p) for p in (out, saved) if p]
    con.print(f"wrote {' and '.join(written)}" if written else "(not written: pass --out FILE to keep the statistics)")
    return 0
