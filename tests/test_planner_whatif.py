"""What would help a plan: re-planned budgets and links are never worse than keeping the plan, the VRAM
sweep brackets the plan's own prediction, and `strata-plan what-if` prints the same analysis."""
from __future__ import annotations

import json

import pytest

from strata_plan.cli import main
from strata_plan.errors import UserError
from strata_plan.planner.capacity import Budget
from strata_plan.planner.make import problem_for_plan
from strata_plan.planner.make import make_plan
from strata_plan.core.plan import save_plan
from strata_plan.planner.whatif import CHANGES, SWEEP_FACTORS, what_if

TRIALS = 8


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """Mixtral with 10 GB of VRAM and 4 GB of pinned RAM: a fifth of its expert reads come from NVMe."""
    plan = make_plan("rtx-4090", "mixtral-8x7b", prior="olmoe-like", vram_gb=10, ram_gb=4, trials=12)
    path = save_plan(plan, tmp_path_factory.mktemp("whatif") / "plan.yaml")
    problem = problem_for_plan(plan, str(path))
    steps = []
    result = what_if(plan, problem, trials=TRIALS, on_step=lambda done, total: steps.append((done, total)))
    return plan, problem, result, steps, str(path)


def test_no_change_is_worse_than_keeping_the_plan(case):
    plan, _, result, _, _ = case
    assert result.base.decode_tok_s == plan.predicted.decode_tok_s
    assert [c.label for c in result.changes] == [c.label for c in CHANGES]
    for c in result.changes:
        assert c.score >= result.base.score * (1 - 1e-9), c
    assert [c.score for c in result.ranked] == sorted((c.score for c in result.changes), reverse=True)


def test_more_ram_helps_a_plan_that_reads_from_nvme(case):
    plan, _, result, _, _ = case
    assert plan.predicted.nvme_share > 0.05
    ram = next(c for c in result.changes if "RAM" in c.label)
    assert ram.decode_tok_s > plan.predicted.decode_tok_s * 1.05


def test_the_vram_sweep_brackets_the_plan(case):
    plan, problem, result, _, _ = case
    b = problem.budget
    assert [p.vram_gb for p in result.sweep] == [int(b.vram * f) / 1e9 for f in SWEEP_FACTORS]
    mine = [p for p in result.sweep if p.is_plan]
    assert len(mine) == 1 and mine[0].decode_tok_s == plan.predicted.decode_tok_s
    for p in result.sweep:
        if p.vram_gb * 1e9 > b.vram:
            assert p.decode_tok_s >= plan.predicted.decode_tok_s * (1 - 1e-9)
        if not p.fits:                                  # "does not fit" means the planner refuses that budget
            with pytest.raises(UserError, match="working set"):
                problem.replace(budget=Budget(int(p.vram_gb * 1e9), b.ram, b.nvme, b.reserve))
    assert not result.sweep[0].fits and result.sweep[-1].fits


def test_progress_is_reported_and_can_stop_the_analysis(case):
    plan, problem, _, steps, _ = case
    total = len(CHANGES) + len(SWEEP_FACTORS)
    assert steps == [(i, total) for i in range(1, total + 1)]

    class Stop(Exception):
        pass

    def stop(done, total):
        if done == 2:
            raise Stop
    with pytest.raises(Stop):
        what_if(plan, problem, trials=2, on_step=stop)


def test_cli_prints_the_same_analysis(case, capsys):
    _, _, result, _, path = case
    assert main(["what-if", path, "--trials", str(TRIALS), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["label"] == "predicted"
    assert [c["score"] for c in data["changes"]] == pytest.approx([c.score for c in result.changes], rel=1e-12)
    assert main(["what-if", path, "--trials", "0"]) == 2
    assert "--trials" in capsys.readouterr().err
