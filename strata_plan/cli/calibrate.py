"""`strata-plan calibrate BENCH.json... --profile P --out P2.yaml`: measure the profile's per-layer overhead from
the engine's device-loop runs (`planner.calibrate`): each run's step without its MoE calls less the cost model's
non-MoE seconds, per decoder layer; nothing is fitted. Writes the profile with the measured constant marked
`measured` and prints each run measured against the cost model re-run on its executed plan."""
from __future__ import annotations

from strata_plan.cli._common import add_json, add_out, console, print_json, table
from strata_plan.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="measure a profile's per-layer overhead from `bench` runs",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("bench", nargs="+", metavar="BENCH.json",
                   help="`strata-plan bench --json` output, or a results file (bench-*.json, engine-*.json)")
    p.add_argument("--profile", required=True, help="the profile to start from: a shipped name or a YAML "
                   "(the machine the runs were measured on)")
    p.add_argument("--plan", action="append", default=[], metavar="NAME=PATH",
                   help="the plan file of the runs named NAME (a run's name in a results file, or the part before "
                        "its '/'), for files that do not record their plans; repeatable")
    p.add_argument("--modes", default="plan,lru,on-demand", help="use the runs of these modes only (default all)")
    p.add_argument("--find", action="append", default=[], metavar="DIR", help="a folder where the files a run's "
                   "recorded plan names (model config.json, statistics) are looked for, when they are not where the "
                   "run recorded them (a run made on another machine); repeatable")
    p.add_argument("--check", nargs="+", default=[], metavar="BENCH.json", help="also predict these runs (another "
                   "model's: never measured on) with the measured constants, and print measured against predicted")
    p.add_argument("--check-profile", metavar="P", help="with --check: the profile of the machine those runs ran on "
                   "(its measured figures; its calibration is replaced by the measured one); default --profile")
    p.add_argument("--check-plan", action="append", default=[], metavar="NAME=PATH", help="as --plan, for --check")
    add_out(p, "profile YAML to write with the measured constants", required=True, metavar="P2.yaml")
    add_json(p)
    p.set_defaults(func=cmd_calibrate)


def _plans(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        name, sep, path = it.rpartition("=")
        if not sep and len(items) == 1:
            name, path = "", it
        elif not sep or not path:
            raise UserError("--plan", it, "is not NAME=PATH", "pass e.g. --plan ramrich=plan-ramrich.yaml")
        out[name] = path
    return out


def cmd_calibrate(args) -> int:
    from strata_plan.outpaths import check_out_file
    from strata_plan.planner.calibrate import calibrate, read_runs, require_gpu, sources_text
    from strata_plan.profiles.schema import load_profile, save_profile
    out = check_out_file(args.out, "--out", args.force)
    profile = load_profile(args.profile)
    require_gpu(profile)
    if args.check:
        require_gpu(load_profile(args.check_profile or args.profile), "--check-profile" if args.check_profile else "--profile")
    modes = [m for m in args.modes.split(",") if m]
    runs, notes = read_runs(args.bench, _plans(args.plan), args.find)
    runs = [r for r in runs if r.mode in modes]
    if not runs:
        raise UserError("--modes", args.modes, "no run of these modes in the bench files", "name modes the runs have")
    fit = calibrate(runs, profile, sources_text(args.bench))
    held = []
    if args.check:
        from strata_plan.planner.calibrate import check
        check_runs, check_notes = read_runs(args.check, _plans(args.check_plan), args.find)
        notes += check_notes
        held = check(check_runs, load_profile(args.check_profile or args.profile), fit.profile.calibration)
    path = save_profile(fit.profile, out)
    load_profile(str(path))                     # what we wrote must load with the planner's loader
    if args.json:
        print_json({"out": str(path), "rms_residual": fit.rms_residual, "skipped": notes,
                    "constants": [{"name": c.name, "before": c.before, "after": c.after, "measured": bool(c.measured),
                                   "how": c.how} for c in fit.constants],
                    "runs": [{"run": r.run.name, "mode": r.run.mode, "plan": r.run.plan_where,
                              "measured_s_per_token": r.run.measured_s, "predicted_before_s": r.before_s,
                              "predicted_after_s": r.after_s, "residual": r.residual,
                              "layer_overhead_us": r.overhead_us} for r in fit.runs],
                    "check": [{"run": r.name, "mode": r.mode, "plan": r.plan_where, "measured_s_per_token": r.measured_s,
                               "predicted_s": pred, "predicted_over_measured": pred / r.measured_s - 1.0}
                              for r, pred in held]})
        return 0
    con = console()
    c = table("constant", "before", "after", "how", title=f"calibration of {profile.name} from {len(runs)} runs")
    for k in fit.constants:
        c.add_row(k.name, f"{k.before:.4g}", f"{k.after:.4g}" if k.measured else "(unchanged)", k.how)
    t = table("run", "mode", "measured", "predicted before", "predicted after", "residual", "overhead us/layer",
              title="decode ms per token: measured against the cost model re-run on each executed plan (predicted); "
              "the overhead per decoder layer measured from the step without its MoE calls")
    one_file = len({r.run.file for r in fit.runs}) == 1
    for r in fit.runs:
        t.add_row(r.run.name.split(":", 1)[-1] if one_file else r.run.name, r.run.mode, f"{r.run.measured_s * 1e3:.3f}", f"{r.before_s * 1e3:.3f}",
                  f"{r.after_s * 1e3:.3f}", f"{r.residual:+.1%}", "-" if r.overhead_us is None else f"{r.overhead_us:.1f}")
    con.print(c)
    con.print(t)
    con.print(f"rms residual {fit.rms_residual:.1%}; wrote {path} (layer_overhead_us marked measured)")
    for note in notes:
        con.print(note)
    if held:
        h = table("run", "mode", "measured", "predicted", "predicted / measured - 1",
                  title="held-out runs (not measured on): decode ms per token, MEASURED against PREDICTED with the measured "
                  "constants and " + (args.check_profile or args.profile) + "'s measured figures")
        for r, pred in held:
            h.add_row(r.name, r.mode, f"{r.measured_s * 1e3:.3f}", f"{pred * 1e3:.3f}", f"{pred / r.measured_s - 1.0:+.1%}")
        con.print(h)
    return 0
