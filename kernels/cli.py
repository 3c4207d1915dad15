"""Subcommands of this package: `pack` (kernels/pack.py)."""


def register(sub) -> None:
    from strata_plan.kernels import pack
    pack.register(sub)
