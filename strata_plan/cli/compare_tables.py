"""`strata-plan compare-tables`: the seed's published tok/s beside our predictions and physical bounds
(`planner.compare`). On a terminal too narrow for a table's rows, each profile is printed as a block of
(column, value) lines, so no figure or name is cut."""
from __future__ import annotations

from strata_plan.cli._common import add_json, add_out, console, print_json, progress_bar, table
from strata_plan.errors import UserError


def register(sub) -> None:
    c = sub.add_parser("compare-tables", help="the seed's published tok/s beside our predictions and bounds")
    c.add_argument("--profiles", nargs="+", help="profiles to compare (default: the seed's rows, one GPU and two)")
    c.add_argument("--model", default="kimi-k3.1-pro", help="model (default kimi-k3.1-pro, the seed's)")
    c.add_argument("--trials", type=int, default=60, help="Optuna trials per search (default 60)")
    c.add_argument("--seed", type=int, default=0, help="sampler seed")
    c.add_argument("--tokens", type=int, help="tokens sampled per prior (default: the routing package's)")
    add_out(c, "write the markdown table here")
    add_json(c, "machine-readable rows")
    c.set_defaults(func=cmd_compare_tables)


def cmd_compare_tables(args) -> int:
    import sys

    from strata_plan.outpaths import check_out_file
    from strata_plan.planner.compare import compare_tables, to_markdown
    from strata_plan.planner.optuna_log import drop_interrupted_trials
    if args.trials < 1:
        raise UserError("--trials", str(args.trials), "must be at least 1", "pass e.g. --trials 60")
    out = check_out_file(args.out, "--out", args.force) if args.out else None
    drop_interrupted_trials()
    with progress_bar("searching", 1, on=not args.json, unit="trials") as update:
        result = compare_tables(profiles=args.profiles, model=args.model, trials=args.trials, seed=args.seed,
                                tokens=args.tokens, progress=lambda what, done, total: update(done, what, total))
    md = to_markdown(result)
    if out is not None:
        from strata_plan.yamlio import atomic_write_text
        atomic_write_text(out, md)
    if args.json:
        print_json(result.as_data())
    else:
        print_comparison(result, md)
        if out is not None:
            console().print(f"wrote {out}")
    if result.failures:           # a cost-model bug, not the user's mistake: exit 1 with every failed check
        print("\n".join(f"strata-plan: check failed: {f}" for f in result.failures), file=sys.stderr)
        return 1
    return 0


def print_comparison(result, md: str, con=None) -> None:
    """The markdown's prose as rich Markdown, its two tables (decode, prefill) as tables when they fit the
    terminal, else one (column, value) block per profile."""
    from rich.markdown import Markdown
    from rich.measure import Measurement

    from strata_plan.planner.compare import table_cells
    con = con or console()
    phases = iter(("decode", "prefill"))
    prose: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            prose.append(lines[i])
            i += 1
            continue
        while i < len(lines) and lines[i].startswith("|"):
            i += 1
        con.print(Markdown("\n".join(prose)))
        prose = []
        headers, rows = table_cells(result, next(phases))
        t = table(*headers)
        for r in rows:
            t.add_row(*r)
        if Measurement.get(con, con.options.update_width(10**6), t).maximum <= con.width:
            con.print(t)
            continue
        for r in rows:
            block = table(headers[0], r[0], keep=0)
            for h, v in zip(headers[1:], r[1:]):
                block.add_row(h, v)
            con.print(block)
    if prose:
        con.print(Markdown("\n".join(prose)))
