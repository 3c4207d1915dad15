"""Fit a prior's Zipf exponent and locality to real routing data (used by scripts/fit_priors.py and tests).

Targets, from shared/data/routing (README.md there describes each set):
- popularity: the mean, over (data file, layer), of the layer's expert shares sorted most used first;
  each source is averaged on its own first, then sources are averaged with equal weight;
- prev_reuse: share of a token's slots its predecessor also used (only the Mixtral trace has token order).
The model curve is the prior's pooled, non-increasing share per rank from a large sample (fixed seed, so
the objective is deterministic). s minimises the RMSE of the static-hit curve (running sum of the shares,
what the planner reads) by golden section; locality solves reuse(model) = target by bisection; the two
are refined in turn.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .compute import non_increasing, prev_reuse
from .sample import sample_experts

ROUTING = "routing"
FIT_CHAINS, FIT_TOKENS, FIT_SEED = 256, 512, 12345


# ---- the real data ---------------------------------------------------------------------------
def olmoe_counts(data: Path, model: str = "olmoe") -> list[tuple[str, np.ndarray]]:
    """(label, counts [E]) per domain and layer of the OLMoE paper's expert-count tables."""
    out = []
    for f in sorted((data / ROUTING / "olmoe_paper_routing_counts" / model / "expert_counts").glob("*.json")):
        d = json.loads(f.read_text())
        for layer, counts in zip(d["layers"], d["counts"]):
            out.append((f"{model}/{f.stem}/layer{layer}", np.array([counts[str(e)] for e in range(len(counts))], float)))
    return out


def fiddler_counts(data: Path) -> list[tuple[str, np.ndarray]]:
    """(label, counts [8]) per subject and layer of Fiddler's Mixtral-8x7B popularity (base and instruct)."""
    out = []
    for f in sorted((data / ROUTING / "fiddler_mixtral_popularity").glob("*/expert_popularity_*.json")):
        rows = json.loads(f.read_text())["expert_popularity"]
        out += [(f"{f.parent.name}/{f.stem}/layer{i}", np.array(r, float)) for i, r in enumerate(rows)]
    return out


def mixtral_trace_paths(data: Path) -> list[Path]:
    return sorted((data / ROUTING / "mixtral8x7b_vllm_routing").glob("*_routing.jsonl"))


def sorted_shares(counts: list[np.ndarray]) -> np.ndarray:
    """Mean over layers of each layer's shares sorted most used first."""
    return np.mean([np.sort(c / c.sum())[::-1] for c in counts], axis=0)


def target_curve(*sources: list[np.ndarray]) -> np.ndarray:
    """Sources weighted equally, each the mean of its own layers' sorted shares."""
    return np.mean([sorted_shares(s) for s in sources], axis=0)


# ---- the model -----------------------------------------------------------------------------------
def model_stats(zipf_s: float, locality: float, n_experts: int, top_k: int) -> tuple[np.ndarray, float]:
    """(share per popularity rank, previous-token reuse) of the prior, from a fixed-seed pooled sample."""
    ex, _, seq = sample_experts(zipf_s, locality, FIT_CHAINS, n_experts, top_k, FIT_TOKENS, FIT_SEED, permute=False)
    shares = non_increasing(np.bincount(ex.ravel(), minlength=n_experts) / ex.size)
    return shares, prev_reuse(ex, seq)


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(a) - np.asarray(b)) ** 2)))


def static_error(a: np.ndarray, b: np.ndarray) -> float:
    """Largest gap between the static-set hit-rate curves (running sums of shares by rank) of a and b."""
    return float(np.max(np.abs(np.cumsum(a) - np.cumsum(b))))


@dataclass(frozen=True)
class FitResult:
    zipf_s: float
    locality: float
    curve: tuple[float, ...]          # the model's share per rank at the fitted values
    reuse: float                      # the model's previous-token reuse
    popularity_rmse: float
    static_hit_error: float           # max over s of |static hit rate of the s top experts, model - data|
    prev_reuse_error: float | None


def fit(target: np.ndarray, top_k: int, target_reuse: float | None = None, locality: float = 0.0,
        rounds: int = 3) -> FitResult:
    """Fit zipf_s (and locality, when `target_reuse` is given; else `locality` is kept) to the targets."""
    E = len(target)
    s = 0.0
    for _ in range(rounds if target_reuse is not None else 1):
        s = _golden(lambda x: rmse(np.cumsum(model_stats(x, locality, E, top_k)[0]), np.cumsum(target)), 0.0, 3.0)
        if target_reuse is not None:
            locality = _bisect(lambda lam: model_stats(s, lam, E, top_k)[1] - target_reuse, 0.0, 0.95)
    s, locality = round(s, 3), round(locality, 3)
    curve, reuse = model_stats(s, locality, E, top_k)
    return FitResult(s, locality, tuple(float(v) for v in curve), reuse, rmse(curve, target),
                     static_error(curve, target), None if target_reuse is None else reuse - target_reuse)


def _golden(f, lo: float, hi: float, tol: float = 1e-3) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo + (1 - g) * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    while hi - lo > tol:
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = lo + (1 - g) * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
    return (lo + hi) / 2


def _bisect(f, lo: float, hi: float, tol: float = 1e-3) -> float:
    """Root of an increasing f on [lo, hi], clamped to the ends."""
    if f(lo) >= 0:
        return lo
    if f(hi) <= 0:
        return hi
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2
