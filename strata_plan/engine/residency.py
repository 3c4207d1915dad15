"""Which expert is where in VRAM for prefill's waves: the static set and the slots a wave's fetches land in.

Pure bookkeeping (no tensors, no threads). The device arena's dynamic part is `n_slots` slots of one size (the
largest format); the device LRU owns the last `cache.total_slots` of them (`kernels.lru`, decided on the device), the
device lookahead its staging slots between tokens (`engine.prefetch`); a prefill wave takes slots here for the experts
it fetches and gives them back once its kernel ran (`store.waves`), so a prefill never touches the decode cache.

A slot is free or holds one (layer, expert) a wave fetched; `give_back` frees it with the event of the last kernel that
read it (`Slot.release`), which the next copy into the slot waits for. How a decode use was served is counted by kind (`USE_KINDS`, the
counters: engine/counters.py).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

# how a routed use was served, at the moment its layer ran
STATIC, CACHED, PREFETCHED, LATE, DEMAND = "static", "cached", "prefetched", "late", "demand"
IN_PLACE = "in_place"      # read by the MoE kernel straight from pinned RAM (no copy)
STAGED_USE = "staged"      # an NVMe expert read in place from the pinned staging cache, there in time
PARTIAL = "partial"        # a lookahead guess still copying: the cache's fill read the part of it that had landed
#                            from its staging slot, the rest from pinned RAM
USE_KINDS = (STATIC, CACHED, PREFETCHED, LATE, DEMAND, IN_PLACE, STAGED_USE, PARTIAL)
HIT_KINDS = (STATIC, CACHED, PREFETCHED)          # the seeds' hit: already there when the layer ran


@dataclass
class Slot:
    index: int
    layer: int = -1
    expert: int = -1
    fetch: Any = None          # the transfer that fills it
    release: Any = None        # event of the last kernel that read it: a new copy into it waits for this


class Residency:
    """Per-layer residency of routed experts over a static set and `n_slots` dynamic slots (prefill's)."""

    def __init__(self, static_ids: list[Iterable[int]], n_slots: int):
        self.static = [frozenset(s) for s in static_ids]
        self.slots = [Slot(i) for i in range(n_slots)]
        self.where: list[dict[int, int]] = [{} for _ in static_ids]      # layer -> expert -> slot index
        self.free: deque[int] = deque(range(n_slots))

    def is_resident(self, layer: int, expert: int) -> bool:
        return expert in self.static[layer] or expert in self.where[layer]

    def n_free(self) -> int:
        return len(self.free)

    def take(self, layer: int, expert: int) -> Slot | None:
        """A free slot for a new fetch of (layer, expert), or None when every slot is taken."""
        if not self.free:
            return None
        s = self.slots[self.free.popleft()]
        s.layer, s.expert, s.fetch = layer, expert, None
        self.where[layer][expert] = s.index
        return s

    def give_back(self, s: Slot, event: Any) -> None:
        """The wave that read `s` is queued: the next copy into it waits for `event`; the slot is free."""
        self.where[s.layer].pop(s.expert, None)
        s.layer, s.expert, s.fetch, s.release = -1, -1, None, event
        self.free.append(s.index)
