"""`strata-plan formats [--model M]`: the packed expert formats (`kernels.formats`) and their byte sizes."""
from __future__ import annotations

from strata_plan.cli._common import add_json, emit, table


def register(sub) -> None:
    p = sub.add_parser("formats", help="list the packed expert formats and their bits per weight")
    p.add_argument("--model", help="also show bytes per routed expert of this model")
    add_json(p)
    p.set_defaults(func=cmd_formats)


def cmd_formats(args) -> int:
    from strata_plan.kernels.formats import FORMATS
    spec = None
    if args.model:
        from strata_plan.core.spec import load_spec
        spec = load_spec(args.model)
    rows = []
    for f in FORMATS.values():
        r = {"name": f.name, "bpw": f.bpw, "seed_bpw": f.seed_bpw, "description": f.description}
        if spec:
            r["expert_bytes"] = spec.routed_expert_bytes(f.name)
        rows.append(r)
    t = table("format", "bpw", "seed bpw", *(["bytes/expert"] if spec else []), "layout", title="packed formats")
    for r in rows:
        t.add_row(r["name"], f"{r['bpw']:.4f}", str(r["seed_bpw"] or "-"), *([f"{r['expert_bytes']:,}"] if spec else []),
                  r["description"])
    emit(args, rows, t)
    return 0
