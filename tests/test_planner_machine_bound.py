"""The machine bound (bound.machine_bound): the fastest any placement could go on these links and budgets.
Never below the bound of the searched plan or of random placements on the same inputs, equal to the bound
of the placement it builds, non-decreasing in every link and along budget sweeps (bound.machine_bounds)."""
from __future__ import annotations

import numpy as np
import pytest

from strata_plan.planner.bound import machine_bound, machine_bounds, physical_bound
from strata_plan.planner.capacity import Budget
from strata_plan.planner.estimated import scale_links
from strata_plan.planner.placement import Knobs, allocate
from strata_plan.planner.search import search
from strata_plan.planner.testing import tiny_problem

PROBLEMS = {"skewed-local": dict(skews=(1.4, 0.5, 0.0), vram_experts=4, ram_experts=4, locality=0.4),
            "two-layer": dict(skews=(1.6, 0.0), vram_experts=4, ram_experts=3),
            "six-experts": dict(skews=(1.2, 0.3, 0.0), vram_experts=3, ram_experts=2, n_experts=6, locality=0.3, seed=1)}


@pytest.fixture(scope="module", params=list(PROBLEMS))
def problem(request):
    return tiny_problem(**PROBLEMS[request.param])


def test_equal_to_the_bound_of_the_placement_it_builds(problem):
    mb = machine_bound(problem)
    assert physical_bound(problem, mb.decode_placement).decode_tok_s == mb.decode_tok_s
    assert physical_bound(problem, mb.prefill_placement).prefill_tok_s == mb.prefill_tok_s
    from strata_plan.planner.placement import footprint
    assert footprint(problem, mb.decode_placement).fits(problem.budget)
    assert footprint(problem, mb.prefill_placement).fits(problem.budget)


def test_never_below_any_placement_bound(problem):
    mb = machine_bound(problem)
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(150):
        kn = Knobs(rng.random(), rng.random() * 0.95, rng.random(), int(rng.integers(0, problem.curves.max_depth + 1)))
        a = allocate(problem, kn)
        if not a.footprint.fits(problem.budget):
            continue
        b = physical_bound(problem, a.placement)
        assert b.decode_tok_s <= mb.decode_tok_s * (1 + 1e-9), kn
        assert b.prefill_tok_s <= mb.prefill_tok_s * (1 + 1e-9), kn
        checked += 1
    assert checked > 50
    best = search(problem, trials=20, seed=0).best.placement
    with_plan = machine_bound(problem, extra=(best,))
    assert physical_bound(problem, best).decode_tok_s <= with_plan.decode_tok_s * (1 + 1e-9)


@pytest.mark.parametrize("link", ["pcie", "nvme", "hbm", "compute"])
def test_non_decreasing_in_every_link(problem, link):
    base = machine_bound(problem)
    fast = machine_bound(problem.replace(profile=scale_links(problem.profile, **{link: 1.5})))
    assert fast.decode_tok_s >= base.decode_tok_s * (1 - 1e-12)
    assert fast.prefill_tok_s >= base.prefill_tok_s * (1 - 1e-12)


def test_non_decreasing_along_budget_sweeps(problem):
    b, slot = problem.budget, problem.slot_bytes
    budgets = [Budget(int(b.vram + dv * slot), int(b.ram + dr * slot), b.nvme, b.reserve)
               for dv in np.linspace(0, 8, 17) for dr in (0, 2, 5)]
    mbs = machine_bounds(problem, budgets)
    for i, bi in enumerate(budgets):
        for j, bj in enumerate(budgets):
            if bi.vram <= bj.vram and bi.ram <= bj.ram and mbs[i] is not None:
                assert mbs[j].decode_tok_s >= mbs[i].decode_tok_s * (1 - 1e-12), (bi, bj)
                assert mbs[j].prefill_tok_s >= mbs[i].prefill_tok_s * (1 - 1e-12), (bi, bj)


def test_ranked_bound_is_the_physical_bound(problem):
    from strata_plan.planner.bound import machine_placements, ranked_bound
    for place in machine_placements(problem):
        b = physical_bound(problem, place)
        assert ranked_bound(problem, place) == pytest.approx((b.decode_tok_s, b.prefill_tok_s), rel=1e-9)
