"""Brute-force simulations of the statistics `compute_stats` derives: the plain reference path.

Slow and obvious on purpose (Python loops, an OrderedDict LRU). Tests hold the fast stack-distance and
array code equal to these on real and synthetic traces.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np


def simulate_cache(experts: np.ndarray, static: set[int], cache: int, first: int = 0) -> float:
    """Hit rate of one layer's accesses (tokens `first`..) with `static` always resident and an LRU
    cache of `cache` experts for the rest. experts: int [T, k]. A token's experts are looked up against
    the cache as it stood before the token, then touched in slot order (see lru.py)."""
    lru: OrderedDict[int, None] = OrderedDict()
    hits = total = 0
    for t, row in enumerate(experts.tolist()):
        counted = t >= first
        for e in row:
            if counted:
                total += 1
                hits += e in static or e in lru
        for e in row:
            if e in static or cache == 0:
                continue
            lru[e] = None
            lru.move_to_end(e)
            if len(lru) > cache:
                lru.popitem(last=False)
    return hits / total


def popularity(experts: np.ndarray, n_experts: int, first: int = 0) -> list[float]:
    counts = [0] * n_experts
    for row in experts[first:].tolist():
        for e in row:
            counts[e] += 1
    n = sum(counts)
    return [c / n for c in counts]


def prev_reuse(experts: np.ndarray, sequence: np.ndarray, first: int = 0) -> float:
    """Share of slots of tokens `first`.. whose expert the previous token of the same sequence also used."""
    reused = slots = 0
    for t in range(max(first, 1), len(experts)):
        if sequence[t] != sequence[t - 1]:
            continue
        before = set(experts[t - 1].tolist())
        for e in experts[t].tolist():
            slots += 1
            reused += e in before
    return reused / slots if slots else 0.0


def lookahead(experts: np.ndarray, predicted: np.ndarray, depth: int) -> tuple[float, float]:
    """(precision, recall) of the depth-`depth` predictions: experts [T, L, k], predicted [T, L, D, k]."""
    hits = guessed = actual = 0
    T, L, _ = experts.shape
    for t in range(T):
        for i in range(L - depth):
            truth = set(experts[t, i + depth].tolist())
            guess = [e for e in predicted[t, i, depth - 1].tolist() if e >= 0]
            hits += sum(e in truth for e in guess)
            guessed += len(guess)
            actual += len(truth)
    return (hits / guessed if guessed else 0.0), (hits / actual if actual else 0.0)
