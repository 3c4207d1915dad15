"""Placements and the allocator that builds them from a handful of global knobs.

A placement says, per MoE layer, how many experts (by popularity rank) are static in VRAM, how many sit in
pinned RAM and how many LRU cache slots the layer gets; the rest are on NVMe. It also says which dense
units (each decoder layer's non-routed weights, and the lm_head) stay in VRAM and how deep router
lookahead prefetches.

The search does not choose 92 x 3 counts directly. It chooses four knobs, and `allocate` water-fills:
  * dense_share    -> the smallest dense units first stay resident (every unit is read once per token,
                      so only their total matters for decode; small first gives the knob fine steps);
  * VRAM left for experts is water-filled jointly over static experts and LRU cache slots of every layer:
    the move saving the most transfer bytes per VRAM byte goes first (`_vram_fill`); the hit-rate curves
    are concave, so this is the marginal-gain optimum of the linear part of the cost;
  * cache_bias     -> scales the cache moves' gains (0 = no cache) where the cost's non-linear parts
                      (stalls, link sharing) favour or disfavour caching;
  * skew_weight w  -> tempers static gains to gain^w x (1/E)^(1-w): w = 0 gives every layer the same count
                      (the greedy baseline); w = 1 follows measured popularity, which matters when layers
                      differ in skew. Pinned RAM then takes, per layer from its static count on, the experts
                      with the highest key w * E * pop[l, r] + (1 - w) * (1 - r / E) until its bytes run out;
  * prefetch_depth -> lookahead depth (staging slots grow with it);
  * staging_share  -> (one GPU, with experts left on NVMe) the share of the pinned RAM left
                      after dense weights that the NVMe staging cache takes instead of RAM experts (engine/staging.py:
                      a bigger cache reads the drive less, a bigger RAM tier leaves less on it).
Keys fall strictly with rank inside a layer, so each tier is a contiguous rank range of every layer.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from strata_plan.core.lookahead import pinned_staging_slots, staging_slots
from strata_plan.planner.capacity import Footprint, workspace_bytes

CACHE_GRID = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


@dataclass(frozen=True)
class Knobs:
    """The global choices the search makes (see the module docstring)."""

    dense_share: float
    cache_bias: float
    skew_weight: float
    prefetch_depth: int
    gpu_split: float | None = None    # several GPUs: the share of decoder layers on the first (split_points)
    staging_share: float | None = None   # one GPU: the share of pinned RAM for the NVMe staging cache

    def as_params(self) -> dict:
        out = {"dense_share": self.dense_share, "cache_bias": self.cache_bias,
               "skew_weight": self.skew_weight, "prefetch_depth": self.prefetch_depth}
        if self.gpu_split is not None:
            out["gpu_split"] = self.gpu_split
        if self.staging_share is not None:
            out["staging_share"] = self.staging_share
        return out


def split_points(n_layers: int, n_gpus: int, share: float | None) -> tuple[int, ...]:
    """Pipeline split of `n_layers` decoder layers over `n_gpus` GPUs: the first takes round(share x n_layers)
    layers, the others the rest in equal parts; the decoder index where each next GPU begins. () (everything
    on the first GPU) for one GPU, no share, or a first share that leaves the others nothing or takes nothing."""
    if n_gpus < 2 or share is None:
        return ()
    first = int(round(min(max(share, 0.0), 1.0) * n_layers))
    if first <= 0 or first >= n_layers:
        return ()
    rest = n_layers - first
    return tuple(first + (rest * g) // (n_gpus - 1) for g in range(n_gpus - 1))


CACHE_BIAS_MAX = 0.95


def cache_weight(bias: float) -> float:
    """The multiplier on cache gains for a cache_bias knob in [0, CACHE_BIAS_MAX]: odds bias / (1 - bias),
    so 0 turns the cache off, 0.5 weighs it as the marginal-gain argument says, 0.95 favours it 19x."""
    b = min(max(bias, 0.0), CACHE_BIAS_MAX)
    return b / (1.0 - b)


@dataclass(frozen=True)
class Placement:
    """Where every expert and dense unit lives, by counts in popularity-rank space."""

    vram: tuple[int, ...]             # per MoE layer: ranks [0, vram) static in VRAM
    ram: tuple[int, ...]              # per MoE layer: ranks [vram, vram + ram) in pinned RAM
    cache: tuple[int, ...]            # per MoE layer: LRU cache slots over the non-static experts
    dense_resident: tuple[bool, ...]  # per dense unit (decoder layers in order, then the lm_head)
    prefetch_depth: int
    gpu_split: tuple[int, ...] = ()   # several GPUs: decoder index where each next GPU's layers begin; () one GPU
    remote: tuple[int, ...] = ()      # several GPUs: per MoE layer, how many of its static experts (the least
                                      # used of them, ranks [vram - remote, vram)) the partner GPU holds and runs
    staging: int = 0                  # one GPU, NVMe tier: slots of the pinned staging cache (0: the least the
                                      # engine takes, engine.staging.stage_slots)

    def __post_init__(self) -> None:
        if not (len(self.vram) == len(self.ram) == len(self.cache)):
            raise ValueError("vram, ram and cache need one count per MoE layer")
        if min(self.vram + self.ram + self.cache, default=0) < 0 or self.prefetch_depth < 0:
            raise ValueError("counts must be >= 0")
        if list(self.gpu_split) != sorted(self.gpu_split) or min(self.gpu_split, default=1) < 1:
            raise ValueError("gpu_split must be increasing decoder indices >= 1")
        if self.remote and (len(self.remote) != len(self.vram)
                            or any(not 0 <= r <= v for r, v in zip(self.remote, self.vram))):
            raise ValueError("remote needs one count per MoE layer, each between 0 and the layer's static count")

    @property
    def several(self) -> bool:
        """Uses more than one GPU: a pipeline split, or static experts held by a partner GPU."""
        return bool(self.gpu_split) or any(self.remote)

    @property
    def remote_counts(self) -> np.ndarray:
        return np.array(self.remote or (0,) * len(self.vram), dtype=np.int64)

    def partner(self, g: int, n_gpus: int) -> int:
        """The GPU that holds the remote experts of GPU g's layers: the next one (the last GPU's: the one before)."""
        return g + 1 if g + 1 < n_gpus else max(g - 1, 0)

    def unit_gpus(self) -> np.ndarray:
        """[n dense units] the GPU of each dense unit (decoder layers, then the lm_head with the last layer):
        GPU g holds decoder layers [gpu_split[g-1], gpu_split[g])."""
        n = len(self.dense_resident)
        idx = np.arange(n)
        idx[-1] = n - 2                       # the head goes with the last decoder layer
        return np.searchsorted(np.array(self.gpu_split, dtype=np.int64), idx, side="right")

    def moe_gpus(self, moe_layers) -> np.ndarray:
        """[MoE layers] the GPU of each MoE layer (its decoder layer's)."""
        return self.unit_gpus()[np.asarray(moe_layers, dtype=np.int64)]

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
    """Bytes per tier of placement `p` (see capacity.Footprint). Several GPUs: each GPU used holds the runtime
    reserve, a prefill workspace and its own staging slots, the KV cache, dense weights (resident, or a double
    buffer when streamed), static experts and cache slots of its own layers; the sums are the fields,
    `per_gpu_vram` each GPU's."""
    spec, units, rb = problem.spec, problem.dense_units, problem.rank_bytes
    cum = np.concatenate([[0.0], np.cumsum(rb)])
    v, r, c = p.arrays
    streamed = [b for b, res in zip(units, p.dense_resident) if not res]
    slots = staging_slots(spec.top_k, p.prefetch_depth) * problem.slot_bytes
    nvme_experts = float(np.sum(cum[-1] - cum[v + r]))
    host = slots                    # pinned bounce buffers for NVMe reads, and on one GPU the staging cache
    if staged(problem, p.gpu_split):
        host += pinned_staging_slots(spec.top_k, p.prefetch_depth, p.staging) * problem.slot_bytes
    one = Footprint(
        reserve=problem.budget.reserve, kv_cache=spec.kv_cache_bytes(problem.context),
        workspace=workspace_bytes(spec, problem.prefill_chunk), staging=slots,
        dense_buffers=2 * max(streamed, default=0), dense_resident=sum(b for b, res in zip(units, p.dense_resident) if res),
        static_experts=int(np.sum(cum[v])), cache_slots=int(np.sum(c)) * problem.slot_bytes,
        embeddings=spec.embedding_bytes, dense_streamed=sum(streamed), ram_experts=int(np.sum(cum[v + r] - cum[v])),
        host_staging=host if nvme_experts > 0 else 0, nvme_experts=int(nvme_experts))
    if problem.n_gpus == 1:
        return one
    ug, mg = p.unit_gpus(), p.moe_gpus(spec.moe_layers)
    rem = p.remote_counts
    host_of = np.array([p.partner(int(g), problem.n_gpus) for g in mg], dtype=np.int64)
    remote_bytes = cum[v] - cum[v - rem]                                   # [L] static bytes a partner holds
    parts = []
    for g in range(problem.n_gpus):
        mine = [i for i in range(len(units)) if ug[i] == g]
        hosted = int(np.sum(remote_bytes[(host_of == g) & (rem > 0)]))
        if not mine and hosted:
            parts.append(dict(reserve=problem.budget.reserve, kv_cache=0, workspace=one.workspace, staging=0,
                              dense_buffers=0, dense_resident=0, static_experts=hosted, cache_slots=0))
            continue
        if not mine:
            parts.append(dict(reserve=0, kv_cache=0, workspace=0, staging=0, dense_buffers=0, dense_resident=0,
                              static_experts=0, cache_slots=0))
            continue
        moe = mg == g
        parts.append(dict(
            reserve=problem.budget.reserve, workspace=one.workspace, staging=slots if moe.any() else 0,
            kv_cache=sum(problem.layer_kv_bytes[i] for i in mine if i < spec.n_layers),
            dense_buffers=2 * max((units[i] for i in mine if not p.dense_resident[i]), default=0),
            dense_resident=sum(units[i] for i in mine if p.dense_resident[i]),
            static_experts=int(np.sum((cum[v] - remote_bytes)[moe])) + hosted,
            cache_slots=int(np.sum(c[moe])) * problem.slot_bytes))
    sums = {k: sum(d[k] for d in parts) for k in parts[0]}
    return dataclasses.replace(one, **sums, per_gpu=tuple(parts))


def dense_choice(problem, share: float, gpu_split: tuple[int, ...] = ()) -> tuple[bool, ...]:
    """The `share` (by count) of dense units that stay resident: the smallest first, ties by position; with a
    pipeline split, that share of each GPU's own units."""
    units = problem.dense_units
    groups = [range(len(units))]
    if gpu_split:
        ug = Placement((), (), (), (False,) * len(units), 0, gpu_split).unit_gpus()
        groups = [[i for i in range(len(units)) if ug[i] == g] for g in range(int(ug.max()) + 1)]
    keep: set[int] = set()
    for grp in groups:
        n = int(round(min(max(share, 0.0), 1.0) * len(grp)))
        keep |= set(sorted(grp, key=lambda i: (units[i], i))[:n])
    return tuple(i in keep for i in range(len(units)))


def _rank_order(curves, skew_weight: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(layer, rank) of every expert, best key first, and the [L, E] key matrix."""
    L, E = curves.pop.shape
    ranks = np.broadcast_to(np.arange(E), (L, E))
    key = skew_weight * E * curves.pop + (1.0 - skew_weight) * (1.0 - ranks / E)
    layers = np.broadcast_to(np.arange(L)[:, None], (L, E))
    order = np.lexsort((layers.ravel(), ranks.ravel(), -key.ravel()))
    return layers.ravel()[order], ranks.ravel()[order], key


def _fill(order: tuple[np.ndarray, np.ndarray, np.ndarray], rank_bytes: np.ndarray, start: np.ndarray,
          budget: float) -> np.ndarray:
    """Per-layer counts after taking, in key order, the experts ranked at or after `start` [L] whose bytes
    fit in `budget`: the longest fitting run first, then the leftover bytes go to whichever layer's next
    expert has the best key and still fits (smaller formats can use what a large expert left)."""
    layer, rank, key = order
    L, E = key.shape
    mask = rank >= start[layer]
    lay, rk = layer[mask], rank[mask]
    cum = np.cumsum(rank_bytes[rk])
    n = int(np.searchsorted(cum, max(budget, 0.0), side="right"))
    counts = start + np.bincount(lay[:n], minlength=L)
    left = max(budget, 0.0) - (cum[n - 1] if n else 0.0)
    while True:
        nxt = np.minimum(counts, E - 1)
        fits = (counts < E) & (rank_bytes[nxt] <= left)
        if not fits.any():
            return counts
        l = int(np.argmax(np.where(fits, key[np.arange(L), nxt], -np.inf)))
        left -= rank_bytes[counts[l]]
        counts[l] += 1


def _vram_fill(problem, budget: float, skew_weight: float, cache_weight: float,
               layers: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Static experts and LRU cache slots per layer for `budget` bytes of VRAM, by joint water-filling.

    Each layer offers two moves: one more static expert (costs its bytes; gains the hit rate it adds, in
    the cache's presence) and cache slots up to the next grid size (cost slots x slot bytes; gains the hit
    rate they add times the mean bytes of a non-static access, per byte). The move with the most transfer
    bytes saved per VRAM byte goes first, until nothing fits. Static gains are tempered to
    gain^w x (1/E)^(1-w): w = 0 makes every static move equal, so layers fill round-robin (equal counts);
    cache gains are scaled by `cache_weight` (0: no cache)."""
    import heapq
    cur, rb, slot = problem.curves, problem.rank_bytes, float(problem.slot_bytes)
    L, E = cur.pop.shape
    pb = np.concatenate([np.zeros((L, 1)), np.cumsum(cur.pop * rb, axis=1)], axis=1)
    s, c = np.zeros(L, dtype=np.int64), np.zeros(L, dtype=np.int64)
    version = [0] * L
    heap: list = []

    def push(l: int) -> None:
        sl, cl, h = int(s[l]), int(c[l]), cur.cache_hit(l, int(s[l]), int(c[l]))
        if sl + cl < E:
            g = max(cur.cache_hit(l, sl + 1, cl) - h, 0.0)
            v = g ** skew_weight * (1.0 / E) ** (1.0 - skew_weight) if g > 0 else 0.0
            heapq.heappush(heap, (-v, sl, l, version[l], "static", 1, float(rb[sl])))
        if cache_weight > 0 and sl + cl < E:
            nxt = min(next((g for g in CACHE_GRID if g > cl), E), E - sl)
            rest = 1.0 - cur.cum[l, sl]
            mean = (pb[l, E] - pb[l, sl]) / rest if rest > 1e-12 else 0.0
            g = max(cur.cache_hit(l, sl, nxt) - h, 0.0)
            v = cache_weight * g * mean / ((nxt - cl) * slot)
            heapq.heappush(heap, (-v, sl, l, version[l], "cache", nxt - cl, (nxt - cl) * slot))

    for l in (range(L) if layers is None else np.flatnonzero(layers)):     # layers: [L] mask of one GPU's
        push(int(l))
    left = max(float(budget), 0.0)
    while heap:
        negv, _, l, ver, kind, n, cost = heapq.heappop(heap)
        if ver != version[l] or negv >= 0:
            continue
        if cost > left:
            if kind == "cache" and left >= slot:          # take what fits of this cache step
                n, cost = int(left // slot), int(left // slot) * slot
            else:
                continue
        left -= cost
        if kind == "static":
            s[l] += 1
        else:
            c[l] += n
        version[l] += 1
        push(l)
    return s, c


def allocate(problem, knobs: Knobs) -> Allocation:
    """Turn knobs into a placement that fills VRAM and pinned RAM; the footprint may still overflow VRAM or
    RAM when the resident dense weights alone are too large (the search's constraints catch that)."""
    spec, budget, cur = problem.spec, problem.budget, problem.curves
    L, E = cur.pop.shape
    depth = int(knobs.prefetch_depth)
    split = split_points(spec.n_layers, problem.n_gpus, knobs.gpu_split)
    resident = dense_choice(problem, knobs.dense_share, split)
    empty = Placement((0,) * L, (0,) * L, (0,) * L, resident, depth, split)
    base = footprint(problem, empty)                      # everything fixed, all experts on NVMe
    ram_budget = budget.ram - base.embeddings - base.dense_streamed
    if problem.n_gpus == 1:
        expert_vram = budget.vram - (base.vram - base.static_experts - base.cache_slots)
        vram, cache = _vram_fill(problem, expert_vram, float(knobs.skew_weight), cache_weight(knobs.cache_bias))
    else:                                                 # each GPU water-fills its own layers in its own budget
        vram, cache = np.zeros(L, dtype=np.int64), np.zeros(L, dtype=np.int64)
        mg = empty.moe_gpus(spec.moe_layers)
        for g, (have, used) in enumerate(zip(budget.gpus, base.per_gpu_vram)):
            if (mg == g).any():
                v, c = _vram_fill(problem, have - used, float(knobs.skew_weight), cache_weight(knobs.cache_bias), mg == g)
                vram, cache = vram + v, cache + c
    order = _rank_order(cur, float(knobs.skew_weight))
    ram = _fill(order, problem.rank_bytes, vram, ram_budget) - vram
    staging = 0
    if np.any(vram + ram < E):      # experts remain on NVMe: its bounce buffers (and staging cache) take pinned RAM
        if staged(problem, split):
            staging = pinned_staging_slots(spec.top_k, depth, int(max(0.0, knobs.staging_share or 0.0) * ram_budget
                                                                  // problem.slot_bytes))
        held = (staging_slots(spec.top_k, depth) + staging) * problem.slot_bytes
        ram = _fill(order, problem.rank_bytes, vram, ram_budget - held) - vram
    p = Placement(tuple(int(x) for x in vram), tuple(int(x) for x in ram), tuple(int(x) for x in cache), resident, depth,
                  split, staging=staging)
    return Allocation(p, footprint(problem, p))


def staged(problem, split: tuple[int, ...] = ()) -> bool:
    """Whether NVMe experts would be staged in pinned RAM (engine/staging.py): one GPU (the engine's device loop)."""
    return problem.n_gpus == 1 and not split


def greedy_knobs(problem) -> Knobs:
    """The greedy popularity baseline: as many dense units resident as fit, the same number of hot experts in
    every layer, no dynamic cache, one layer of lookahead when the statistics describe it (the problem's fixed
    depth when it has one)."""
    lo, hi = problem.depths
    depth = min(max(1, lo), hi)
    L, n = problem.curves.n_layers, len(problem.dense_units)
    share = 1.0 / problem.n_gpus if problem.n_gpus > 1 else None      # several GPUs: an even pipeline split
    split = split_points(problem.spec.n_layers, problem.n_gpus, share)
    for k in range(n, -1, -1):
        empty = Placement((0,) * L, (0,) * L, (0,) * L, dense_choice(problem, k / n, split), depth, split)
        vram_over, ram_over, _ = footprint(problem, empty).overflow(problem.budget)
        if vram_over <= 0 and ram_over <= 0:
            return Knobs(k / n, 0.0, 0.0, depth, share)
    return Knobs(0.0, 0.0, 0.0, depth, share)


def placement_of(plan) -> Placement:
    """A plan file (`core.plan.Plan`) in rank space: valid against the statistics it was made from, whose ids
    it lists most used first."""
    n_layers = max(plan.dense.resident_layers + plan.dense.streamed_layers, default=-1) + 1
    resident = set(plan.dense.resident_layers)
    return Placement(tuple(len(l.vram) for l in plan.layers), tuple(len(l.ram) for l in plan.layers),
                     tuple(l.cache_slots for l in plan.layers),
                     tuple(i in resident for i in range(n_layers)) + (plan.dense.lm_head == "vram",),
                     plan.prefetch_depth, plan.gpu_split,
                     tuple(len(l.remote or ()) for l in plan.layers) if any(l.remote for l in plan.layers) else (),
                     plan.staging.host_slots)
