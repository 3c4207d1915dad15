"""compare-tables' two-GPU rows (the seed's 2x RTX 4090 and 2x PRO 6000 / 2x H100 rows): the same columns
and checks as the one-GPU rows, and a second GPU never predicted (nor its machine bound) below the first GPU
alone. A deliberately broken two-GPU cost model is caught."""
from __future__ import annotations

import pytest

from strata_plan.planner import compare
from strata_plan.planner.compare import SEED_CLAIMS, TWO_GPU_PROFILES, compare_tables, to_markdown

TRIALS, TOKENS = 6, 512


PROGRESS: list[tuple[str, int, int]] = []      # compare_tables' progress calls (what, done, total)


@pytest.fixture(scope="module")
def table():
    return compare_tables(profiles=TWO_GPU_PROFILES, trials=TRIALS, tokens=TOKENS,
                          progress=lambda *call: PROGRESS.append(call))


def test_two_gpu_rows_within_bounds_never_below_one_gpu_and_in_markdown(table):
    assert table.failures == ()
    assert [r.profile for r in table.rows] == ["rtx-4090-x2", "rtx-pro-6000-x2", "h100-nvl-x2"]
    total = TRIALS * 5 * len(TWO_GPU_PROFILES)   # first GPU and both, per routing, and 2x RAM: every trial counted
    assert [c[1] for c in PROGRESS] == list(range(total + 1)) and {c[2] for c in PROGRESS} == {total}
    for r in table.rows:
        assert r.n_gpus == 2 and r.claim == SEED_CLAIMS[r.profile]
        for case in (r.uniform, r.skewed, r.more_ram):
            assert 0 < case.decode_tok_s <= case.bound_decode_tok_s <= case.machine_decode_tok_s * (1 + 1e-9) or \
                case is r.more_ram
        assert r.skewed.decode_tok_s >= r.one_gpu.decode_tok_s * (1 - 1e-12)
    assert SEED_CLAIMS["rtx-4090-x2"].decode == (7.5, 9.0) and SEED_CLAIMS["h100-nvl-x2"].decode == (18.0, 22.0)
    # the markdown (one test with the table: under xdist a second test could build the module fixture again)
    md = to_markdown(table)
    assert md.count("\n| rtx-4090-x2 |") == 2 and "| 7.5-9 |" in md and "| 18-22 |" in md
    assert "2x NVIDIA H100 NVL (2x 94 GB" in md and "first GPU alone" in md and "FAILED" not in md


def test_a_broken_two_gpu_cost_model_is_caught(monkeypatch):
    """A cost model that predicts split plans 10x faster than physics: compare-tables' case check flags it."""
    import dataclasses

    from strata_plan.planner.capacity import Budget
    from strata_plan.planner.cost import CostModel
    from strata_plan.planner.search import search
    from strata_plan.planner.testing import tiny_problem
    from strata_plan.profiles.schema import load_profile
    p = tiny_problem(profile="rtx-pro-6000", vram_experts=3.0, ram_experts=3.0)
    b = p.budget
    p2 = p.replace(profile=load_profile("h100-nvl-x2"), budget=Budget(2 * b.vram, b.ram, b.nvme, b.reserve, (b.vram,) * 2))
    real = CostModel.predict

    def fast(self, placement):
        pred = real(self, placement)
        return dataclasses.replace(pred, decode_tok_s=pred.decode_tok_s * 10) if placement.gpu_split else pred
    monkeypatch.setattr(CostModel, "predict", fast)
    result = search(p2, trials=4, seed=0)
    assert result.best.placement.gpu_split
    failures: list[str] = []
    compare._case("uniform", p2, result, "tiny/h100-nvl-x2", failures)
    assert any("exceeds the physical bound" in f for f in failures)
