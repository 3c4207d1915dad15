"""Routing priors: parametric stand-ins for a trace when a model has none.

A prior is Zipf popularity (exponent `zipf_s`, 0 = uniform) plus temporal locality (`locality`: the
probability that a token keeps each expert the previous token used at the same layer), plus documented
lookahead precision/recall by depth. Named priors ship as YAML in core/routing/priors/; the fitted ones carry
their fit (data, targets, errors), reproduced by `scripts/fit_priors.py`. sample.py holds the generative
model; `stats_from_prior` turns a prior into the same `RoutingStats` a trace gives.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from strata_plan.core.lookahead import MAX_DEPTH
from strata_plan.errors import UserError
from strata_plan.schema import bounded, check_schema, parse, to_data
from strata_plan.yamlio import atomic_write_yaml, read_yaml

from .compute import pooled_layer_stats
from .sample import sample_experts
from .stats import (LOOKAHEAD_PRIOR, SCHEMA_NAME as STATS_SCHEMA, SCHEMA_VERSION as STATS_VERSION, LookaheadStats,
                    RoutingStats)

SCHEMA_NAME = "strata-plan/routing-prior"
SCHEMA_VERSION = 1
PRIORS_DIR = Path(__file__).resolve().parent / "priors"
SKEWED_PRIOR = "olmoe-like"      # the skewed prior compare-tables and the benchmarks use
CHAINS = 16                      # independent layers sampled and pooled for a prior's statistics

@dataclass(frozen=True)
class PriorFit:
    """How a prior's numbers were fitted: the data, the targets it reproduces, and how closely."""

    data: tuple[str, ...]                   # the real data fitted (paths under shared/data/routing)
    n_experts: int = bounded(1, None)       # geometry of the data the targets come from
    top_k: int = bounded(1, None)
    popularity: tuple[float, ...] = ()      # target: mean share of each popularity rank, most used first
    prev_reuse: float | None = None         # target: previous-token reuse (None: the data has no order)
    popularity_rmse: float = bounded(0.0, 1.0, default=0.0)     # prior vs target, over ranks
    static_hit_error: float = bounded(0.0, 1.0, default=0.0)    # max over s of |static hit, prior - target|
    prev_reuse_error: float | None = None   # prior minus target
    locality_from: str = ""                 # where `locality` comes from when not fitted to this data
    method: str = ""

    def __post_init__(self) -> None:
        if len(self.popularity) != self.n_experts or abs(sum(self.popularity) - 1) > 1e-4:
            raise ValueError(f"fit.popularity must list {self.n_experts} shares summing to 1")


@dataclass(frozen=True)
class Prior:
    schema: str
    version: int
    name: str
    description: str
    zipf_s: float = bounded(0.0, 4.0)
    locality: float = bounded(0.0, 0.99)
    lookahead: tuple[LookaheadStats, ...] = LOOKAHEAD_PRIOR
    fit: PriorFit | None = None

    def __post_init__(self) -> None:
        check_schema(self, SCHEMA_NAME, SCHEMA_VERSION)
        if tuple(la.depth for la in self.lookahead) != tuple(range(1, MAX_DEPTH + 1)):
            raise ValueError("lookahead must list depths 1, 2, 3, 4 in order")
        if any(la.provenance != "prior" or not la.source for la in self.lookahead):
            raise ValueError("a prior's lookahead entries are provenance: prior, each with a source")

    @property
    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(to_data(self), sort_keys=True).encode()).hexdigest()


def shipped_priors() -> list[str]:
    return sorted(p.stem for p in PRIORS_DIR.glob("*.yaml"))


def load_prior(name_or_path: str | Prior) -> Prior:
    """A shipped prior by name (`olmoe-like`) or a path to a prior YAML."""
    if isinstance(name_or_path, Prior):
        return name_or_path
    p = Path(name_or_path)
    if not p.is_file():
        shipped = PRIORS_DIR / f"{name_or_path}.yaml"
        if shipped.is_file():
            p = shipped
        elif p.suffix in (".yaml", ".yml") or "/" in str(name_or_path):
            raise UserError(str(name_or_path), "", "file not found", "check the path, or use a shipped prior name")
        else:
            raise UserError("prior", str(name_or_path), "unknown prior name",
                            f"use one of {', '.join(shipped_priors())} or a path to a prior YAML")
    data = read_yaml(p)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_NAME:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise UserError(str(p), "schema", f"got {got!r}", f"a routing prior starts with `schema: {SCHEMA_NAME}`")
    return parse(Prior, data, str(p))


def save_prior(prior: Prior, path: str | Path) -> Path:
    header = (f"strata-plan routing prior ({SCHEMA_NAME} v{SCHEMA_VERSION}). See core/routing/TRACE.md;\n"
              "fitted values are written by scripts/fit_priors.py --write.")
    return atomic_write_yaml(path, to_data(prior), header)


def stats_from_prior(prior: str | Prior, n_layers: int, n_experts: int, top_k: int, seed: int = 0,
                     tokens: int = 2048, model: str = "") -> RoutingStats:
    """RoutingStats of `prior` for a model of this geometry: `CHAINS` layers are sampled for `tokens`
    tokens (after a quarter as many warm-up tokens), pooled, and the one LayerStats is used for every
    layer (a prior's layers are alike). Cached: the planner and the TUI call it freely."""
    return _stats_from_prior(load_prior(prior), n_layers, n_experts, top_k, seed, tokens, model)


@lru_cache(maxsize=32)
def _stats_from_prior(prior: Prior, n_layers: int, n_experts: int, top_k: int, seed: int, tokens: int,
                      model: str) -> RoutingStats:
    if n_layers < 1 or not 1 <= top_k <= n_experts or tokens < 1:
        raise UserError(f"prior {prior.name}", "geometry", f"{n_layers} layers, {n_experts} experts, top-{top_k}, "
                        f"{tokens} tokens", "use at least one layer and token, and 1 <= top_k <= n_experts")
    warmup = max(1, tokens // 4)
    experts, _, sequence = sample_experts(prior.zipf_s, prior.locality, CHAINS, n_experts, top_k,
                                          warmup + tokens, seed, permute=False)
    layer = pooled_layer_stats(experts, sequence, n_experts, warmup, uniform=prior.zipf_s == 0)
    return RoutingStats(schema=STATS_SCHEMA, version=STATS_VERSION, model=model or f"{n_layers}x{n_experts} top-{top_k}",
                        n_experts=n_experts, top_k=top_k,
                        source=f"prior {prior.name} (zipf_s={prior.zipf_s}, locality={prior.locality}, "
                               f"tokens={tokens}, seed={seed})",
                        source_sha256=prior.sha256, kind="prior", layers=(layer,) * n_layers,
                        lookahead=prior.lookahead, tokens=tokens, phase="decode")
