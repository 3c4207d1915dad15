"""`strata-plan plan`: search the fastest placement (`planner.make.make_plan`, which the wizard calls too)
and write the plan YAML; a progress bar on a terminal, the predictions as tables (or JSON)."""
from __future__ import annotations

from strata_plan.cli._common import add_json, add_out, console, gb_figures, print_json, table
from strata_plan.errors import UserError
from strata_plan.core.plan import LOOKAHEAD_POINTS
from strata_plan.planner.problem import DEFAULT_LOOKAHEAD_POINT, DEFAULT_TRIALS


def register(sub) -> None:
    p = sub.add_parser("plan", help="search the fastest placement of a model on a machine and write a plan YAML")
    p.add_argument("--profile", required=True, help="hardware profile: a shipped name (rtx-4090, ...) or a YAML path")
    p.add_argument("--gpu-preset", help="use this shipped profile's GPU with the host of --profile")
    p.add_argument("--model", required=True, help="shipped model name (kimi-k3.1-pro, ...) or a config.json path")
    p.add_argument("--moe-layers", type=int, help="plan the model cut after this many MoE layers (the spec "
                   "NAME@Nmoe, what `strata-plan pack --synthetic` builds)")
    p.add_argument("--stats", help="routing statistics YAML (strata-plan stats) or a routing trace .npz")
    p.add_argument("--prior", help="named routing prior (default: uniform) or a prior YAML path")
    p.add_argument("--context", type=int, default=8192, help="tokens of KV cache to hold (default 8192)")
    p.add_argument("--chunk", type=int, default=2048, help="prefill chunk length in tokens (default 2048)")
    p.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help=f"Optuna trials (default {DEFAULT_TRIALS})")
    p.add_argument("--objective", choices=("decode", "prefill", "mix"), default="decode",
                   help="maximise decode tok/s (default), prefill tok/s, or decode^w x prefill^(1-w)")
    p.add_argument("--mix-weight", type=float, help="w of --objective mix (default 0.5)")
    p.add_argument("--vram-gb", type=gb_figures, help="VRAM budget in GB (default: the whole card); one per GPU, comma-separated, "
                   "plans over that many GPUs (--vram-gb 24,24)")
    p.add_argument("--gpus", type=int, help="plan over the profile's first N GPUs (default: all of them)")
    p.add_argument("--ram-gb", type=float, help="pinned RAM budget in GB (default: the profile's pinnable RAM)")
    p.add_argument("--nvme-gb", type=float, help="NVMe budget in GB (default: the drive's capacity)")
    p.add_argument("--study-db", help="SQLite file (or sqlite:///PATH) to keep the Optuna study in; resumes")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (same seed, same plan)")
    p.add_argument("--depth", type=int, help="hold the router lookahead depth at this value (default: searched; 0: "
                   "no lookahead); the rest of the plan is searched for it within the same budgets")
    p.add_argument("--lookahead-point", choices=LOOKAHEAD_POINTS, default=DEFAULT_LOOKAHEAD_POINT,
                   help="with an NVMe tier: take the lookahead's guesses for layers j+1.. when layer j's router runs "
                        "(attention, the default: queued behind its demand reads, a MoE layer sooner) or when it ends "
                        "(output); priced by the search, recorded in the plan, followed by the engine")
    add_out(p, "plan YAML to write", required=True)
    add_json(p, "machine-readable summary")
    p.set_defaults(func=cmd_plan)


def _check_args(args) -> None:
    if args.mix_weight is not None and args.objective != "mix":
        raise UserError("--mix-weight", str(args.mix_weight), f"only applies to --objective mix (got {args.objective})",
                        "drop --mix-weight or pass --objective mix")
    if args.stats and args.prior:
        raise UserError("--stats/--prior", f"{args.stats} / {args.prior}", "both given",
                        "pass one: measured statistics or a prior")
    if args.trials < 1:
        raise UserError("--trials", str(args.trials), "must be at least 1", f"pass e.g. --trials {DEFAULT_TRIALS}")
    for flag, v in (("--context", args.context), ("--chunk", args.chunk)):
        if v < 1:
            raise UserError(flag, str(v), "must be a positive number of tokens", f"pass e.g. {flag} 2048")


def cmd_plan(args) -> int:
    from strata_plan.outpaths import check_out_file
    from strata_plan.planner.make import make_plan
    from strata_plan.planner.optuna_log import drop_interrupted_trials
    from strata_plan.core.plan import save_plan
    _check_args(args)
    out = check_out_file(args.out, "--out", args.force)
    drop_interrupted_trials()
    kw = dict(stats=args.stats, prior=args.prior, gpu_preset=args.gpu_preset, context=args.context, chunk=args.chunk,
              trials=args.trials, objective=args.objective, mix_weight=0.5 if args.mix_weight is None else args.mix_weight,
              vram_gb=args.vram_gb, ram_gb=args.ram_gb, nvme_gb=args.nvme_gb,
              study_db=args.study_db, seed=args.seed, gpus=args.gpus, depth=args.depth,
              lookahead_point=args.lookahead_point)
    model = args.model if args.moe_layers is None else f"{args.model}@{args.moe_layers}moe"
    plan = _with_progress(args.trials, lambda on_trial: make_plan(args.profile, model, on_trial=on_trial, **kw))
    path = save_plan(plan, out)
    if args.json:
        print_json(plan_summary(plan, str(path)))
    else:
        _print_plan(plan, str(path))
    return 0


def _with_progress(trials: int, run):
    """Run `run(on_trial)` with a progress bar on stderr when it is a terminal."""
    import sys
    if not sys.stderr.isatty():
        return run(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    best = [0.0]
    with Progress(TextColumn("searching placements"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[best]}"), console=console(stderr=True), transient=True) as progress:
        task = progress.add_task("search", total=trials, best="")

        def on_trial(number: int, value: float) -> None:
            best[0] = max(best[0], value)
            progress.update(task, advance=1, best=f"best {best[0]:.3g}")
        return run(on_trial)


def plan_summary(plan, path: str = "") -> dict:
    pr = plan.predicted
    return {"plan": path, "model": plan.model, "profile": plan.sources.profile.name,
            "statistics": plan.sources.statistics.name, "label": pr.label,
            "decode_tok_s": pr.decode_tok_s, "decode_binding": pr.decode_binding,
            "bound_decode_tok_s": pr.bound_decode_tok_s, "bound_decode_binding": pr.bound_decode_binding,
            "prefill_tok_s": pr.prefill_tok_s, "prefill_binding": pr.prefill_binding,
            "bound_prefill_tok_s": pr.bound_prefill_tok_s, "bound_prefill_binding": pr.bound_prefill_binding,
            "machine_decode_tok_s": pr.machine_decode_tok_s, "machine_decode_binding": pr.machine_decode_binding,
            "machine_prefill_tok_s": pr.machine_prefill_tok_s, "machine_prefill_binding": pr.machine_prefill_binding,
            "bytes_per_token": pr.bytes_per_token, "vram_hit_rate": pr.vram_hit_rate, "ram_share": pr.ram_share,
            "nvme_share": pr.nvme_share, "greedy_decode_tok_s": plan.search.greedy_decode_tok_s,
            "prefetch_depth": plan.prefetch_depth, "cache_slots": plan.cache.total_slots,
            "memory_gb": {"vram": plan.memory.vram_total / 1e9, "ram": plan.memory.ram_total / 1e9,
                          "nvme": plan.memory.nvme_total / 1e9},
            "trials": plan.search.trials, "knobs": plan.search.knobs,
            **({"gpus": [{"index": g.index, "name": g.name, "layers": [g.first_layer, g.end_layer], "lm_head": g.lm_head,
                          "vram_gb": sum((g.vram or {}).values()) / 1e9, "budget_gb": g.vram_budget_bytes / 1e9}
                         for g in plan.gpus]} if plan.gpus else {})}


def _print_plan(plan, path: str) -> None:
    pr, mem = plan.predicted, plan.memory
    t = table("", "predicted tok/s", "binding", "physical bound", "bound binding",
              title=f"{plan.model} on {plan.sources.profile.name} ({plan.sources.statistics.name})")
    t.add_row("decode (batch 1)", f"{pr.decode_tok_s:.3g}", pr.decode_binding, f"{pr.bound_decode_tok_s:.3g}",
              pr.bound_decode_binding)
    t.add_row(f"prefill (chunk {plan.prefill_chunk})", f"{pr.prefill_tok_s:.3g}", pr.prefill_binding,
              f"{pr.bound_prefill_tok_s:.3g}", pr.bound_prefill_binding)
    if pr.machine_decode_tok_s:
        t.add_row("machine bound: decode / prefill", "", "", f"{pr.machine_decode_tok_s:.3g} / "
                  f"{pr.machine_prefill_tok_s:.3g}", f"{pr.machine_decode_binding} / {pr.machine_prefill_binding}")
    b = table("decode bytes per token", "GB", title="where a token's bytes come from (predicted)")
    for k, v in (pr.bytes_per_token or {}).items():
        b.add_row(k, f"{v / 1e9:.3f}")
    h = table("routed-expert accesses", "share")
    h.add_row("served from VRAM (static + cache)", f"{pr.vram_hit_rate:.1%}")
    h.add_row("from pinned RAM", f"{pr.ram_share:.1%}")
    h.add_row("from NVMe", f"{pr.nvme_share:.1%}")
    m = table("tier", "used GB", "budget GB")
    m.add_row("VRAM" + (" (all GPUs)" if plan.gpus else ""), f"{mem.vram_total / 1e9:.2f}",
              f"{mem.budgets.vram_bytes / 1e9:.2f}")
    for g in plan.gpus or ():
        m.add_row(f"  GPU {g.index}: decoder layers {g.first_layer}..{g.end_layer - 1}"
                  + (" + lm_head" if g.lm_head else ""), f"{sum((g.vram or {}).values()) / 1e9:.2f}",
                  f"{g.vram_budget_bytes / 1e9:.2f}")
    m.add_row("pinned RAM", f"{mem.ram_total / 1e9:.2f}", f"{mem.budgets.ram_bytes / 1e9:.2f}")
    m.add_row("NVMe", f"{mem.nvme_total / 1e9:.2f}", f"{mem.budgets.nvme_bytes / 1e9:.2f}")
    con = console()
    for part in (t, b, h, m):
        con.print(part)
    s = plan.search
    nvme_guesses = plan.prefetch_depth and plan.staging is not None and any(l.nvme for l in plan.layers)
    where = {"attention": " (NVMe guesses at each layer's router)", "output": " (NVMe guesses at each layer's end)"}
    con.print(f"search: {s.trials} trials ({s.sampler}, seed {s.seed}), greedy plan {s.greedy_decode_tok_s:.3g} tok/s "
              f"decode; prefetch depth {plan.prefetch_depth}"
              f"{where[plan.staging.point] if nvme_guesses else ''}, {plan.cache.total_slots} LRU cache slots, "
              f"{len(plan.dense.resident_layers)}/{len(plan.dense.resident_layers) + len(plan.dense.streamed_layers)} "
              f"dense layers resident, lm_head in {plan.dense.lm_head}")
    con.print(f"wrote {path}")
