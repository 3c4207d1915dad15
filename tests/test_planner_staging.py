"""The staging cache's misses in the cost model (planner/staging.py) against a brute-force simulation of the engine's
policy on the same trace: one LRU over every layer's NVMe accesses (its free slots), each layer's top_k asked for in
token order. With temporal locality the statistics' own LRU curve comes close where Che's approximation (independent
references) reads too much; without it the two agree. With fewer free slots than a token's misses, what a layer
staged is gone before its next request, which Che's approximation (and the curve) do not see."""
from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest

from strata_plan.core.routing import compute_stats
from strata_plan.core.routing.sample import sample_trace
from strata_plan.planner.staging import che_time, staging_miss

L, E, K = 4, 48, 4
S_STATIC, M_RAM = 4, 12                  # per layer: static ranks, RAM ranks; the rest (32) on NVMe


def simulated_reads(trace, stats, free: int, resident: int = S_STATIC + M_RAM) -> float:
    """NVMe reads a token of an LRU of `free` slots over every layer's NVMe accesses (ranks from `resident` on, by
    popularity), after a warm-up of half the trace."""
    lru: OrderedDict = OrderedDict()
    reads, T = 0, trace.n_tokens
    rank = [{e: r for r, e in enumerate(layer.order)} for layer in stats.layers]
    for t in range(T):
        for j in range(L):
            for e in trace.experts[t, j]:
                if rank[j][int(e)] < resident:
                    continue
                key = (j, int(e))
                if key in lru:
                    lru.move_to_end(key)
                    continue
                reads += t >= T // 2
                lru[key] = True
                if len(lru) > free:
                    lru.popitem(last=False)
    return reads / (T - T // 2)


def predicted_reads(stats, free: int, che_only: bool = False, resident: int = S_STATIC + M_RAM) -> float:
    pop = np.array([[layer.popularity[e] for e in layer.order] for layer in stats.layers])
    cold_w = K * pop * (np.arange(E)[None, :] >= resident)                # no device LRU: every NVMe access arrives
    place = SimpleNamespace(vram=(S_STATIC,) * L, ram=(resident - S_STATIC,) * L, cache=(0,) * L)
    if che_only:
        return float((cold_w * np.exp(-cold_w * che_time(cold_w, free))).sum())
    return float((cold_w * staging_miss(stats, place, cold_w, free + K, K)).sum())


@pytest.mark.parametrize("locality", [0.0, 0.6])
def test_the_staging_cache_reads_what_an_lru_over_the_trace_reads(locality):
    trace = sample_trace(0.9, locality, n_layers=L, n_experts=E, top_k=K, tokens=6000, seed=3, seq_len=6000)
    stats = compute_stats(trace, warmup=3000)
    free = 40                                                  # of 4 x 32 NVMe experts
    sim = simulated_reads(trace, stats, free)
    model, che = predicted_reads(stats, free), predicted_reads(stats, free, che_only=True)
    assert model <= che + 1e-9                                 # locality only ever keeps more (slots for many tokens)
    assert model == pytest.approx(sim, rel=0.10), (model, sim, che)
    if locality:
        assert che > 1.2 * sim                                 # independent references read too much here


@pytest.mark.parametrize("locality,free", [(0.0, 4), (0.6, 4), (0.6, 8)])
def test_slots_fewer_than_a_tokens_misses_keep_nothing_for_the_next_token(locality, free):
    """3 resident ranks a layer, the rest (45) on NVMe: about 11 NVMe misses a token. With 4 or 8 free slots an
    expert is evicted before its layer's next request (the simulation keeps 0-2%); Che's approximation and the curve
    keep up to 43% (the trained model's seed budget on the H100: 38.4 accesses a token, 23 free slots)."""
    trace = sample_trace(0.9, locality, n_layers=L, n_experts=E, top_k=K, tokens=6000, seed=3, seq_len=6000)
    stats = compute_stats(trace, warmup=3000)
    sim = simulated_reads(trace, stats, free, resident=3)
    accesses = predicted_reads(stats, 0, resident=3)           # no free slot: every NVMe access is read
    assert sim >= 0.97 * accesses                              # the premise: the LRU keeps almost nothing
    assert predicted_reads(stats, free, resident=3) == pytest.approx(sim, rel=0.10)
