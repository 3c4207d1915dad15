"""`strata-plan profile`: measure this machine (`profiler.run.profile_machine`) and write its hardware
profile YAML; the output path is checked before anything is measured."""
from __future__ import annotations

import argparse
import math

from strata_plan.cli._common import add_json, add_out, console, print_json, table


def _positive_gib(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of GiB, got {text!r}")
    return v


def register(sub) -> None:
    p = sub.add_parser("profile", help="measure this machine (GPU, PCIe, RAM, NVMe, CPU) and write its hardware profile",
                       description="Measure this machine and write a hardware profile YAML (GB = 1e9 bytes). "
                                   "Without a GPU it writes a host-only profile for `plan --gpu-preset`.")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (under a minute)")
    p.add_argument("--nvme-dir", default=".", metavar="DIR",
                   help="folder on the disk to measure; a temporary test file is written there and removed (default: .)")
    p.add_argument("--max-gib", type=_positive_gib, metavar="N",
                   help="test-file size in GiB, clamped to the free space (default: 1 quick, 4 full)")
    p.add_argument("--pin-cap-gib", type=_positive_gib, metavar="N",
                   help="pin at most this much RAM when probing how much can be pinned (default: 4 quick, 32 full)")
    p.add_argument("--models", default="", metavar="M[,M...]",
                   help="also time these models' decode layers on the GPU (shipped names or config.json paths; "
                        "the engine's layers on random weights): the planner then charges measured layer times")
    p.add_argument("--context", type=int, default=1024, metavar="N",
                   help="with --models: cached positions the timed attention spans (default: 1024)")
    add_out(p, "profile YAML to write (default: ./<name>.yaml)", metavar="FILE")
    p.add_argument("--name", default="", help="profile name (default: from the GPU, or host-<hostname>)")
    add_json(p, "print the profile, statistics and notes as JSON")
    p.set_defaults(func=cmd_profile)


def cmd_profile(args) -> int:
    import signal
    from pathlib import Path

    from strata_plan.errors import UserError
    from strata_plan.outpaths import check_out_file
    from strata_plan.profiler.nvme import check_dir
    from strata_plan.profiler.run import Options, default_name, profile_machine
    from strata_plan.profiles.schema import load_profile, save_profile
    from strata_plan.schema import to_data

    check_dir(args.nvme_dir)                        # bad arguments fail before anything is measured
    models = tuple(m for m in args.models.split(",") if m)
    if args.context < 1:
        raise UserError("--context", str(args.context), "must be at least 1 position", "pass e.g. --context 1024")
    if models:
        from strata_plan.engine.layer_times import check_model
        for m in models:
            try:
                check_model(m)
            except UserError as e:
                if e.where != "--model":
                    raise
                raise UserError("--models", e.field, e.problem, e.fix) from None
    name = args.name or default_name()
    out = check_out_file(args.out or f"{name}.yaml", "--out", args.force)
    opts = Options(quick=args.quick, nvme_dir=Path(args.nvme_dir), max_gib=args.max_gib,
                   pin_cap_gib=args.pin_cap_gib, name=name)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)   # SIGTERM cleans up like Ctrl-C
    try:
        result = profile_machine(opts, console(stderr=True), show_progress=not args.json)
        if models and result.gpu_found:
            result = _with_layer_times(result, models, args.context, quiet=args.json)
    finally:
        signal.signal(signal.SIGTERM, previous)
    path = save_profile(result.profile, out)
    load_profile(str(path))                         # what we wrote must load with the planner's loader
    if args.json:
        print_json({"out": str(path), "seconds": round(result.seconds, 1), "gpu_found": result.gpu_found,
                    "notes": list(result.notes), "stats": {k: s.to_dict() for k, s in result.stats.items()},
                    "profile": to_data(result.profile)})
        return 0
    _print_summary(result, path)
    return 0


def _with_layer_times(result, models: tuple[str, ...], context: int, quiet: bool):
    """The run with each model's decode layers timed on the first GPU (`engine.layer_times`) in its profile."""
    import dataclasses

    from strata_plan.engine.layer_times import measure_layer_times, with_layer_times
    times = []
    for m in models:
        t = measure_layer_times(m, context)
        times.append(t)
        if not quiet:
            console(stderr=True).print(f"{t.model}: decode layers at context {context}: head {t.head_us:.1f} us, dense "
                                       f"layer {t.dense_layer_us:.1f} us, MoE layer without routed experts "
                                       f"{t.moe_layer_us:.1f} us, a sampled draw {t.pick_us:.1f} us more")
    return dataclasses.replace(result, profile=with_layer_times(result.profile, times))


def _print_summary(result, path) -> None:
    con = console()
    t = table("measured", "median", "spread", "repeats", title=f"{result.profile.name}: {path} "
              f"({result.seconds:.0f} s)")
    for key, st in result.stats.items():
        if "disk" in key and not any(m in key for m in ("_16MiB_qd1_", "_16MiB_qd8_", "_16MiB_qd32_")):
            continue
        if any(key.startswith(m) for m in ("h2d", "d2h")) and not any(s in key for s in ("_16MiB_", "_256MiB_")):
            continue
        t.add_row(key, f"{st.median:,.2f}", f"{st.spread:.1%}", str(st.repeats))
    con.print(t)
    for n in result.notes[result.extra.get("notes_shown", 0):]:
        con.print(f"[yellow]note:[/] {n}")
    con.print(f"wrote {path} (GB = 1e9 bytes; every figure marked measured with today's date)")
