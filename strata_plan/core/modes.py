"""Run modes: a plan as written, or the same plan without some of its levers, for side-by-side runs.

    plan       as written
    lru        the cache kept, the router lookahead off (prefetch depth 0)
    on-demand  no cache slots either: the plan's static VRAM experts, everything else read from where it lies when routed

The engine runs a plan in a mode (`EngineOptions.mode`) and the planner predicts the same plan in the same
mode (`planner.repredict`), so measured and predicted figures are of one configuration.
"""
from __future__ import annotations

import dataclasses

from strata_plan.core.plan import CachePlan, Plan
from strata_plan.errors import UserError

MODES = ("plan", "lru", "on-demand")


def baseline(plan: Plan, mode: str) -> Plan:
    """The plan run as `mode` (see the module docstring)."""
    if mode not in MODES:
        raise UserError("mode", str(mode), "unknown", f"use one of {', '.join(MODES)}")
    if mode == "plan":
        return plan
    if mode == "lru":
        return dataclasses.replace(plan, prefetch_depth=0)
    layers = tuple(dataclasses.replace(l, cache_slots=0) for l in plan.layers)
    return dataclasses.replace(plan, layers=layers, prefetch_depth=0,
                               cache=CachePlan(plan.cache.policy, plan.cache.slot_bytes, 0))
