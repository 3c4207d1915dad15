"""`strata-plan models [NAME]`: the shipped model specs, or one model's bytes per expert and per token, KV
cache and FLOPs (from `planner.spec.ModelSpec`)."""
from __future__ import annotations

from strata_plan.cli._common import add_json, emit, table


def register(sub) -> None:
    p = sub.add_parser("models", help="list shipped model specs, or show one's bytes and FLOPs")
    p.add_argument("model", nargs="?", help="shipped spec name or path to a config.json")
    add_json(p)
    p.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    from strata_plan.core.spec import load_spec, shipped_models
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
