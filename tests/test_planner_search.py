"""The placement search: near the brute-force optimum on small instances, better than the equal-count greedy
plan where layers differ in skew, reproducible, resumable from SQLite, never worse than its starting plan."""
from __future__ import annotations

import itertools

import pytest

from strata_plan.errors import UserError
from strata_plan.planner.cost import CostModel
from strata_plan.planner.placement import Knobs, Placement, allocate, footprint, greedy_knobs
from strata_plan.planner.search import search
from strata_plan.planner.testing import tiny_problem


def brute_force(problem, depths=(0, 1, 2), max_cache: int | None = None) -> tuple[float, Placement]:
    """Best decode tok/s over every placement with all dense weights resident: each layer's static count,
    cache slots and RAM count, each depth. Only RAM splits with no room for one more expert anywhere are
    scored (more residency is never slower; test_planner_cost checks that)."""
    cost, budget = CostModel(problem), problem.budget
    L, E = problem.curves.n_layers, problem.curves.n_experts
    dense = (True,) * len(problem.dense_units)
    sc = [(s, c) for s in range(E + 1) for c in range(E - s + 1) if max_cache is None or c <= max_cache]
    ram_over = lambda s, m, c, d: footprint(problem, Placement(s, m, c, dense, d)).overflow(budget)[1]  # noqa: E731
    best = (0.0, None)
    for depth in depths:
        for combo in itertools.product(sc, repeat=L):
            s, c = tuple(x[0] for x in combo), tuple(x[1] for x in combo)
            if footprint(problem, Placement(s, (0,) * L, c, dense, depth)).overflow(budget)[0] > 0:
                continue
            for head in itertools.product(*[range(E - si + 1) for si in s[:-1]]):
                last = next((x for x in range(E - s[-1], -1, -1) if ram_over(s, head + (x,), c, depth) <= 0), None)
                if last is None:
                    continue
                m = head + (last,)
                if any(s[l] + m[l] < E and ram_over(s, tuple(m[j] + (j == l) for j in range(L)), c, depth) <= 0
                       for l in range(L - 1)):
                    continue
                v = cost.predict(Placement(s, m, c, dense, depth)).decode_tok_s
                if v > best[0]:
                    best = (v, Placement(s, m, c, dense, depth))
    return best


@pytest.fixture(scope="module")
def two_layers():
    """One very skewed layer beside a uniform one: the equal-count greedy plan is wrong here."""
    return tiny_problem(skews=(1.6, 0.0), vram_experts=4, ram_experts=3)


@pytest.fixture(scope="module")
def three_layers():
    return tiny_problem(skews=(1.2, 0.3, 0.0), vram_experts=3, ram_experts=2, n_experts=6, locality=0.3, seed=1)


@pytest.mark.parametrize("name", ["two_layers", "three_layers"])
def test_search_within_2_percent_of_brute_force(name, request):
    problem = request.getfixturevalue(name)
    opt, placement = brute_force(problem, max_cache=1 if name == "three_layers" else None)
    found = search(problem, trials=150, seed=0).best
    assert found.footprint.fits(problem.budget)
    assert found.score >= 0.98 * opt, (found.placement, placement)


def _best_equal_count(problem) -> float:
    """The greedy plan at its best: every depth, the same static count in every layer, no cache."""
    cost = CostModel(problem)
    g = greedy_knobs(problem)
    best = 0.0
    for depth in range(problem.curves.max_depth + 1):
        a = allocate(problem, Knobs(g.dense_share, 0.0, 0.0, depth))
        assert len(set(a.placement.vram)) <= 2     # equal counts (up to the last expert that fits)
        if a.footprint.fits(problem.budget):
            best = max(best, cost.predict(a.placement).decode_tok_s)
    return best


def test_search_beats_equal_count_greedy_when_layers_differ_in_skew(two_layers):
    found = search(two_layers, trials=100, seed=0).best
    greedy = _best_equal_count(two_layers)
    assert found.score > 1.05 * greedy
    skewed, uniform = found.placement.vram
    assert skewed != uniform        # the VRAM went unevenly


def test_same_seed_same_plan(three_layers):
    a = search(three_layers, trials=40, seed=7).best
    b = search(three_layers, trials=40, seed=7).best
    assert a.placement == b.placement and a.knobs == b.knobs and a.score == b.score


def test_a_fixed_depth_is_the_plans_depth_within_the_same_budget(three_layers):
    """`Problem.depth` (`strata-plan plan --depth`): the trials, the greedy start, the depth sweep and the polish all
    keep that depth; the plan fits the same budget (its staging slots paid for there); out of the statistics'
    range: one line naming --depth."""
    top = three_layers.curves.max_depth
    assert top >= 1
    for d in range(top + 1):
        fixed = three_layers.replace(depth=d)
        r = search(fixed, trials=12, seed=3)
        assert r.best.placement.prefetch_depth == d and r.best.knobs.prefetch_depth == d
        assert r.best.footprint.fits(fixed.budget) and r.greedy.placement.prefetch_depth == d
    with pytest.raises(UserError, match="--depth"):
        search(three_layers.replace(depth=top + 1), trials=2)


def test_study_resumes_from_sqlite(three_layers, tmp_path):
    db = tmp_path / "study.db"
    first = search(three_layers, trials=6, seed=3, study_db=str(db))
    assert first.trials == 6 and first.storage.startswith("sqlite:///")
    again = search(three_layers, trials=10, seed=3, study_db=str(db))   # runs only the 4 missing trials
    assert again.trials == 10 and again.study_name == first.study_name
    assert again.best.score >= first.best.score
    import optuna
    study = optuna.load_study(study_name=first.study_name, storage=first.storage)
    assert len(study.trials) == 10
    assert study.trials[0].params["skew_weight"] == 0.0          # the greedy plan was enqueued first


def test_larger_budget_started_from_smaller_plan_is_never_slower(three_layers):
    small = search(three_layers, trials=20, seed=0)
    import dataclasses
    bigger = three_layers.replace(budget=dataclasses.replace(three_layers.budget, ram=three_layers.budget.ram * 2))
    big = search(bigger, trials=5, seed=1, start=small.best.placement, start_knobs=small.best.knobs)
    assert big.best.score >= small.best.score


def test_search_result_respects_capacity_and_reports_greedy(two_layers):
    r = search(two_layers, trials=30, seed=0, objective="mix", mix_weight=0.3)
    assert r.best.footprint.fits(two_layers.budget)
    assert r.best.score >= r.greedy.score
    p = r.best.prediction
    assert r.best.score == pytest.approx(p.decode_tok_s ** 0.3 * p.prefill_tok_s ** 0.7)


@pytest.mark.parametrize("kw, field", [({"objective": "latency"}, "--objective"), ({"trials": 0}, "--trials"),
                                       ({"mix_weight": 1.5}, "--mix-weight"), ({"study_db": "postgresql://x"}, "--study-db")])
def test_bad_search_arguments(two_layers, kw, field):
    with pytest.raises(UserError) as e:
        search(two_layers, **kw)
    assert e.value.where == field
