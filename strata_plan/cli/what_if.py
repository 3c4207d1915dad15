"""`strata-plan what-if`: what more VRAM, RAM or a faster link would buy a saved plan (`planner.whatif`,
which the wizard's Result step shows too), as two tables of predictions."""
from __future__ import annotations

from strata_plan.cli._common import add_json, console, print_json, table
from strata_plan.cli.export import add_plan_sources
from strata_plan.errors import UserError


def register(sub) -> None:
    w = sub.add_parser("what-if", help="what more VRAM, RAM or a faster link would buy a saved plan (predicted)")
    w.add_argument("plan", help="plan YAML (strata-plan plan --out)")
    add_plan_sources(w)
    w.add_argument("--trials", type=int, default=16, help="warm-started search trials per change (default 16)")
    add_json(w)
    w.set_defaults(func=cmd_what_if)


def cmd_what_if(args) -> int:
    from strata_plan.planner.make import load_plan_problem
    from strata_plan.planner.optuna_log import drop_interrupted_trials
    from strata_plan.planner.whatif import what_if
    if args.trials < 1:
        raise UserError("--trials", str(args.trials), "must be at least 1", "pass e.g. --trials 16")
    from strata_plan.planner.estimated import estimated_table
    plan, problem = load_plan_problem(args.plan, args.profile, args.stats)
    drop_interrupted_trials()
    result = what_if(plan, problem, trials=args.trials)
    est = estimated_table(problem, plan.predicted)
    if args.json:
        print_json({"estimated_inputs": est, **result.as_data()})
        return 0
    e = table("estimated input", "value", "sets", "binds", "source",
              title="inputs of this prediction that are estimates, not measurements (first: what they bind)")
    for row in est:
        e.add_row(row["name"], row["value"], row["link"], row["binds"], row["source"])
    t = table("change", "decode tok/s", "gain", "prefill tok/s", "binding",
              title=f"{plan.model}: what would help most (predicted; warm-started search, {args.trials} trials)")
    t.add_row("as planned", f"{result.base.decode_tok_s:.3g}", "", f"{result.base.prefill_tok_s:.3g}",
              result.base.decode_binding)
    for c in result.ranked:
        t.add_row(c.label, f"{c.decode_tok_s:.3g}", c.gain_text(result.base, result.objective),
                  f"{c.prefill_tok_s:.3g}", c.decode_binding)
    s = table("VRAM budget GB", "decode tok/s (predicted)", "prefill tok/s (predicted)",
              title="predicted tok/s against the VRAM budget")
    for pt in result.sweep:
        s.add_row(f"{pt.vram_gb:g}" + (" (plan)" if pt.is_plan else ""),
                  f"{pt.decode_tok_s:.3g}" if pt.fits else "does not fit", f"{pt.prefill_tok_s:.3g}" if pt.fits else "")
    con = console()
    con.print(e if est else "every input of this prediction is measured or quoted")
    con.print(t)
    con.print(s)
    return 0
