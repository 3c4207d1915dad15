"""Placements and the allocator that builds them from a handful of global knobs.

A placement says, per MoE layer, how many experts (by popularity rank) are static in VRAM, how many sit in
pinned RAM and how many LRU cache slots the layer gets; the rest are on NVMe. It also says which dense
units (each decoder layer's non-routed weights, and the lm_head) stay in VRAM and how deep router
lookahead prefetches.

The search does not choose 92 x 3 counts directly. It chooses four knobs, and `allocate` water-fills:
  * dense_share   -> the smallest dense units first stay resident (every unit is read once per token,
                     so only their total matters for decode; small first gives the knob fine steps);
  * cache_share   -> that share of the VRAM left for experts becomes cache slots, the rest static experts;
  * skew_weight w -> every (layer, rank) gets key = w * E * pop[l, r] + (1 - w) * (1 - r / E); static VRAM
                     and then pinned RAM take the highest keys across all layers until their bytes run out.
                     w = 0 gives every layer the same count (the greedy baseline); w = 1 ranks by measured
                     popularity, which is what a per-byte marginal-gain argument asks for when layers differ
                     in skew (the static-hit curves are concave, so the water level is one threshold);
  * cache slots go to the layers with the largest marginal bytes saved per slot (LRU hit curves from the
    routing statistics, made concave by a running minimum of the per-slot gain).
Keys fall strictly with rank inside a layer, so each tier is a contiguous rank range of every layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata_plan.planner.capacity import Footprint, staging_slots, workspace_bytes

CACHE_GRID = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


@dataclass(frozen=True)
class Knobs:
    """The global choices the search makes (see the module docstring)."""

    dense_share: float
    cache_share: float
    skew_weight: float
    prefetch_depth: int

    def as_params(self) -> dict:
        return {"dense_share": self.dense_share, "cache_share": self.cache_share,
                "skew_weight": self.skew_weight, "prefetch_depth": self.prefetch_depth}


@dataclass(frozen=True)
class Placement:
    """Where every expert and dense unit lives, by counts in popularity-rank space."""

    vram: tuple[int, ...]             # per MoE layer: ranks [0, vram) static in VRAM
    ram: tuple[int, ...]              # per MoE layer: ranks [vram, vram + ram) in pinned RAM
    cache: tuple[int, ...]            # per MoE layer: LRU cache slots over the non-static experts
    dense_resident: tuple[bool, ...]  # per dense unit (decoder layers in order, then the lm_head)
    prefetch_depth: int

    def __post_init__(self) -> None:
        if not (len(self.vram) == len(self.ram) == len(self.cache)):
            raise ValueError("vram, ram and cache need one count per MoE layer")
        if min(self.vram + self.ram + self.cache, default=0) < 0 or self.prefetch_depth < 0:
            raise ValueError("counts must be >= 0")

    @property
    def n_layers(self) -> int:
        return len(self.vram)

    def nvme(self, n_experts: int) -> tuple[int, ...]:
        return tuple(n_experts - v - r for v, r in zip(self.vram, self.ram))

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.array(self.vram, dtype=np.int64), np.array(self.ram, dtype=np.int64),
                np.array(self.cache, dtype=np.int64))


@dataclass(frozen=True)
class Allocation:
    placement: Placement
    footprint: Footprint


def footprint(problem, p: Placement) -> Footprint:
    """Bytes per tier of placement `p` (see capacity.Footprint)."""
    spec, units, rb = problem.spec, problem.dense_units, problem.rank_bytes
    cum = np.concatenate([[0.0], np.cumsum(rb)])
    v, r, c = p.arrays
    streamed = [b for b, res in zip(units, p.dense_resident) if not res]
    slots = staging_slots(spec, p.prefetch_depth) * problem.slot_bytes
    nvme_experts = float(np.sum(cum[-1] - cum[v + r]))
    return Footprint(
        reserve=problem.budget.reserve, kv_cache=spec.kv_cache_bytes(problem.context),
        workspace=workspace_bytes(spec, problem.prefill_chunk), staging=slots,
        dense_buffers=2 * max(streamed, default=0), dense_resident=sum(b for b, res in zip(units, p.dense_resident) if res),
        static_experts=int(np.sum(cum[v])), cache_slots=int(np.sum(c)) * problem.slot_bytes,
        embeddings=spec.embedding_bytes, dense_streamed=sum(streamed), ram_experts=int(np.sum(cum[v + r] - cum[v])),
        host_staging=slots if nvme_experts > 0 else 0, nvme_experts=int(nvme_experts))


def dense_choice(problem, share: float) -> tuple[bool, ...]:
    """The `share` (by count) of dense units that stay resident: the smallest first, ties by position."""
    units = problem.dense_units
    n = int(round(min(max(share, 0.0), 1.0) * len(units)))
    keep = set(sorted(range(len(units)), key=lambda i: (units[i], i))[:n])
    return tuple(i in keep for i in range(len(units)))


def _rank_order(curves, skew_weight: float) -> tuple[np.ndarray, np.ndarray]:
    """(layer, rank) of every expert slot, best key first."""
    L, E = curves.pop.shape
    ranks = np.broadcast_to(np.arange(E), (L, E))
    key = skew_weight * E * curves.pop + (1.0 - skew_weight) * (1.0 - ranks / E)
    layers = np.broadcast_to(np.arange(L)[:, None], (L, E))
    order = np.lexsort((layers.ravel(), ranks.ravel(), -key.ravel()))
    return layers.ravel()[order], ranks.ravel()[order]


def _fill(layer: np.ndarray, rank: np.ndarray, rank_bytes: np.ndarray, start: int, budget: float, L: int) -> tuple[np.ndarray, int]:
    """Counts per layer of the longest run of `order[start:]` whose bytes fit in `budget`."""
    cum = np.cumsum(rank_bytes[rank[start:]])
    n = int(np.searchsorted(cum, max(budget, 0.0), side="right"))
    return np.bincount(layer[start:start + n], minlength=L), n


def _cache_slots(problem, static: np.ndarray, slots: int) -> np.ndarray:
    """Water-fill `slots` LRU slots over layers by marginal bytes saved per slot."""
    cur = problem.curves
    L, E = cur.pop.shape
    out = np.zeros(L, dtype=np.int64)
    if slots <= 0:
        return out
    pb = np.concatenate([np.zeros((L, 1)), np.cumsum(cur.pop * problem.rank_bytes, axis=1)], axis=1)
    seg_layer, seg_from, seg_len, seg_gain = [], [], [], []
    for l in range(L):
        s = int(static[l])
        room = E - s
        if room <= 0:
            continue
        rest = 1.0 - cur.cum[l, s]
        miss_bytes = (pb[l, E] - pb[l, s]) / rest if rest > 1e-12 else 0.0   # mean bytes of a non-static access
        grid = [c for c in CACHE_GRID if c < room] + [room]
        hits = [cur.cache_hit(l, s, c) for c in grid]
        best = np.inf
        for a, b, ha, hb in zip(grid, grid[1:], hits, hits[1:]):
            best = min(best, max(hb - ha, 0.0) / (b - a) * miss_bytes)    # running minimum: concave
            seg_layer.append(l)
            seg_from.append(a)
            seg_len.append(b - a)
            seg_gain.append(best)
    if not seg_layer:
        return out
    seg_gain_a = np.array(seg_gain)
    order = np.lexsort((np.array(seg_from), np.array(seg_layer), -seg_gain_a))
    left = slots
    for i in order:
        if left <= 0 or seg_gain_a[i] <= 0:
            break
        take = min(seg_len[i], left)
        out[seg_layer[i]] += take
        left -= take
    return out


def allocate(problem, knobs: Knobs) -> Allocation:
    """Turn knobs into a placement that fills VRAM and pinned RAM; the footprint may still overflow VRAM or
    RAM when the resident dense weights alone are too large (the search's constraints catch that)."""
    spec, budget, cur = problem.spec, problem.budget, problem.curves
    L, E = cur.pop.shape
    depth = int(knobs.prefetch_depth)
    resident = dense_choice(problem, knobs.dense_share)
    empty = Placement((0,) * L, (0,) * L, (0,) * L, resident, depth)
    base = footprint(problem, empty)                      # everything fixed, all experts on NVMe
    expert_vram = budget.vram - (base.vram - base.static_experts - base.cache_slots)
    n_slots = int(max(expert_vram, 0) * min(max(knobs.cache_share, 0.0), 1.0) // problem.slot_bytes)
    static_budget = max(expert_vram, 0) - n_slots * problem.slot_bytes
    host_staging = staging_slots(spec, depth) * problem.slot_bytes
    ram_budget = budget.ram - base.embeddings - base.dense_streamed - host_staging

    layer, rank = _rank_order(cur, float(knobs.skew_weight))
    vram, n_v = _fill(layer, rank, problem.rank_bytes, 0, static_budget, L)
    ram, _ = _fill(layer, rank, problem.rank_bytes, n_v, ram_budget, L)
    cache = _cache_slots(problem, vram, n_slots)
    p = Placement(tuple(int(x) for x in vram), tuple(int(x) for x in ram), tuple(int(x) for x in cache), resident, depth)
    return Allocation(p, footprint(problem, p))


def greedy_knobs(problem) -> Knobs:
    """The greedy popularity baseline: as many dense units resident as fit, the same number of hot experts in
    every layer, no dynamic cache, one layer of lookahead when the statistics describe it."""
    depth = min(1, problem.curves.max_depth)
    L, n = problem.curves.n_layers, len(problem.dense_units)
    for k in range(n, -1, -1):
        empty = Placement((0,) * L, (0,) * L, (0,) * L, dense_choice(problem, k / n), depth)
        vram_over, ram_over, _ = footprint(problem, empty).overflow(problem.budget)
        if vram_over <= 0 and ram_over <= 0:
            return Knobs(k / n, 0.0, 0.0, depth)
    return Knobs(0.0, 0.0, 0.0, depth)
