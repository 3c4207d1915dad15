"""`strata-plan pack CHECKPOINT --out DIR`: quantize a Hugging Face checkpoint's routed experts into the
packed, 4 KiB-aligned blobs the engine reads (`kernels.pack`, PACK.md). Refuses a folder that is not empty
unless `--force`."""
from __future__ import annotations

from strata_plan.cli._common import add_json, add_out, console, table
from strata_plan.errors import UserError


def register(sub) -> None:
    from strata_plan.kernels import formats as F
    p = sub.add_parser("pack", help="quantize a checkpoint's routed experts into packed 4 KiB-aligned blobs",
                       description="Turn a Hugging Face MoE checkpoint into what the engine reads: every routed "
                                   "expert packed in its format (kernels/PACK.md).")
    p.add_argument("checkpoint", help="Hugging Face checkpoint folder (config.json + safetensors)")
    add_out(p, "folder to write the packed model to (new or empty; --force writes into a non-empty one)",
            required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--plan", help="plan YAML (strata-plan plan): each expert's format")
    g.add_argument("--bpw", type=float, help="tier mix of the three tier formats at this mean bits per weight")
    g.add_argument("--format", help=f"one format for every expert ({', '.join(F.FORMATS)})")
    p.add_argument("--stats", help="with --bpw: routing statistics YAML or trace .npz (most used experts get "
                                   "the first tier); default: expert ids in order")
    p.add_argument("--device", default="cpu", help="where to quantize (cpu or cuda)")
    add_json(p, "machine-readable summary")
    p.set_defaults(func=cmd_pack)


def cmd_pack(args) -> int:
    import json
    import time
    from pathlib import Path

    from strata_plan.kernels import formats as F
    from strata_plan.kernels.pack import formats_from_mix, formats_from_plan, pack_checkpoint
    from strata_plan.outpaths import check_out_folder
    from strata_plan.planner.spec import load_spec
    if args.format is not None and args.format not in F.FORMATS:
        raise UserError("--format", args.format, "unknown format", f"use one of {', '.join(F.FORMATS)}")
    if args.stats and not args.bpw:
        raise UserError("--stats", args.stats, "only orders experts for a tier mix", "use it with --bpw")
    check_out_folder(args.out, "--out", args.force)
    spec = load_spec(args.checkpoint)
    layer_formats = (formats_from_plan(args.plan, spec) if args.plan
                     else formats_from_mix(spec, args.bpw, args.format, args.stats))
    t0 = time.perf_counter()
    index = pack_checkpoint(args.checkpoint, args.out, layer_formats, args.device)
    summary = {"out": str(args.out), "model": index.model, "experts": len(index.entries),
               "expert_bytes": index.expert_bytes, "bytes_by_format": index.bytes_by_format(),
               "dense_bytes": (Path(args.out) / "dense.safetensors").stat().st_size,
               "seconds": round(time.perf_counter() - t0, 2)}
    if args.json:
        print(json.dumps(summary))
        return 0
    t = table("format", "experts", "MB", title=f"packed {index.model} into {args.out}")
    counts: dict[str, int] = {}
    for e in index.entries:
        counts[e.format] = counts.get(e.format, 0) + 1
    for f, n in index.bytes_by_format().items():
        t.add_row(f, str(counts[f]), f"{n / 1e6:.2f}")
    t.add_row("dense (safetensors)", "", f"{summary['dense_bytes'] / 1e6:.2f}")
    con = console()
    con.print(t)
    con.print(f"{summary['experts']} experts in {summary['seconds']} s; index: {Path(args.out) / 'index.json'}")
    return 0
