"""The device loop's pinned staging cache in the cost model: how many NVMe misses it keeps.

    miss = staging_miss(stats, placement, cold_w, slots, in_flight)   # [L, E] chance an NVMe miss of rank r is read

The cache is one LRU over every layer's NVMe misses. Che's approximation (independent references) gives each
layer's share of its slots: rank r of layer j, missed cold_w[j, r] times a token, is staged with probability
1 - exp(-cold_w T), T such that the staged experts fill the slots the reads in flight leave. A layer that asks again
for experts it asked for a few tokens ago (temporal locality) keeps more of them than independent references would:
the statistics' own LRU curve over its NVMe accesses, its RAM ranks counted static (`cache_hit(s + m, x) -
static_hit(s + m)`), at x = its share of the staging slots plus the device LRU's slots that hold NVMe experts, says
how many the two caches keep together. Where that curve keeps more than Che's, the layer's misses are scaled to it.
The bound (`bound._staged_floor`) reads the same curve on its own, with every staging slot for each layer.

Both count a kept expert as kept until its next request, but a layer's experts are asked for once a token, at that
layer: between two requests of layer j the stager reads the misses of every layer of one token, and when those number
`free` or more the expert is evicted first. So each kept share is scaled by the chance that a token's misses, a
Poisson count of the model's own mean M a token, stay below `free` (a fixed point: fewer kept, more misses). Where
the slots hold many tokens' misses that chance is 1; where they hold less than a token's, nothing is kept.
Measured (H100, kimi5 seed budget, engine-20261206T054405Z.json): 0.2361 / 0.2365 GB a token read in plan /
on-demand mode; Che alone predicts 0.2497 / 0.2916, this 0.2340 / 0.2418 (about 9 misses a token against 72 free
slots: unchanged by the token's survival). The trained model's seed budget (engine-trained-20261206T113306Z.json, 38.4
NVMe accesses a token against 23 free slots): an LRU over the rows' own routing read 37.9 a token (4.66 MB), 37.7
were measured; without the token's survival this predicted 4.19 MB on that routing, with it 4.73.
"""
from __future__ import annotations

import math

import numpy as np


def che_time(lam: np.ndarray, free: float) -> float:
    """T with sum(1 - exp(-lam T)) = free over the positive rates `lam` (fewer than `free` of them: inf)."""
    nz = lam[lam > 0]
    if nz.size <= free:
        return float("inf")
    T = 0.0
    for _ in range(100):          # f(T) = sum(1 - e^{-lam T}) - free: concave, rising; Newton from below
        e = np.exp(-nz * T)
        f = float(np.sum(1.0 - e)) - free
        if f >= -1e-9 * free:
            break
        T -= f / float(np.sum(nz * e))
    return T


def nvme_cache_slots(stats, j: int, s: int, m: int, c: int) -> float:
    """Of layer j's c device LRU slots, those holding NVMe experts: c times the NVMe ranks' share of the non-static
    accesses."""
    rest = 1.0 - stats.static_hit(j, s)
    return c * (1.0 - stats.static_hit(j, s + m)) / rest if rest > 1e-12 else 0.0


def kept_by_curve(stats, j: int, s: int, m: int, c: int, staged: float) -> float:
    """Share of layer j's accesses to its NVMe ranks that its device LRU and `staged` staging slots keep together,
    by the statistics' LRU curve over those accesses."""
    base = stats.static_hit(j, s + m)
    nv = 1.0 - base
    if nv <= 1e-12:
        return 1.0
    return max(0.0, stats.cache_hit(j, s + m, staged + nvme_cache_slots(stats, j, s, m, c)) - base) / nv


def staging_miss(stats, placement, cold_w: np.ndarray, slots: int, in_flight: int) -> np.ndarray:
    """[L, E] the chance an NVMe miss of each rank (cold_w[j, r] a token, after the device LRU) is not in the staging
    cache, so the stager reads it (the module docstring)."""
    free = slots - in_flight
    if free <= 0 or not (cold_w > 0).any():
        return np.ones_like(cold_w)
    T = che_time(cold_w, free)
    if T == float("inf"):                                 # every NVMe expert ever missed fits: read once
        return np.zeros_like(cold_w)
    return _kept_for_the_next_token(cold_w, _with_curves(stats, placement, cold_w, np.exp(-cold_w * T)), free)


def _with_curves(stats, placement, cold_w: np.ndarray, miss: np.ndarray) -> np.ndarray:
    """Che's misses, scaled down to a layer's own LRU curve where its locality keeps more (the module docstring)."""
    k = stats.top_k
    s, m, c = placement.vram, placement.ram, placement.cache
    for j in range(cold_w.shape[0]):
        che = float((cold_w[j] * miss[j]).sum())
        if che <= 0:
            continue
        held = float(((1.0 - miss[j]) * (cold_w[j] > 0)).sum())
        nv = 1.0 - stats.static_hit(j, s[j] + m[j])
        curve = k * nv * (1.0 - kept_by_curve(stats, j, s[j], m[j], c[j], held))
        if curve < che:
            miss[j] *= curve / che
    return miss


def poisson_below(mean: float, n: float) -> float:
    """P(N < n), N a Poisson count of `mean` (n taken down to a whole count)."""
    k = int(math.floor(n))
    if k <= 0:
        return 0.0
    if mean <= 0:
        return 1.0
    term = math.exp(-mean)
    if term == 0.0:                                      # exp underflows past a mean of ~745: the normal's tail
        return 0.5 * math.erfc((mean - (k - 0.5)) / math.sqrt(2.0 * mean))
    total = term
    for i in range(1, k):
        term *= mean / i
        total += term
    return min(1.0, total)


def _kept_for_the_next_token(cold_w: np.ndarray, miss: np.ndarray, free: float) -> np.ndarray:
    """Each kept share times the chance that one token's misses (a Poisson count of mean M, the misses this gives)
    stay below `free`: the fixed point, iterated from the misses without it (they only rise; module docstring)."""
    kept = 1.0 - miss
    out = miss
    for _ in range(100):
        new = 1.0 - kept * poisson_below(float((cold_w * out).sum()), free)
        if np.max(np.abs(new - out)) < 1e-9:
            return new
        out = new
    return out

