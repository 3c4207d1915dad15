"""Routing statistics as per-layer arrays in popularity-rank space, built once per plan search.

Rank r of MoE layer l is that layer's r-th most used expert. The allocator and the cost model read
popularity, cumulative hit curves and lookahead quality from here as numpy arrays; the LRU hit rate of a
(static set, cache) pair stays a call to `RoutingStats.cache_hit` (memoised), so the statistics package
remains the one place that defines it. This module knows nothing about hardware, bytes or formats.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from strata_plan.core.lookahead import MAX_DEPTH


@dataclass(frozen=True, eq=False)
class RankCurves:
    """Read-only view of a `RoutingStats` in rank space. `stats` is the routing package's object."""

    stats: object
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def n_layers(self) -> int:
        return len(self.stats.layers)

    @property
    def n_experts(self) -> int:
        return int(self.stats.n_experts)

    @property
    def top_k(self) -> int:
        return int(self.stats.top_k)

    @cached_property
    def order(self) -> np.ndarray:
        """[L, E] expert id at each rank (most used first)."""
        return np.array([list(layer.order) for layer in self.stats.layers], dtype=np.int64)

    @cached_property
    def pop(self) -> np.ndarray:
        """[L, E] share of the layer's expert slots taken by each rank; rows sum to 1, non-increasing."""
        raw = np.array([list(layer.popularity) for layer in self.stats.layers], dtype=np.float64)
        return np.take_along_axis(raw, self.order, axis=1)

    @cached_property
    def cum(self) -> np.ndarray:
        """[L, E+1] share of accesses served by the top-s ranks (static hit rate of s resident experts)."""
        c = np.zeros((self.n_layers, self.n_experts + 1))
        np.cumsum(self.pop, axis=1, out=c[:, 1:])
        return c

    def cache_hit(self, layer: int, static: int, cache: int) -> float:
        """Total hit rate of `static` resident experts plus an LRU cache of `cache` slots (memoised)."""
        key = (id(self.stats.layers[layer]), static, cache)    # a prior's layers share one object
        v = self._memo.get(key)
        if v is None:
            v = float(self.stats.cache_hit(layer, static, cache)) if cache > 0 else float(self.cum[layer, static])
            self._memo[key] = v
        return v

    def hits(self, static: np.ndarray, cache: np.ndarray) -> np.ndarray:
        """[L] total hit rate per layer for per-layer static counts and cache slots."""
        return np.array([self.cache_hit(l, int(s), int(c)) for l, (s, c) in enumerate(zip(static, cache))])

    def lookahead(self, depth: int) -> tuple[float, float]:
        """(recall, precision) of router lookahead `depth` layers ahead; depth 0 predicts nothing."""
        if depth <= 0:
            return 0.0, 1.0
        la = self.stats.lookahead_at(depth)
        return float(la.recall), max(float(la.precision), 1e-6)

    @property
    def max_depth(self) -> int:
        depths = [int(la.depth) for la in getattr(self.stats, "lookahead", ())]
        return min(MAX_DEPTH, max(depths, default=0))
