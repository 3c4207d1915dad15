"""`strata-plan export` (a saved plan as another engine's arguments) and `strata-plan what-if` (what a
bigger budget or a faster link would buy a saved plan). Thin wrappers around `planner.export` and
`tui.whatif`, which the TUI calls directly."""
from __future__ import annotations

import json

from strata_plan.errors import UserError


def register(sub) -> None:
    from strata_plan.planner.export import FORMATS, GPU_BUFFER
    e = sub.add_parser("export", help="turn a plan into llama.cpp -ot (override-tensor) arguments, with what is lost",
                       description="Map a plan to the closest llama.cpp placement: whole layers of experts on the "
                                   "GPU or the CPU (-ot REGEX=BUFFER), and predict that placement again.")
    e.add_argument("plan", help="plan YAML (strata-plan plan --out)")
    e.add_argument("--format", choices=FORMATS, default="llama.cpp", help="target engine (default llama.cpp)")
    _sources(e)
    e.add_argument("--gguf", default="MODEL.gguf", help="GGUF path to put in the command (default MODEL.gguf)")
    e.add_argument("--gpu-buffer", default=GPU_BUFFER, help=f"llama.cpp buffer type of the GPU (default {GPU_BUFFER})")
    e.add_argument("--out", help="write the export here (a shell script; JSON with --json)")
    e.add_argument("--json", action="store_true", help="machine-readable export")
    e.set_defaults(func=cmd_export)

    w = sub.add_parser("what-if", help="what more VRAM, RAM or a faster link would buy a saved plan (predicted)")
    w.add_argument("plan", help="plan YAML (strata-plan plan --out)")
    _sources(w)
    w.add_argument("--trials", type=int, default=16, help="warm-started search trials per change (default 16)")
    w.add_argument("--json", action="store_true", help="machine-readable output")
    w.set_defaults(func=cmd_what_if)


def _sources(p) -> None:
    p.add_argument("--profile", help="profile YAML the plan was made with (needed when it is not a shipped one)")
    p.add_argument("--stats", help="routing statistics the plan was made with (default: the path the plan records)")


def _load(args):
    from strata_plan.planner.export import problem_for_plan
    from strata_plan.planner.plan import load_plan
    plan = load_plan(args.plan)
    return plan, problem_for_plan(plan, args.plan, args.profile, args.stats)


def export_text(plan, problem, plan_path: str, gguf: str, gpu_buffer: str, as_json: bool) -> str:
    """What `strata-plan export` prints and writes (the TUI's Save step writes the same)."""
    from strata_plan.planner.export import export_llama_cpp
    ex = export_llama_cpp(plan, problem, plan_path, gpu_buffer)
    return json.dumps(ex.as_data(), indent=2) + "\n" if as_json else ex.shell(gguf)


def cmd_export(args) -> int:
    plan, problem = _load(args)
    text = export_text(plan, problem, args.plan, args.gguf, args.gpu_buffer, args.json)
    if args.out:
        from strata_plan.yamlio import atomic_write_text
        atomic_write_text(args.out, text)
    print(text, end="")
    return 0


def cmd_what_if(args) -> int:
    from strata_plan.tui.whatif import what_if
    if args.trials < 1:
        raise UserError("--trials", str(args.trials), "must be at least 1", "pass e.g. --trials 16")
    from strata_plan.planner.estimated import estimated_table
    plan, problem = _load(args)
    result = what_if(plan, problem, trials=args.trials)
    est = estimated_table(problem, plan.predicted)
    if args.json:
        print(json.dumps({"estimated_inputs": est, **result.as_data()}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table
    e = Table("estimated input", "value", "sets", "binds", "source",
              title="inputs of this prediction that are estimates, not measurements (first: what they bind)")
    for row in est:
        e.add_row(row["name"], row["value"], row["link"], row["binds"], row["source"])
    t = Table("change", "decode tok/s", "gain", "prefill tok/s", "binding",
              title=f"{plan.model}: what would help most (predicted; warm-started search, {args.trials} trials)")
    t.add_row("as planned", f"{result.base.decode_tok_s:.3g}", "", f"{result.base.prefill_tok_s:.3g}",
              result.base.decode_binding)
    for c in result.ranked:
        t.add_row(c.label, f"{c.decode_tok_s:.3g}", c.gain_text(result.base, result.objective),
                  f"{c.prefill_tok_s:.3g}", c.decode_binding)
    s = Table("VRAM budget GB", "decode tok/s (predicted)", "prefill tok/s (predicted)",
              title="predicted tok/s against the VRAM budget")
    for pt in result.sweep:
        s.add_row(f"{pt.vram_gb:g}" + (" (plan)" if pt.is_plan else ""),
                  f"{pt.decode_tok_s:.3g}" if pt.fits else "does not fit", f"{pt.prefill_tok_s:.3g}" if pt.fits else "")
    con = Console()
    con.print(e if est else "every input of this prediction is measured or quoted")
    con.print(t)
    con.print(s)
    return 0
