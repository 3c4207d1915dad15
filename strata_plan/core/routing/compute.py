"""Routing statistics of a trace: popularity, static and LRU hit rates, reuse and lookahead, per layer.

Vectorized with numpy (stack distances for the LRU grid, see lru.py); `reference.py` simulates the same
quantities the slow way and the tests hold the two equal.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from strata_plan.core.lookahead import MAX_DEPTH

from .lru import hit_counts, hit_grid, stack_distances
from .stats import SCHEMA_NAME, SCHEMA_VERSION, LayerStats, LookaheadStats, RoutingStats, default_lookahead
from .trace import Trace


def size_grid(n_experts: int, top_k: int = 1) -> tuple[int, ...]:
    """Static-set and cache sizes the LRU grid is computed at: every size up to 24 experts, beyond that
    roughly geometric (1, 2, 3, 4, 6, 8, 12, 16, ...) plus k and E, so interpolation stays close."""
    if n_experts <= 24:
        return tuple(range(n_experts + 1))
    sizes = {0, n_experts, min(top_k, n_experts)}
    v = 1
    while v < n_experts:
        sizes.update((v, min(n_experts, v + v // 2)))
        v *= 2
    return tuple(sorted(sizes))


def layer_stats(experts: np.ndarray, sequence: np.ndarray, n_experts: int, first: int = 0,
                static_sizes: Sequence[int] | None = None, cache_sizes: Sequence[int] | None = None,
                ranking: Sequence[int] | None = None) -> LayerStats:
    """Statistics of one layer's experts int [T, k]; tokens before `first` only warm the cache up. `ranking`:
    expert ids in the order static sets take them (default: most used here first)."""
    k = experts.shape[1]
    counted = experts[first:]
    counts = np.bincount(counted.ravel(), minlength=n_experts)
    n = int(counts.sum())
    if ranking is None:
        order = np.lexsort((np.arange(n_experts), -counts))      # most used first, ties by id
    else:
        order = np.asarray(ranking, dtype=np.int64)
    rank = np.empty(n_experts, dtype=np.int64)
    rank[order] = np.arange(n_experts)
    static_hit = np.concatenate([[0], np.cumsum(counts[order])]) / n
    S = np.asarray(static_sizes if static_sizes is not None else size_grid(n_experts, k))
    C = np.asarray(cache_sizes if cache_sizes is not None else size_grid(n_experts, k))
    grid = hit_grid(stack_distances(experts, rank, S, first), C)
    return _layer(counts / n, static_hit, prev_reuse(experts, sequence, first), S, C, grid, n,
                  None if ranking is None else tuple(int(e) for e in order))


def _layer(pop: np.ndarray, static_hit: np.ndarray, reuse: float, S: np.ndarray, C: np.ndarray, grid: np.ndarray,
           n: int, ranking: tuple[int, ...] | None = None) -> LayerStats:
    return LayerStats(popularity=tuple(pop.tolist()), static_hit=tuple(static_hit.tolist()), prev_reuse=reuse,
                      lru_static=tuple(int(s) for s in S), lru_cache=tuple(int(c) for c in C),
                      lru_hit=tuple(tuple(r) for r in grid.tolist()), accesses=n, ranking=ranking)


def pooled_layer_stats(experts: np.ndarray, sequence: np.ndarray, n_experts: int, first: int,
                       uniform: bool = False) -> LayerStats:
    """One LayerStats from chains that share a distribution (a prior's layers: experts int [T, L, k],
    expert id = popularity rank). Pooling keeps the noise of a sampled prior low: popularity is the
    pooled share per id made non-increasing (exactly 1/E when `uniform`); static hit rates follow from it;
    an LRU's share of the non-static accesses is pooled over chains and added on top."""
    _, L, k = experts.shape
    E = n_experts
    if uniform:
        pop = np.full(E, 1.0 / E)
    else:
        pop = non_increasing(np.bincount(experts[first:].ravel(), minlength=E) / (experts[first:].size))
    static_hit = np.concatenate([[0.0], np.cumsum(pop)])
    static_hit[-1] = 1.0
    S, C = np.asarray(size_grid(E, k)), np.asarray(size_grid(E, k))
    rank = np.arange(E)
    static = np.zeros(len(S), dtype=np.int64)
    lru = np.zeros((len(S), len(C)), dtype=np.int64)
    n = 0
    for l in range(L):
        st, lr, nl = hit_counts(stack_distances(experts[:, l, :], rank, S, first), C)
        static, lru, n = static + st, lru + lr, n + nl
    dyn = np.divide(lru, (n - static)[:, None], out=np.zeros(lru.shape), where=(n - static)[:, None] > 0)
    grid = static_hit[S][:, None] + (1 - static_hit[S][:, None]) * dyn     # [S, C]
    grid = np.minimum(np.maximum.accumulate(grid, axis=0), 1.0)           # sampling noise must not break monotonicity
    return _layer(pop, static_hit, prev_reuse(experts, sequence, first), S, C, grid, n)


def non_increasing(y: np.ndarray) -> np.ndarray:
    """Least-squares non-increasing fit (pool adjacent violators): shares by rank without sorting noise."""
    vals: list[float] = []
    counts: list[int] = []
    for v in y.tolist():
        vals.append(v)
        counts.append(1)
        while len(vals) > 1 and vals[-2] < vals[-1]:
            c = counts[-2] + counts[-1]
            vals[-2:] = [(vals[-2] * counts[-2] + vals[-1] * counts[-1]) / c]
            counts[-2:] = [c]
    out = np.repeat(vals, counts)
    return out / out.sum()


def prev_reuse(experts: np.ndarray, sequence: np.ndarray, first: int = 0) -> float:
    """Share of the slots of tokens `first`.. whose expert the previous token of its sequence also used.
    experts: int [T, k], or [T, L, k] to pool layers."""
    t0 = max(first, 1)
    same = sequence[t0:] == sequence[t0 - 1:-1]                  # [T'] has a predecessor in its sequence
    if not same.any():
        return 0.0
    cur, before = experts[t0:][same], experts[t0 - 1:-1][same]   # [N, ..., k]
    reused = (cur[..., :, None] == before[..., None, :]).any(axis=-1)
    return float(reused.sum() / reused.size)


def lookahead_stats(trace: Trace, fallback: Sequence[LookaheadStats]) -> tuple[LookaheadStats, ...]:
    """Depths measured from the trace's lookahead arrays; the others from `fallback` (a prior)."""
    out = []
    for d in range(1, MAX_DEPTH + 1):
        if d > trace.depth or d >= trace.n_layers:
            out.append(fallback[d - 1])
            continue
        guess = trace.lookahead_experts[:, : trace.n_layers - d, d - 1, :]   # [T, L-d, k]
        truth = trace.experts[:, d:, :]                                      # [T, L-d, k]
        right = int(((guess[..., :, None] == truth[..., None, :]) & (guess[..., :, None] >= 0)).any(axis=3).sum())
        guessed, actual = int((guess >= 0).sum()), truth.size
        out.append(LookaheadStats(depth=d, precision=right / guessed if guessed else 0.0, recall=right / actual,
                                  provenance="trace", source=f"measured: lookahead_experts of {trace.source or 'the trace'}",
                                  pairs=guess.shape[0] * guess.shape[1]))
    return tuple(out)


def compute_stats(trace: Trace, *, warmup: int = 0, lookahead_prior: Sequence[LookaheadStats] | None = None,
                  kind: str = "trace", source: str | None = None, source_sha256: str | None = None,
                  static_sizes: Sequence[int] | None = None, cache_sizes: Sequence[int] | None = None,
                  rankings: Sequence[Sequence[int]] | None = None) -> RoutingStats:
    """Statistics of every MoE layer of `trace`. The first `warmup` tokens set the caches' state but are
    not counted (0 for a real trace: its cold misses are real). Lookahead depths the trace does not
    record come from `lookahead_prior` (default: the documented prior, `stats.LOOKAHEAD_PRIOR`).
    `rankings` (one per layer): the experts ranked as other statistics rank them (a plan's tiers list its ids
    most used first), so that a placement made from those is judged on this trace; default: this trace's own."""
    if not 0 <= warmup < trace.n_tokens:
        raise ValueError(f"warmup {warmup} must leave tokens to count (trace has {trace.n_tokens})")
    if rankings is not None and (len(rankings) != trace.n_layers or any(
            sorted(r) != list(range(trace.n_experts)) for r in rankings)):
        raise ValueError(f"rankings: one per MoE layer ({trace.n_layers}), each every expert id "
                         f"0..{trace.n_experts - 1} once")
    if lookahead_prior is None:
        lookahead_prior = default_lookahead()
    layers = tuple(layer_stats(trace.experts[:, i, :], trace.sequence, trace.n_experts, warmup, static_sizes,
                               cache_sizes, None if rankings is None else rankings[i])
                   for i in range(trace.n_layers))
    return RoutingStats(schema=SCHEMA_NAME, version=SCHEMA_VERSION, model=trace.model, n_experts=trace.n_experts,
                        top_k=trace.top_k, source=source if source is not None else trace.source,
                        source_sha256=source_sha256 or trace.sha256, kind=kind, layers=layers,
                        lookahead=lookahead_stats(trace, lookahead_prior), tokens=trace.n_tokens - warmup,
                        phase=trace.phase)
