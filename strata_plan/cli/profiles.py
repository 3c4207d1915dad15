"""`strata-plan profiles [NAME]`: the shipped hardware profiles (`profiles/*.yaml`), or one profile."""
from __future__ import annotations

from strata_plan.cli._common import add_json, emit, print_json, table


def register(sub) -> None:
    p = sub.add_parser("profiles", help="list shipped hardware profiles, or show one")
    p.add_argument("profile", nargs="?", help="shipped profile name or path to a profile YAML")
    add_json(p)
    p.set_defaults(func=cmd_profiles)


def cmd_profiles(args) -> int:
    from strata_plan.profiles.schema import load_profile, profile_summary, shipped_profiles
    from strata_plan.schema import to_data
    if not args.profile:
        rows = [profile_summary(load_profile(n)) for n in shipped_profiles()]
        t = table("profile", "GPU", "VRAM GB", "pinned H2D @16MiB GB/s", "RAM GB", "NVMe @16MiB GB/s",
                  title="shipped profiles")
        for r in rows:
            t.add_row(*(str(v) for v in r.values()))
        emit(args, rows, t)
        return 0
    p = load_profile(args.profile)
    if args.json:
        print_json(to_data(p))
    else:
        from strata_plan.yamlio import dump_yaml
        print(dump_yaml(to_data(p)))
    return 0
