"""Routing priors: the sampler is the stated model, shipped priors reproduce the statistics they were
fitted to (within the tolerances TRACE.md states), the fit is an optimum, and bad prior files are refused."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import yaml

from strata_plan.errors import UserError
from strata_plan.core.routing import (SKEWED_PRIOR, compute_stats, load_prior, shipped_priors, stats_from_prior)
from strata_plan.core.routing import fit as F
from strata_plan.core.routing.convert import trace_from_jsonl
from strata_plan.core.routing.priors import PRIORS_DIR
from strata_plan.core.routing.sample import rank_weights, sample_experts, sample_trace

# Tolerances stated in strata_plan/core/routing/TRACE.md: a sampled prior's statistics lie within the fit's own
# error plus these margins of the data it was fitted to.
POP_RMSE_MARGIN = 0.003
STATIC_MARGIN = 0.01
REUSE_MARGIN = 0.01
FITTED = ("mixtral-like", "olmoe-like")


def test_shipped_priors_and_the_skewed_one():
    assert {"uniform", "olmoe-like", "mixtral-like"} <= set(shipped_priors())
    assert SKEWED_PRIOR in shipped_priors() and load_prior(SKEWED_PRIOR).zipf_s > load_prior("mixtral-like").zipf_s
    for name in FITTED:
        p = load_prior(name)
        assert p.fit and p.fit.data and p.fit.method and 0 < p.zipf_s < 2 and 0 < p.locality < 0.5
        assert all(la.source for la in p.lookahead)
    assert load_prior("uniform").zipf_s == 0 and load_prior("uniform").fit is None


def test_successive_sampling_marginals_are_exact():
    E, k, s = 5, 2, 1.2
    p = rank_weights(E, s)
    exact = np.zeros(E)
    for a, b in itertools.permutations(range(E), 2):       # P(draw a, then b) = p_a * p_b / (1 - p_a)
        pr = p[a] * p[b] / (1 - p[a])
        exact[[a, b]] += pr
    ex, _, _ = sample_experts(s, 0.0, 50, E, k, 2000, seed=4, permute=False)
    freq = np.bincount(ex.ravel(), minlength=E) / (ex.shape[0] * ex.shape[1])   # inclusion probability
    n = ex.shape[0] * ex.shape[1]
    assert np.all(np.abs(freq - exact) < 4 * np.sqrt(exact * (1 - exact) / n)), (freq, exact)


def test_locality_gives_the_stated_reuse():
    E, k, lam = 16, 4, 0.35                                   # uniform weights: reuse has a closed form
    expect = sum(math.comb(k, j) * lam**j * (1 - lam) ** (k - j) * (j + (k - j) ** 2 / (E - j)) for j in range(k + 1)) / k
    ex, _, seq = sample_experts(0.0, lam, 64, E, k, 600, seed=5)
    same = seq[1:] == seq[:-1]
    got = (ex[1:][same][..., :, None] == ex[:-1][same][..., None, :]).any(-1).mean()
    assert got == pytest.approx(expect, abs=0.01)
    assert (np.sort(ex, axis=2)[..., 1:] != np.sort(ex, axis=2)[..., :-1]).all()      # k distinct experts


@pytest.mark.parametrize("name", FITTED)
def test_prior_reproduces_its_fit_on_sampled_statistics(name):
    p = load_prior(name)
    f = p.fit
    target = np.array(f.popularity)
    st = stats_from_prior(p, n_layers=4, n_experts=f.n_experts, top_k=f.top_k, seed=11, tokens=4096)
    curve = np.array(st.layers[0].popularity)
    assert F.rmse(curve, target) <= f.popularity_rmse + POP_RMSE_MARGIN
    assert F.static_error(curve, target) <= f.static_hit_error + STATIC_MARGIN
    assert st.static_hit(0, f.n_experts // 4) == pytest.approx(target[: f.n_experts // 4].sum(),
                                                               abs=f.static_hit_error + STATIC_MARGIN)
    if f.prev_reuse is not None:
        assert abs(st.mean_prev_reuse - f.prev_reuse) <= abs(f.prev_reuse_error) + REUSE_MARGIN
    # the same through the trace path: a full sampled trace, ids shuffled per layer, exact in-sample statistics
    t = sample_trace(p.zipf_s, p.locality, n_layers=8, n_experts=f.n_experts, top_k=f.top_k, tokens=3000, seed=12)
    ts = compute_stats(t)
    sorted_mean = np.mean([sorted(layer.popularity, reverse=True) for layer in ts.layers], axis=0)
    assert F.rmse(sorted_mean, target) <= f.popularity_rmse + POP_RMSE_MARGIN
    if f.prev_reuse is not None:
        assert abs(ts.mean_prev_reuse - f.prev_reuse) <= abs(f.prev_reuse_error) + REUSE_MARGIN


@pytest.mark.parametrize("name", FITTED)
def test_shipped_values_are_the_fit_optimum(name):
    """The recorded errors are what the model gives at the shipped values, and nudging s or locality
    moves the statistics away from the data (the full refit: scripts/fit_priors.py)."""
    p = load_prior(name)
    f = p.fit
    target = np.array(f.popularity)

    def static_rmse(s):
        return F.rmse(np.cumsum(F.model_stats(s, p.locality, f.n_experts, f.top_k)[0]), np.cumsum(target))
    curve, reuse = F.model_stats(p.zipf_s, p.locality, f.n_experts, f.top_k)
    assert F.rmse(curve, target) == pytest.approx(f.popularity_rmse, abs=1e-6)
    assert F.static_error(curve, target) == pytest.approx(f.static_hit_error, abs=1e-6)
    assert static_rmse(p.zipf_s) < min(static_rmse(p.zipf_s - 0.05), static_rmse(p.zipf_s + 0.05))
    if f.prev_reuse is not None:
        assert reuse - f.prev_reuse == pytest.approx(f.prev_reuse_error, abs=1e-6)
        lo = F.model_stats(p.zipf_s, p.locality - 0.03, f.n_experts, f.top_k)[1]
        hi = F.model_stats(p.zipf_s, p.locality + 0.03, f.n_experts, f.top_k)[1]
        assert lo < f.prev_reuse < hi


def test_fit_targets_come_from_the_shared_data(shared_data):
    mix, olm = load_prior("mixtral-like").fit, load_prior("olmoe-like").fit
    want = F.target_curve([c for _, c in F.fiddler_counts(shared_data)], [c for _, c in F.olmoe_counts(shared_data, "mistral")])
    assert np.allclose(mix.popularity, want, atol=2e-7)
    assert np.allclose(olm.popularity, F.target_curve([c for _, c in F.olmoe_counts(shared_data, "olmoe")]), atol=2e-7)
    trace = trace_from_jsonl(F.mixtral_trace_paths(shared_data))
    assert compute_stats(trace).mean_prev_reuse == pytest.approx(mix.prev_reuse, abs=1e-6)


def test_uniform_prior_is_exactly_uniform_and_big_models_work():
    st = stats_from_prior("uniform", 92, 384, 8, model="kimi-k3.1-pro")
    assert st.n_layers == 92 and st.kind == "prior" and st.model == "kimi-k3.1-pro"
    assert st.static_hit(5, 96) == pytest.approx(0.25) and st.layers[0].popularity == (1 / 384,) * 384
    assert st.cache_hit(3, 48, 48) > st.static_hit(3, 48)
    assert 0.0 < st.mean_prev_reuse < 0.05                       # k/E = 2% by chance, no locality
    again = stats_from_prior("uniform", 92, 384, 8, model="kimi-k3.1-pro")
    assert again is st                                           # cached for the planner and the TUI
    skewed = stats_from_prior(SKEWED_PRIOR, 92, 384, 8)
    assert skewed.mean_static_hit(48) > st.mean_static_hit(48) + 0.2
    assert stats_from_prior(SKEWED_PRIOR, 92, 384, 8, seed=1).mean_static_hit(48) == pytest.approx(
        skewed.mean_static_hit(48), abs=0.01)


def test_bad_prior_files_are_refused(tmp_path):
    good = yaml.safe_load((PRIORS_DIR / "mixtral-like.yaml").read_text())
    cases = [({**good, "zipf_s": -1}, "zipf_s: out of range"), ({**good, "locality": 1.5}, "locality: out of range"),
             ({**good, "colour": 1}, "colour: unknown field"), ({**good, "lookahead": good["lookahead"][:2]}, "depths"),
             ({**good, "schema": "strata-plan/hardware-profile"}, "schema"),
             ({**good, "fit": {**good["fit"], "popularity": [0.5, 0.5]}}, "fit.popularity")]
    for data, message in cases:
        f = tmp_path / "p.yaml"
        f.write_text(yaml.safe_dump(data))
        with pytest.raises(UserError, match=message):
            load_prior(str(f))
    with pytest.raises(UserError, match="unknown prior name"):
        load_prior("zipfy")
    with pytest.raises(UserError, match="file not found"):
        load_prior(str(tmp_path / "none.yaml"))
