"""The routing statistics file: what the planner knows about which experts tokens use.

Per MoE layer: expert popularity, the hit rate of a static resident set of every size, the hit rate of an
LRU cache on top of a static set (a grid over both sizes, exact at the grid points), and previous-token
reuse. Per lookahead depth 1..4: precision and recall of router-lookahead predictions. Written as
versioned YAML (schema `strata-plan/routing-stats`), parsed strictly; TRACE.md documents every field.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

from strata_plan.core.lookahead import MAX_DEPTH
from strata_plan.errors import UserError
from strata_plan.schema import bounded, check_schema, parse, to_data
from strata_plan.yamlio import atomic_write_yaml, read_yaml

SCHEMA_NAME = "strata-plan/routing-stats"
SCHEMA_VERSION = 1
TOL = 1e-4          # shares in a file are sums of rounded numbers; agree to this
ROUND = 7           # decimals of the shares written to a file


@dataclass(frozen=True)
class LookaheadStats:
    """How well MoE layer i's output, passed through layer i+depth's gate, predicts that layer's experts.
    precision = right guesses / guesses; recall = right guesses / experts used."""

    depth: int = bounded(1, MAX_DEPTH)
    precision: float = bounded(0.0, 1.0)
    recall: float = bounded(0.0, 1.0)
    provenance: Literal["trace", "prior"] = "prior"
    source: str = ""             # where the numbers come from
    pairs: int = bounded(0, None, default=0)   # (token, layer) pairs measured (trace only)



_DEPTH1 = ("Eliseev & Mazur 2023 (mixtral-offloading, arXiv 2312.17238): Mixtral-8x7B's next-layer gate applied "
           "to the current hidden state guesses that layer's experts with recall about 80-90% (secondary summaries, "
           "marked unverified in shared/reference/offload-systems.md); 0.85 is the midpoint. k guesses for k "
           "experts, so precision = recall.")
_DEEPER = ("assumption, no sourced figure: each further layer keeps 85% of the previous depth's recall "
           "(0.85^depth); record lookahead arrays in a trace to replace it")
LOOKAHEAD_PRIOR = (
    LookaheadStats(depth=1, precision=0.85, recall=0.85, provenance="prior", source=_DEPTH1),
    LookaheadStats(depth=2, precision=0.72, recall=0.72, provenance="prior", source=_DEEPER),
    LookaheadStats(depth=3, precision=0.61, recall=0.61, provenance="prior", source=_DEEPER),
    LookaheadStats(depth=4, precision=0.52, recall=0.52, provenance="prior", source=_DEEPER),
)


def default_lookahead() -> tuple[LookaheadStats, ...]:
    """Lookahead precision/recall used where a trace records no lookahead arrays (documented above)."""
    return LOOKAHEAD_PRIOR


@dataclass(frozen=True)
class LayerStats:
    """One MoE layer. `static_hit[s]`: share of accesses served by the s most popular experts (s = 0..E).
    `lru_hit[i][j]`: total hit rate of static set `lru_static[i]` plus an LRU cache of `lru_cache[j]`
    experts over the rest (see lru.py for the exact cache model). `ranking` (optional): the order the experts are
    ranked in when it is not this layer's own popularity, most used first: a placement made from other statistics
    judged on this routing (`compute_stats(..., rankings=...)`); static sets and `static_hit` then run in it."""

    popularity: tuple[float, ...]
    static_hit: tuple[float, ...]
    prev_reuse: float = bounded(0.0, 1.0)
    lru_static: tuple[int, ...]
    lru_cache: tuple[int, ...]
    lru_hit: tuple[tuple[float, ...], ...]
    accesses: int = bounded(0, None, default=0)    # expert accesses the shares were counted over
    ranking: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        E = len(self.popularity)
        if E == 0 or min(self.popularity) < 0 or abs(sum(self.popularity) - 1) > TOL:
            raise ValueError("popularity must list one non-negative share per expert, summing to 1")
        if len(self.static_hit) != E + 1 or abs(self.static_hit[0]) > TOL or abs(self.static_hit[-1] - 1) > TOL:
            raise ValueError(f"static_hit must have {E + 1} entries (sizes 0..{E}) from 0 to 1")
        if self.ranking is not None and sorted(self.ranking) != list(range(E)):
            raise ValueError(f"ranking must list every expert id 0..{E - 1} once")
        ranked = [self.popularity[e] for e in self.order]
        if any(abs(self.static_hit[s + 1] - self.static_hit[s] - ranked[s]) > TOL for s in range(E)):
            raise ValueError("static_hit must be the running sum of the popularity shares, most popular first "
                             "(or in `ranking`)")
        S, C = self.lru_static, self.lru_cache
        if not S or list(S) != sorted(set(S)) or S[0] != 0 or S[-1] != E or min(S) < 0:
            raise ValueError(f"lru_static must be increasing static-set sizes from 0 to {E}")
        if not C or list(C) != sorted(set(C)) or C[0] != 0 or C[-1] < E:
            raise ValueError(f"lru_cache must be increasing cache sizes from 0 to at least {E}")
        if len(self.lru_hit) != len(S) or any(len(row) != len(C) for row in self.lru_hit):
            raise ValueError(f"lru_hit must be a {len(S)} x {len(C)} grid (lru_static x lru_cache)")
        for i, row in enumerate(self.lru_hit):
            if abs(row[0] - self.static_hit[S[i]]) > TOL or any(b < a - TOL for a, b in zip(row, row[1:])) or row[-1] > 1 + TOL:
                raise ValueError("each lru_hit row starts at the static hit rate and does not fall with cache size")
            if i and any(b < a - TOL for a, b in zip(self.lru_hit[i - 1], row)):
                raise ValueError("lru_hit must not fall as the static set grows")

    @property
    def n_experts(self) -> int:
        return len(self.popularity)

    @cached_property
    def order(self) -> tuple[int, ...]:
        """Expert ids by rank: `ranking` where given, else most used first (ties: lower id first)."""
        if self.ranking is not None:
            return tuple(self.ranking)
        return tuple(sorted(range(self.n_experts), key=lambda e: (-self.popularity[e], e)))

    def static_at(self, s: float) -> float:
        """static_hit at a possibly fractional size (linear between whole sizes, clamped to 0..E)."""
        s = min(max(float(s), 0.0), float(self.n_experts))
        lo = int(math.floor(s))
        if lo == s:
            return self.static_hit[lo]
        return self.static_hit[lo] + (s - lo) * (self.static_hit[lo + 1] - self.static_hit[lo])

    def cache_at(self, s: float, c: float) -> float:
        """Static set s plus an LRU of c experts: bilinear in the grid, exact at grid points, never below
        the static hit rate; monotone non-decreasing in s and in c (the grid is, so the blend is)."""
        if c <= 0:
            return self.static_at(s)
        i, a = _cell(self.lru_static, s)
        j, b = _cell(self.lru_cache, c)
        g = self.lru_hit
        v = ((1 - a) * (1 - b) * g[i][j] + a * (1 - b) * g[i + 1][j]
             + (1 - a) * b * g[i][j + 1] + a * b * g[i + 1][j + 1])
        return min(1.0, max(v, self.static_at(s)))



def _cell(grid: tuple[int, ...], x: float) -> tuple[int, float]:
    """Index i and weight a with x = (1-a) grid[i] + a grid[i+1], clamped to the grid's ends (grids have
    at least two sizes: 0 and E)."""
    if x <= grid[0]:
        return 0, 0.0
    if x >= grid[-1]:
        return len(grid) - 2, 1.0
    i = bisect.bisect_right(grid, x) - 1
    return i, (x - grid[i]) / (grid[i + 1] - grid[i])


@dataclass(frozen=True)
class RoutingStats:
    """Routing statistics of one model from a trace (`kind: trace`) or a named prior (`kind: prior`)."""

    schema: str
    version: int
    model: str
    n_experts: int = bounded(1, None)
    top_k: int = bounded(1, None)
    source: str
    source_sha256: str
    kind: Literal["trace", "prior"]
    layers: tuple[LayerStats, ...]
    lookahead: tuple[LookaheadStats, ...]
    tokens: int = bounded(0, None, default=0)   # tokens the statistics were counted over
    phase: str = ""
    created: str = ""

    def __post_init__(self) -> None:
        check_schema(self, SCHEMA_NAME, SCHEMA_VERSION)
        if not self.layers:
            raise ValueError("layers is empty (one entry per MoE layer)")
        if any(l.n_experts != self.n_experts for l in self.layers):
            raise ValueError(f"every layer must list {self.n_experts} expert shares (n_experts)")
        if self.top_k > self.n_experts:
            raise ValueError("top_k exceeds n_experts")
        if tuple(la.depth for la in self.lookahead) != tuple(range(1, MAX_DEPTH + 1)):
            raise ValueError("lookahead must list depths 1, 2, 3, 4 in order")

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def static_hit(self, layer: int, s: float) -> float:
        """Share of layer `layer`'s accesses served by its `s` most popular experts."""
        return self.layers[layer].static_at(s)

    def cache_hit(self, layer: int, s: float, c: float) -> float:
        """Total hit rate of a static set of `s` experts plus an LRU cache of `c` experts at `layer`."""
        return self.layers[layer].cache_at(s, c)

    def range_share(self, layer: int, a: float, b: float) -> float:
        """Share of accesses to the experts ranked [a, b) by popularity (0 = most used)."""
        L = self.layers[layer]
        return max(0.0, L.static_at(b) - L.static_at(a))

    def lookahead_at(self, depth: int) -> LookaheadStats:
        if not 1 <= depth <= len(self.lookahead):
            raise ValueError(f"lookahead depth must be 1..{len(self.lookahead)}, got {depth}")
        return self.lookahead[depth - 1]

    def mean_static_hit(self, s: float) -> float:
        return sum(l.static_at(s) for l in self.layers) / self.n_layers

    def mean_cache_hit(self, s: float, c: float) -> float:
        return sum(l.cache_at(s, c) for l in self.layers) / self.n_layers

    def range_shares(self, a: float, b: float) -> tuple[float, ...]:
        """`range_share` of every layer."""
        return tuple(self.range_share(i, a, b) for i in range(self.n_layers))

    @property
    def mean_prev_reuse(self) -> float:
        return sum(l.prev_reuse for l in self.layers) / self.n_layers


def load_stats(path: str | Path) -> RoutingStats:
    """Read a statistics file written by `save_stats` (or `strata-plan stats --out`)."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise UserError(str(path), "", "is not a mapping of statistics fields", "write it with `strata-plan stats`")
    if data.get("schema") != SCHEMA_NAME:
        raise UserError(str(path), "schema", f"got {data.get('schema')!r}",
                        f"a routing statistics file starts with `schema: {SCHEMA_NAME}` (make one with `strata-plan stats`)")
    return parse(RoutingStats, data, str(path))


def save_stats(stats: RoutingStats, path: str | Path) -> Path:
    """Write `stats` as YAML atomically. Shares are rounded to 1e-7; layers equal to an earlier one are
    written once and referenced (a YAML anchor and alias), so a prior's file stays small."""
    data = to_data(stats)
    seen: dict[LayerStats, dict] = {}
    data["layers"] = [seen.setdefault(layer, _rounded(d)) for layer, d in zip(stats.layers, data["layers"])]
    header = (f"strata-plan routing statistics ({SCHEMA_NAME} v{SCHEMA_VERSION}) of {stats.model} from "
              f"{stats.kind} {stats.source}.\nSee core/routing/TRACE.md for every field.")
    return atomic_write_yaml(path, data, header)


def _rounded(v):
    if isinstance(v, float):
        return round(v, ROUND)
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return v
