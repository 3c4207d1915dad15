"""Which expert is where in VRAM: the static set, each layer's LRU cache and the landing slots.

Pure bookkeeping (no tensors, no threads), so the cache policy can be held to the routing package's
brute-force simulation (`core.routing.reference.simulate_cache`) access by access.

The device arena's dynamic part is `n_slots` slots of one size (the largest format): the plan's cache
slots (`cache_slots` per layer, summed) plus its staging slots. A slot's role is logical, not fixed:

    FREE     holds nothing the engine will read again
    STAGED   an expert fetched for a layer (by a hint or on demand) that no token has used yet
    CACHE    one of a layer's `cache_slots` most recently used non-static experts (the LRU cache)
    SPENT    used by the token now running and not kept in the cache: freed when that layer is released

The cache policy is the planner's (`core/routing/lru.py`): a token's k experts are looked up against
the cache as it stood after the previous token, then touched in slot order (highest gate weight first),
so after a token a layer's cache holds the `cache_slots` most recently touched non-static experts. A
prefetched expert joins the cache only when a token uses it (then it takes its place by the same rule),
so prefetching never changes which experts the cache holds; a prefetch no token used is wasted.
A slot is `pinned` from `classify` to `release` of its layer: the kernel about to run reads it.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Iterable

FREE, STAGED, CACHE, SPENT = "free", "staged", "cache", "spent"
# how a routed use was served, at the moment the router's ids reached the store (before any wait)
STATIC, CACHED, PREFETCHED, LATE, DEMAND = "static", "cached", "prefetched", "late", "demand"
IN_PLACE = "in_place"      # the device loop: read by the MoE kernel straight from pinned RAM (no copy)
STAGED_USE = "staged"      # the device loop: an NVMe expert read in place from the pinned staging cache, there in time
USE_KINDS = (STATIC, CACHED, PREFETCHED, LATE, DEMAND, IN_PLACE, STAGED_USE)
HIT_KINDS = (STATIC, CACHED, PREFETCHED)          # the seeds' hit: already there when the layer ran


@dataclass
class Slot:
    index: int
    layer: int = -1
    expert: int = -1
    role: str = FREE
    fetch: Any = None          # the transfer that fills it (readiness), None once known complete
    by_hint: bool = False      # filled by a prefetch hint (for the waste and precision counters)
    release: Any = None        # event of the last kernel that read it: a new copy into it waits for this
    pinned: bool = False


class Residency:
    """Per-layer residency of routed experts over a static set and `n_slots` dynamic slots."""

    def __init__(self, static_ids: list[Iterable[int]], cache_slots: list[int], n_slots: int):
        if n_slots < sum(cache_slots):
            raise ValueError(f"{n_slots} dynamic slots cannot hold {sum(cache_slots)} cache slots")
        self.static = [frozenset(s) for s in static_ids]
        self.cache_slots = list(cache_slots)
        self.slots = [Slot(i) for i in range(n_slots)]
        self.where: list[dict[int, int]] = [{} for _ in cache_slots]      # layer -> expert -> slot index
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in cache_slots]
        self.free: deque[int] = deque(range(n_slots))

    # ---- queries -------------------------------------------------------------------------------------
    def slot_of(self, layer: int, expert: int) -> Slot | None:
        i = self.where[layer].get(expert)
        return None if i is None else self.slots[i]

    def is_resident(self, layer: int, expert: int) -> bool:
        return expert in self.static[layer] or expert in self.where[layer]

    def n_free(self) -> int:
        return len(self.free)

    def staged(self, layer: int) -> list[Slot]:
        return [self.slots[i] for i in self.where[layer].values() if self.slots[i].role == STAGED]

    # ---- changes -------------------------------------------------------------------------------------
    def take(self, layer: int, expert: int, by_hint: bool, steal: bool) -> tuple[Slot | None, Slot | None]:
        """A slot for a new fetch of (layer, expert): a free one, else (if `steal`) the oldest unused
        prefetch of another layer, which is dropped. Returns (slot, stolen-from slot copy or None);
        (None, None) when nothing can be had."""
        stolen = None
        if not self.free:
            if not steal:
                return None, None
            cands = [s for s in self.slots if s.role == STAGED and s.by_hint and not s.pinned and s.layer != layer]
            if not cands:
                return None, None
            victim = cands[0]
            stolen = Slot(victim.index, victim.layer, victim.expert, victim.role, victim.fetch, True, victim.release)
            self._drop(victim)
        i = self.free.popleft()
        s = self.slots[i]
        s.layer, s.expert, s.role, s.by_hint, s.fetch, s.pinned = layer, expert, STAGED, by_hint, None, False
        self.where[layer][expert] = i
        return s, stolen

    def classify(self, layer: int, ids: list[int], done) -> list[str]:
        """How each routed use of `ids` (one token's, in slot order; an expert listed once) is served, by
        the state before this token: STATIC, CACHED, PREFETCHED (staged and landed: `done(slot)` True),
        LATE (staged, still in flight) or DEMAND (not there). Pins every dynamic slot the ids use."""
        kinds = []
        for e in ids:
            if e in self.static[layer]:
                kinds.append(STATIC)
                continue
            s = self.slot_of(layer, e)
            if s is None:
                kinds.append(DEMAND)
                continue
            s.pinned = True
            if s.role == CACHE:
                kinds.append(CACHED)
            elif s.role == STAGED and done(s):
                kinds.append(PREFETCHED if s.by_hint else CACHED)
            else:
                kinds.append(LATE)
        return kinds

    def touch(self, layer: int, ids: list[int]) -> list[Slot]:
        """After a token's experts are all in slots: touch them in slot order in the layer's LRU cache.
        Experts the cache does not keep become SPENT (freed at `release`); evicted cache entries of
        earlier tokens are freed now. Unused prefetches of this layer are dropped. Returns those
        dropped prefetches (wasted)."""
        used = set(ids)
        lru, cap = self.lru[layer], self.cache_slots[layer]
        for e in ids:
            if e in self.static[layer]:
                continue
            s = self.slot_of(layer, e)
            s.pinned = True
            lru[e] = None
            lru.move_to_end(e)
            s.role = CACHE
        while len(lru) > cap:
            e, _ = lru.popitem(last=False)
            s = self.slot_of(layer, e)
            if e in used:
                s.role = SPENT
            else:
                self._drop(s)
        wasted = []
        for s in self.staged(layer):
            if s.by_hint and s.expert not in used and not s.pinned:
                wasted.append(Slot(s.index, s.layer, s.expert, s.role, s.fetch, True, s.release))
                self._drop(s)
        return wasted

    def release(self, layer: int, event: Any) -> None:
        """The layer's kernel is queued: every pinned slot of the layer records `event` (a copy into the
        slot waits for it) and unpins; SPENT slots become free."""
        for i in list(self.where[layer].values()):
            s = self.slots[i]
            if s.pinned:
                s.release, s.pinned = event, False
                if s.role == SPENT:
                    self._drop(s)

    def unpin(self, layer: int) -> None:
        for i in self.where[layer].values():
            self.slots[i].pinned = False

    def _drop(self, s: Slot) -> None:
        self.where[s.layer].pop(s.expert, None)
        self.lru[s.layer].pop(s.expert, None)
        s.layer, s.expert, s.role, s.fetch, s.by_hint, s.pinned = -1, -1, FREE, None, False, False
        self.free.append(s.index)
