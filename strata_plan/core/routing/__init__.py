"""Routing statistics: which experts tokens use, from a trace or a prior, as the planner reads them.

- trace.py    the trace format v1 (`.npz`): `Trace`, `load_trace`, `save_trace`
- convert.py  the Mixtral JSONL trace (shared/data/routing) -> `Trace`
- stats.py    `LayerStats`, `LookaheadStats`, `RoutingStats`, `load_stats`, `save_stats` (YAML)
- compute.py  `compute_stats(trace)`: popularity, static/LRU hit rates, reuse, lookahead
- lru.py      stack distances: the whole static x LRU hit-rate grid in one pass per layer
- reference.py  brute-force simulations the tests hold the fast paths to
- sample.py   the generative model of priors; priors.py  named priors, `stats_from_prior`
- fit.py      fitting priors to the real data (scripts/fit_priors.py)
TRACE.md documents the trace, the statistics file and the priors with their fit.
"""
from .compute import compute_stats
from .priors import (SKEWED_PRIOR, Prior, PriorFit, load_prior, save_prior,
                     shipped_priors, stats_from_prior)
from .stats import LOOKAHEAD_PRIOR, LayerStats, LookaheadStats, RoutingStats, default_lookahead, load_stats, save_stats
from .trace import Trace, load_trace, save_trace

__all__ = ["Trace", "load_trace", "save_trace", "LayerStats", "LookaheadStats", "RoutingStats", "load_stats",
           "save_stats", "compute_stats", "Prior", "PriorFit", "load_prior", "save_prior", "shipped_priors",
           "stats_from_prior", "default_lookahead", "LOOKAHEAD_PRIOR", "SKEWED_PRIOR"]
