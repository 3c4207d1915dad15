"""Routing statistics equal brute-force simulation of the same trace (exactly for static sets and LRU), on
synthetic traces and the real Mixtral trace; queries between grid points behave; the file is strict."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from strata_plan.errors import UserError
from strata_plan.core.routing import (LOOKAHEAD_PRIOR, RoutingStats, Trace, compute_stats, load_stats,
                                         save_stats)
from strata_plan.core.routing import reference as ref
from strata_plan.core.routing.compute import size_grid
from strata_plan.core.routing.convert import trace_from_jsonl
from strata_plan.core.routing.sample import sample_trace
from strata_plan.schema import to_data

SLICE = Path(__file__).parent / "data" / "routing_mixtral_slice.jsonl"


def assert_matches_brute_force(trace: Trace, stats: RoutingStats, layers, warmup: int = 0) -> None:
    for i in layers:
        ex = trace.experts[:, i, :]
        L = stats.layers[i]
        assert L.popularity == pytest.approx(ref.popularity(ex, trace.n_experts, warmup), abs=1e-15)
        assert L.prev_reuse == pytest.approx(ref.prev_reuse(ex, trace.sequence, warmup), abs=1e-15)
        order = list(L.order)
        for s in range(trace.n_experts + 1):          # every static-set size
            assert stats.static_hit(i, s) == pytest.approx(ref.simulate_cache(ex, set(order[:s]), 0, warmup), abs=1e-12)
        for a, s in enumerate(L.lru_static):          # every grid point of static set x LRU cache
            for b, c in enumerate(L.lru_cache):
                want = ref.simulate_cache(ex, set(order[:s]), c, warmup)
                assert L.lru_hit[a][b] == pytest.approx(want, abs=1e-12), (i, s, c)
                assert stats.cache_hit(i, s, c) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("zipf_s, locality, E, k, warmup", [(0.0, 0.0, 6, 2, 0), (1.1, 0.4, 12, 3, 0),
                                                             (0.7, 0.2, 40, 4, 25), (1.5, 0.0, 30, 1, 0)])
def test_synthetic_traces_equal_brute_force(zipf_s, locality, E, k, warmup):
    t = sample_trace(zipf_s, locality, n_layers=3, n_experts=E, top_k=k, tokens=300, seed=7, seq_len=64)
    stats = compute_stats(t, warmup=warmup)
    assert stats.layers[0].lru_static == size_grid(E, k)
    assert_matches_brute_force(t, stats, range(3), warmup)


def test_another_ranking_equals_brute_force_on_that_ranking_and_survives_a_file(tmp_path):
    """`compute_stats(rankings=...)`: static sets take the experts in the given order (a plan's, made from other
    statistics), not by this trace's counts; hit rates equal simulation with those sets, and the file keeps it."""
    t = sample_trace(1.1, 0.4, n_layers=2, n_experts=12, top_k=3, tokens=300, seed=7, seq_len=64)
    rng = np.random.default_rng(3)
    rankings = [tuple(int(e) for e in rng.permutation(12)) for _ in range(2)]
    stats = compute_stats(t, warmup=20, rankings=rankings)
    assert [l.order for l in stats.layers] == rankings
    own = compute_stats(t, warmup=20)
    assert stats.static_hit(0, 3) != pytest.approx(own.static_hit(0, 3))      # the permutation matters here
    assert_matches_brute_force(t, stats, range(2), warmup=20)
    assert load_stats(save_stats(stats, tmp_path / "s.yaml")).layers[1].order == rankings[1]
    with pytest.raises(ValueError, match="ranking"):
        compute_stats(t, rankings=[tuple(range(11)) + (0,)] * 2)


def test_mixtral_slice_equals_brute_force():
    t = trace_from_jsonl([SLICE])
    assert_matches_brute_force(t, compute_stats(t), range(t.n_layers))


def test_whole_mixtral_trace_equals_brute_force(shared_data):
    files = sorted((shared_data / "routing" / "mixtral8x7b_vllm_routing").glob("*_routing.jsonl"))
    t = trace_from_jsonl(files)
    stats = compute_stats(t)
    assert_matches_brute_force(t, stats, range(32))    # 32 layers x 81 grid points, each simulated
    # what the data README observed: reuse 34-40% (random 25%), top expert 14-23% of slots
    assert 0.33 < stats.mean_prev_reuse < 0.41
    assert all(0.13 < max(layer.popularity) < 0.24 for layer in stats.layers)


def test_lookahead_measured_where_recorded_else_prior():
    t = sample_trace(0.5, 0.2, n_layers=6, n_experts=10, top_k=2, tokens=80, seed=3)
    rng = np.random.default_rng(1)
    guess = np.full((80, 6, 2, 2), -1, dtype=np.int32)
    for d in (1, 2):                                          # right with probability 0.7, else random
        truth = t.experts[:, d:, :]
        noise = rng.integers(0, 10, size=truth.shape)
        guess[:, : 6 - d, d - 1] = np.where(rng.random(truth.shape) < 0.7, truth, noise)
    guess[5, 0, 0, 1] = -1                                    # a missing guess lowers recall, not precision
    t = Trace(t.experts, t.weights, t.sequence, "toy", 10, source="toy", lookahead_experts=guess,
              lookahead_scores=np.zeros(guess.shape, np.float32))
    stats = compute_stats(t)
    for d in (1, 2):
        la = stats.lookahead_at(d)
        p, r = ref.lookahead(t.experts, guess, d)
        assert (la.precision, la.recall, la.provenance) == (pytest.approx(p), pytest.approx(r), "trace")
        assert la.pairs == 80 * (6 - d) and 0.6 < la.recall < 0.95
    assert stats.lookahead_at(1).precision > stats.lookahead_at(1).recall
    assert stats.lookahead_at(3) == LOOKAHEAD_PRIOR[2] and stats.lookahead_at(4).provenance == "prior"
    with pytest.raises(ValueError):
        stats.lookahead_at(5)


def test_queries_between_grid_points_are_monotone_and_bounded():
    t = sample_trace(0.9, 0.3, n_layers=2, n_experts=64, top_k=4, tokens=400, seed=2)
    st = compute_stats(t)
    L = st.layers[1]
    assert 5 not in L.lru_static and 5 not in L.lru_cache       # so the sweep below interpolates
    sizes = np.linspace(0, 64, 129)
    grid = np.array([[st.cache_hit(1, s, c) for c in sizes] for s in sizes])
    assert (np.diff(grid, axis=0) >= -1e-12).all() and (np.diff(grid, axis=1) >= -1e-12).all()
    assert all(grid[i, j] >= st.static_hit(1, s) - 1e-12 for i, s in enumerate(sizes) for j in range(len(sizes)))
    assert grid.max() <= 1.0
    i, j = L.lru_static.index(8), L.lru_cache.index(8)
    lo, hi = L.lru_hit[i][j], L.lru_hit[i + 1][j + 1]
    assert lo <= st.cache_hit(1, 9.5, 9.5) <= hi
    assert st.range_share(1, 0, 64) == pytest.approx(1.0)
    assert st.range_share(1, 3, 10) == pytest.approx(st.static_hit(1, 10) - st.static_hit(1, 3))
    assert st.static_hit(1, 2.5) == pytest.approx((st.static_hit(1, 2) + st.static_hit(1, 3)) / 2)


def test_file_round_trip_and_strict_parse(tmp_path):
    st = compute_stats(trace_from_jsonl([SLICE]))
    out = save_stats(st, tmp_path / "s.yaml")
    back = load_stats(out)
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]
    assert back.source_sha256 == st.source_sha256 and back.lookahead == st.lookahead
    for a, b in zip(st.layers, back.layers):
        assert np.allclose(a.popularity, b.popularity, atol=1e-7) and np.allclose(a.lru_hit, b.lru_hit, atol=1e-7)
        assert a.order == b.order and a.lru_static == b.lru_static
    data = yaml.safe_load(out.read_text())
    cases = [
        ({**data, "version": 2}, "version 2 is not supported"),
        ({**data, "extra": 1}, "extra: unknown field"),
        ({**data, "schema": "other"}, "schema: got 'other'"),
        ({**data, "kind": "guess"}, "kind: got 'guess'"),
        ({**data, "layers": [{**data["layers"][0], "prev_reuse": 1.5}] + data["layers"][1:]}, "prev_reuse: out of range"),
        ({**data, "layers": [{**data["layers"][0], "popularity": [0.5] * 8}] + data["layers"][1:]}, "summing to 1"),
        ({**data, "layers": [{k: v for k, v in data["layers"][0].items() if k != "lru_hit"}]}, "lru_hit: missing field"),
        ({**data, "layers": [{**data["layers"][0], "lru_hit": data["layers"][0]["lru_hit"][::-1]}]}, "lru_hit"),
        ({**data, "lookahead": data["lookahead"][:3]}, "depths 1, 2, 3, 4"),
    ]
    for bad, message in cases:
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(UserError, match=message):
            load_stats(tmp_path / "bad.yaml")


def test_layer_checks_catch_inconsistent_grids():
    st = compute_stats(sample_trace(1.0, 0.2, 1, 8, 2, 100))
    L = st.layers[0]
    with pytest.raises(ValueError, match="running sum"):
        dataclasses.replace(L, static_hit=(0.0,) + tuple(i / 8 for i in range(1, 9)))
    worse = [list(r) for r in L.lru_hit]
    worse[3][4] = worse[2][4] - 0.05
    with pytest.raises(ValueError):
        dataclasses.replace(L, lru_hit=tuple(tuple(r) for r in worse))
    assert to_data(L)["lru_static"] == list(range(9))
