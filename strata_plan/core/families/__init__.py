"""Model families, one module each, found by `model_type`.

Each module here defines `FAMILY` (a `Family`): its model_types, the reader of its geometry from config.json,
its router and attention kinds, its llama.cpp tensor names, whether the engine runs it and, if so, its
checkpoint tensor names. Every module in this folder is imported and its `FAMILY` registered, so a new family
is one new module (and a test with a tiny config, tests/test_families.py); `register` adds one from anywhere.
`core.spec` reads configs through `family_of`; the engine dispatches its runtime code on the family's kinds.
"""
from __future__ import annotations

import importlib
import pkgutil

from strata_plan.core.families.base import (FAMILIES, Family, TensorNames, family_of, model_types, register,
                                            require_runs, unregister)

__all__ = ["FAMILIES", "Family", "TensorNames", "family_of", "model_types", "register", "require_runs", "unregister"]

for _m in pkgutil.iter_modules(__path__):
    if _m.name != "base" and not _m.name.startswith("_"):
        register(importlib.import_module(f"{__name__}.{_m.name}").FAMILY)
