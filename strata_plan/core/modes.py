"""Run modes: a plan as written, or the same plan without some of its levers, for side-by-side runs.

    plan       as written
    lru        the cache kept, the router lookahead off (prefetch depth 0)
    on-demand  no cache slots either: the plan's static VRAM experts, everything else fetched when routed

The engine runs a plan in a mode (`EngineOptions.mode`) and the planner predicts the same plan in the same
mode (`planner.repredict`), so measured and predicted figures are of one configuration.
"""
from __future__ import annotations

import dataclasses

from strata_plan.core.plan import CachePlan, Plan
from strata_plan.errors import UserError

MODES = ("plan", "lru", "on-demand")
LOOPS = ("device", "host")      # the engine's decode loops (engine/ENGINE.md); the cost model prices each


def reads_in_place(plan: Plan, loop: str = "device") -> bool:
    """Whether the engine's device loop runs `plan` (already in its mode): every routed expert outside the static
    VRAM set is read from pinned RAM by the GPU with no host work per layer: in place by the MoE kernel, or, with
    cache slots, copied into its slot by the device LRU's fill when admitted (the planner's LRU decided on the
    device, `kernels.lru`), or from a VRAM staging slot the router lookahead's guess filled on a side stream
    (`engine.prefetch`). NVMe experts are staged into pinned RAM by the stager first (`engine.staging`). Every
    one-GPU plan runs it with loop "device"; "host" asks for the host loop."""
    return loop == "device"


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
