"""Foundation subcommands: `models`, `profiles`, `formats` (what strata-plan knows about)."""
from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list shipped model specs, or show one's bytes and FLOPs")
    p.add_argument("model", nargs="?", help="shipped spec name or path to a config.json")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("profiles", help="list shipped hardware profiles, or show one")
    p.add_argument("profile", nargs="?", help="shipped profile name or path to a profile YAML")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_profiles)
    p = sub.add_parser("formats", help="list the packed expert formats and their bits per weight")
    p.add_argument("--model", help="also show bytes per routed expert of this model")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_formats)


def _emit(args, data, table) -> None:
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        Console().print(table)


def cmd_models(args) -> int:
    from strata_plan.kernels.formats import TIER_FORMATS, tier_mix
    from strata_plan.planner.spec import load_spec, shipped_models
    if not args.model:
        rows = [load_spec(m).summary() for m in shipped_models()]
        t = Table("model", "type", "layers (MoE)", "experts / top-k", "total B", "active B", title="shipped model specs")
        for r in rows:
            t.add_row(r["name"], r["model_type"], f"{r['layers']} ({r['moe_layers']})",
                      f"{r['routed_experts']} / {r['top_k']}", f"{r['total_params_B']}", f"{r['active_params_B']}")
        _emit(args, rows, t)
        return 0
    s = load_spec(args.model)
    mix = tier_mix()
    data = {**s.summary(),
            "routed_expert_bytes": {f: s.routed_expert_bytes(f) for f in (*TIER_FORMATS, "q4_g128_f16", "bf16")},
            "dense_bytes_bf16": s.dense_bytes, "dense_bytes_per_token": s.dense_bytes_per_token(),
            "kv_bytes_per_token": s.kv_bytes_per_token(), "flops_per_token_ctx0": s.flops_per_token(0),
            "native_bytes": s.native_bytes, "seed_mix_bytes": s.packed_bytes(mix),
            "seed_mix": dict(zip(mix.formats, [round(f, 4) for f in mix.fractions]))}
    t = Table("quantity", "value", title=f"{s.name}")
    for k, v in data.items():
        t.add_row(k, f"{v:,}" if isinstance(v, int) else str(v))
    _emit(args, data, t)
    return 0


def cmd_profiles(args) -> int:
    from strata_plan.profiles.schema import load_profile, shipped_profiles
    from strata_plan.schema import to_data
    if not args.profile:
        rows = []
        for n in shipped_profiles():
            p = load_profile(n)
            g = p.gpu
            rows.append({"name": n, "gpu": g.name if g else "(none)", "vram_gb": g.vram_gb.value if g else 0,
                         "h2d_16MiB_gbps": round(g.h2d_pinned.at(16 << 20), 1) if g else 0,
                         "ram_gb": p.host.ram_gb.value,
                         "nvme_16MiB_gbps": round(p.nvme[0].rand_read.best(16 << 20)[0], 2) if p.nvme else 0})
        t = Table("profile", "GPU", "VRAM GB", "pinned H2D @16MiB GB/s", "RAM GB", "NVMe @16MiB GB/s", title="shipped profiles")
        for r in rows:
            t.add_row(*(str(v) for v in r.values()))
        _emit(args, rows, t)
        return 0
    p = load_profile(args.profile)
    if args.json:
        print(json.dumps(to_data(p), indent=2))
    else:
        from strata_plan.yamlio import dump_yaml
        print(dump_yaml(to_data(p)))
    return 0


def cmd_formats(args) -> int:
    from strata_plan.kernels.formats import FORMATS
    spec = None
    if args.model:
        from strata_plan.planner.spec import load_spec
        spec = load_spec(args.model)
    rows = []
    for f in FORMATS.values():
        r = {"name": f.name, "bpw": f.bpw, "seed_bpw": f.seed_bpw, "description": f.description}
        if spec:
            r["expert_bytes"] = spec.routed_expert_bytes(f.name)
        rows.append(r)
    t = Table("format", "bpw", "seed bpw", *(["bytes/expert"] if spec else []), "layout", title="packed formats")
    for r in rows:
        t.add_row(r["name"], f"{r['bpw']:.4f}", str(r["seed_bpw"] or "-"), *([f"{r['expert_bytes']:,}"] if spec else []),
                  r["description"])
    _emit(args, rows, t)
    return 0
