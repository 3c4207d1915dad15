"""`strata-plan models [NAME]`: the shipped model specs, or one model's bytes per expert and per token, KV
cache and FLOPs (from `core.spec.ModelSpec`); `--scan DIR`: which Hugging Face configs in a folder load."""
from __future__ import annotations

from strata_plan.cli._common import add_json, emit, table


def register(sub) -> None:
    p = sub.add_parser("models", help="list shipped model specs, or show one's bytes and FLOPs")
    p.add_argument("model", nargs="?", help="shipped spec name or path to a config.json")
    p.add_argument("--scan", metavar="DIR", help="say which config JSON files under DIR load, and why the others do not")
    p.add_argument("--markdown", action="store_true", help="with --scan: print a Markdown table (the README's)")
    add_json(p)
    p.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    from strata_plan.core.spec import load_spec, shipped_models
    if args.scan:
        return _scan(args)
    if not args.model:
        rows = [load_spec(m).summary() for m in shipped_models()]
        t = table("model", "type", "layers (MoE)", "experts / top-k", "total B", "active B", title="shipped model specs")
        for r in rows:
            t.add_row(r["name"], r["model_type"], f"{r['layers']} ({r['moe_layers']})",
                      f"{r['routed_experts']} / {r['top_k']}", f"{r['total_params_B']}", f"{r['active_params_B']}")
        emit(args, rows, t)
        return 0
    s = load_spec(args.model)
    data = s.details()
    t = table("quantity", "value", title=f"{s.name}")
    for k, v in data.items():
        t.add_row(k, f"{v:,}" if isinstance(v, int) else str(v))
    emit(args, data, t)
    return 0


def _scan(args) -> int:
    from pathlib import Path

    from strata_plan.core.spec import scan_configs
    from strata_plan.errors import UserError
    if not Path(args.scan).is_dir():
        raise UserError("--scan", args.scan, "is not a folder", "pass a folder of Hugging Face config JSON files")
    rows = scan_configs(args.scan)
    if args.markdown:
        print("| config | result | detail |\n|---|---|---|")
        for rel, result, detail in rows:
            print(f"| `{rel}` | {result} | {detail} |")
        return 0
    t = table("config", "result", "detail", title=f"configs under {args.scan}")
    for r in rows:
        t.add_row(*r)
    emit(args, [dict(zip(("config", "result", "detail"), r)) for r in rows], t)
    return 0
