"""`strata-plan pack`: turn a Hugging Face MoE checkpoint (or a synthetic model) into what the engine reads
(`engine.pack`, engine/PACK.md). Refuses an output folder that is not empty unless `--force`."""
from __future__ import annotations

import json
import time
from pathlib import Path

from strata_plan.cli._common import add_json, add_out, console, progress_bar
from strata_plan.errors import UserError
from strata_plan.kernels import formats as F

def register(sub) -> None:
    p = sub.add_parser("pack", help="quantize a checkpoint's routed experts into packed 4 KiB-aligned blobs",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", nargs="?", help="Hugging Face checkpoint folder (config.json + safetensors)")
    p.add_argument("--synthetic", metavar="MODEL", help="instead of a checkpoint: random weights in this model's "
                   "geometry (a shipped name or config.json; NAME@Nmoe or --moe-layers cuts it after N MoE layers)")
    p.add_argument("--moe-layers", type=int, help="with --synthetic: keep the first N MoE layers")
    p.add_argument("--seed", type=int, default=0, help="with --synthetic: random seed (default 0)")
    add_out(p, "folder to write the packed model to (new or empty; --force replaces a non-empty one once the new "
               "pack is complete, keeping files a pack never writes)", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--plan", help="plan YAML (strata-plan plan): each expert's format")
    g.add_argument("--bpw", type=float, help="tier mix of the three tier formats at this mean bits per weight")
    g.add_argument("--format", help=f"one format for every expert ({', '.join(F.FORMATS)})")
    p.add_argument("--stats", help="with --bpw: routing statistics YAML or trace .npz (most used experts get "
                                   "the first tier); default: expert ids in order")
    q = p.add_mutually_exclusive_group()
    q.add_argument("--calib", metavar="FILE", help="calibration text (or .npz of token ids): the routed experts' "
                   "input statistics from it weight the quantizer's errors (engine/calib.py)")
    q.add_argument("--rtn", action="store_true", help="plain round-to-nearest with group-wise min/max scaling "
                   "instead of the quantizer's fit (the baseline to compare against)")
    p.add_argument("--calib-tokens", type=int, default=8192, help="with --calib: tokens of it to run (default 8192)")
    p.add_argument("--device", help="where to quantize or generate (default: cuda when there is a GPU, else cpu)")
    add_json(p, "machine-readable summary")
    p.set_defaults(func=cmd_pack)


def cmd_pack(args) -> int:
    from strata_plan.engine.pack import (check_free_space, check_pack_target, default_device, formats_from_mix,
                                         formats_from_plan, pack_checkpoint)
    from strata_plan.outpaths import check_out_folder
    from strata_plan.core.families import require_runs
    from strata_plan.core.spec import load_spec
    if args.format is not None and args.format not in F.FORMATS:
        raise UserError("--format", args.format, "unknown format", f"use one of {', '.join(F.FORMATS)}")
    if args.stats and not args.bpw:
        raise UserError("--stats", args.stats, "only orders experts for a tier mix", "use it with --bpw")
    if bool(args.checkpoint) == bool(args.synthetic):
        raise UserError("CHECKPOINT / --synthetic", str(args.checkpoint or args.synthetic),
                        "give exactly one: a checkpoint folder or --synthetic MODEL", "see `strata-plan pack --help`")
    if args.moe_layers is not None and not args.synthetic:
        raise UserError("--moe-layers", str(args.moe_layers), "only cuts a --synthetic model",
                        "pack the whole checkpoint, or use --synthetic MODEL")
    if (args.calib or args.rtn) and args.synthetic:
        raise UserError("--calib" if args.calib else "--rtn", "", "quantizes a checkpoint's weights, not random ones",
                        "pack a checkpoint folder, or leave it out")
    if args.calib_tokens < 2:
        raise UserError("--calib-tokens", str(args.calib_tokens), "must be at least 2", "use 2 or more")
    check_out_folder(args.out, "--out", args.force)      # before any work (issue 25)
    check_pack_target(args.out)                          # written beside it and renamed: not a mount point
    spec = load_spec(args.synthetic, args.moe_layers) if args.synthetic else load_spec(args.checkpoint)
    require_runs(spec.model_type, spec.source or spec.name)     # a family the engine runs (core.families)
    plan_sha = ""
    if args.plan:
        layer_formats, plan_sha = formats_from_plan(args.plan, spec)
    else:
        layer_formats = formats_from_mix(spec, args.bpw, args.format, args.stats)
    device = args.device or default_device()
    check_free_space(args.out, spec, layer_formats)
    stats = None
    if args.calib:
        from strata_plan.engine.calib import activation_stats, calibration_tokens
        stats = activation_stats(args.checkpoint, calibration_tokens(args.checkpoint, args.calib, args.calib_tokens),
                                 512, device)
    done: list[int] = []

    def on_layer(layer: int, nbytes: int) -> None:       # the packer's progress: a MoE layer's experts written
        done.append(layer)
        update(len(done), "writing dense weights" if len(done) == spec.n_moe_layers else None)
    t0 = time.perf_counter()
    try:
        with progress_bar(f"packing {spec.name}'s experts", spec.n_moe_layers, on=not args.json,
                          unit="MoE layers") as update:
            if args.synthetic:
                from strata_plan.engine.synthetic import pack_synthetic
                index = pack_synthetic(spec, args.out, layer_formats, device, args.seed, plan_sha, progress=on_layer)
            else:
                index = pack_checkpoint(args.checkpoint, args.out, layer_formats, device, plan_sha, importance=stats,
                                        rtn=args.rtn, progress=on_layer)
    except OSError as e:
        raise UserError(str(e.filename or args.out), "write", e.strerror or str(e),
                        "free space or choose another --out, then pack again") from None
    seconds = time.perf_counter() - t0
    summary = {"out": str(args.out), "model": index.model, "source": index.source, "device": device,
               "experts": len(index.entries), "expert_bytes": index.expert_bytes,
               "bytes_by_format": index.bytes_by_format(), "dense_bytes": index.dense_nbytes,
               "quantizer": "rtn" if args.rtn else "fit", "calibration_tokens": stats.tokens if stats else 0,
               "seconds": round(seconds, 2), "experts_per_s": round(len(index.entries) / seconds, 2)}
    if args.json:
        print(json.dumps(summary))
    else:
        from rich.table import Table
        t = Table(title=f"packed {index.model} into {args.out}")
        for c in ("format", "experts", "MB"):
            t.add_column(c, justify="right" if c != "format" else "left")
        counts: dict[str, int] = {}
        for e in index.entries:
            counts[e.format] = counts.get(e.format, 0) + 1
        for f, n in index.bytes_by_format().items():
            t.add_row(f, str(counts[f]), f"{n / 1e6:.2f}")
        t.add_row("dense (safetensors)", "", f"{summary['dense_bytes'] / 1e6:.2f}")
        console().print(t)
        print(f"{summary['experts']} experts in {summary['seconds']} s on {device} "
              f"({summary['experts_per_s']} experts/s); index: {Path(args.out) / 'index.json'}")
    return 0
