"""Plans with tiers set by hand, for benchmarks that need a given split rather than the searched one."""
from __future__ import annotations

import dataclasses

from strata_plan.core.plan import CachePlan


def tiers_by_hand(plan, vram_share: float, cache: int, fmt: str | None = None):
    """`plan` with, in every layer, the `vram_share` most used experts (the plan's popularity order) static in VRAM,
    the rest in pinned RAM (no NVMe tier), `cache` LRU slots, no lookahead; every expert in `fmt` when given."""
    layers = []
    for l in plan.layers:
        order = list(l.vram) + list(l.ram) + list(l.nvme)
        s = int(round(vram_share * len(order)))
        extra = {"formats": {fmt: tuple(range(plan.n_experts))}} if fmt else {}
        layers.append(dataclasses.replace(l, vram=tuple(order[:s]), ram=tuple(order[s:]), nvme=(), cache_slots=cache,
                                          **extra))
    return dataclasses.replace(plan, layers=tuple(layers), prefetch_depth=0,
                               cache=CachePlan("lru", plan.cache.slot_bytes, cache * len(layers)))


def forced_depth(plan, depth: int):
    """`plan` with lookahead `depth` (VRAM landing slots and the pinned staging cache grown to match), its prediction
    kept from the plan as made: a configuration the planner did not choose, run to see what lookahead does. No expert
    moves out to make room: the grown slots come on top of the plan's VRAM and RAM budgets (rows say so)."""
    from strata_plan.core.lookahead import pinned_staging_slots, staging_slots
    st = plan.staging
    st = dataclasses.replace(st, vram_slots=max(st.vram_slots, staging_slots(plan.top_k, depth)),
                             host_slots=pinned_staging_slots(plan.top_k, depth, st.host_slots))
    return dataclasses.replace(plan, prefetch_depth=depth, staging=st)


def own_vram_budget(plan, profile, where: str = "plan"):
    """`plan` with its VRAM budget set to the bytes it places in VRAM (the planner's footprint of its own placement,
    reserve included): a hand-tiered plan's budget, so that what is made from it (`strata-plan export`) keeps to the
    same VRAM rather than the machine's."""
    from strata_plan.planner.placement import footprint, placement_of
    from strata_plan.planner.repredict import plan_problem
    vram = footprint(plan_problem(plan, profile, where), placement_of(plan)).vram
    mem = plan.memory
    return dataclasses.replace(plan, memory=dataclasses.replace(
        mem, budgets=dataclasses.replace(mem.budgets, vram_bytes=int(vram))))
