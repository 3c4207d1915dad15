"""Search monotone in the budget: a sweep of budgets (search.sweep_budgets), each search started from the
best plan of the smaller budgets, never predicts a slower plan for more of any resource; `plan`'s ladder
(search.search_ladder) is never slower than its smaller budgets' plans."""
from __future__ import annotations

import numpy as np
import pytest

from strata_plan.planner.capacity import Budget
from strata_plan.planner.search import search_ladder, sweep_budgets
from strata_plan.planner.testing import tiny_problem


@pytest.fixture(scope="module")
def problem():
    return tiny_problem(skews=(1.4, 0.5, 0.0), vram_experts=3, ram_experts=3, locality=0.4)


def test_budget_sweep_is_monotone(problem):
    b, slot = problem.budget, problem.slot_bytes
    budgets = [Budget(int(b.vram + dv * slot), int(b.ram + dr * slot), b.nvme, b.reserve)
               for dv in np.linspace(-1, 6, 8) for dr in (0, 3)]
    results = sweep_budgets(problem, budgets, trials=6, seed=0, polish_evals=60)
    assert sum(r is not None for r in results) >= 12
    for i, bi in enumerate(budgets):
        for j, bj in enumerate(budgets):
            ri, rj = results[i], results[j]
            if ri is not None and bi.vram <= bj.vram and bi.ram <= bj.ram:
                assert rj is not None and rj.best.score >= ri.best.score * (1 - 1e-12), (bi, bj)


def test_ladder_never_slower_than_its_smaller_budgets(problem):
    calls = []
    res = search_ladder(problem, trials=16, seed=0, on_trial=lambda n, v: calls.append(n))
    assert len(calls) == 16                      # the ladder's trials come out of the same count
    steps = sweep_budgets(problem, [problem.budget.scaled(f) for f in (0.8, 0.9)], trials=2, seed=0)
    assert all(s is None or res.best.score >= s.best.score * (1 - 1e-12) for s in steps)
    assert res.best.footprint.fits(problem.budget)
