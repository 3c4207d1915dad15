"""`strata-plan export`: a saved plan as another engine's arguments (`planner.export`: the llama.cpp `-ot`
placement and what it loses), printed, and written with `--out`."""
from __future__ import annotations

from strata_plan.cli._common import add_json, add_out


def register(sub) -> None:
    from strata_plan.planner.export import DEFAULT_CPU_LAYER_US, FORMATS, GPU_BUFFER
    e = sub.add_parser("export", help="turn a plan into llama.cpp -ot (override-tensor) arguments, with what is lost",
                       description="Map a plan to the closest llama.cpp placement: whole layers of experts on the "
                                   "GPU or the CPU (-ot REGEX=BUFFER), and predict that placement again.")
    e.add_argument("plan", help="plan YAML (strata-plan plan --out)")
    e.add_argument("--format", choices=FORMATS, default="llama.cpp", help="target engine (default llama.cpp)")
    add_plan_sources(e)
    e.add_argument("--gguf", default="MODEL.gguf", help="GGUF path to put in the command (default MODEL.gguf)")
    e.add_argument("--gpu-buffer", default=GPU_BUFFER, help=f"llama.cpp buffer type of the GPU (default {GPU_BUFFER})")
    e.add_argument("--cpu-layer-us", type=float,
                   help="llama.cpp's time a layer whose experts run on the CPU costs beyond reading their bytes, measured "
                        "on this machine: (1/tok_s(-ncmoe N) - 1/tok_s(-ngl 99)) / N in microseconds, from llama-bench "
                        f"(default: the estimate of {DEFAULT_CPU_LAYER_US.value:.0f} us, H200)")
    add_out(e, "write the export here (a shell script; JSON with --json)")
    add_json(e, "machine-readable export")
    e.set_defaults(func=cmd_export)


def add_plan_sources(p) -> None:
    """`--profile` and `--stats` of a command that reads a saved plan (`export`, `what-if`)."""
    p.add_argument("--profile", help="profile YAML the plan was made with (needed when it is not a shipped one)")
    p.add_argument("--stats", help="routing statistics the plan was made with (default: the path the plan records, "
                                   "relative to the plan file)")


def cmd_export(args) -> int:
    from strata_plan.outpaths import check_out_file
    from strata_plan.planner.export import export_text, measured_cpu_layer
    from strata_plan.planner.make import load_plan_problem
    out = check_out_file(args.out, "--out", args.force) if args.out else None
    cpu_layer = measured_cpu_layer(args.cpu_layer_us)
    plan, problem = load_plan_problem(args.plan, args.profile, args.stats)
    text = export_text(plan, problem, args.plan, args.gguf, args.gpu_buffer, args.json, cpu_layer)
    if out is not None:
        from strata_plan.yamlio import atomic_write_text
        atomic_write_text(out, text)
    print(text, end="")
    return 0
