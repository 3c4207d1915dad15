"""compare-tables: the seed's table beside our predictions. Fails when a prediction exceeds its bound or
breaks monotonicity (a faster link for a fixed plan; a larger budget for a search started from the smaller
budget's plan), and the checks themselves are shown to catch both."""
from __future__ import annotations

import pytest

from strata_plan.planner import compare
from strata_plan.planner.compare import ONE_GPU_PROFILES, SEED_CLAIMS, compare_tables, to_markdown

TRIALS, TOKENS = 6, 512        # small and fixed: this test is part of the README's test command


PROGRESS: list[tuple[str, int, int]] = []      # compare_tables' progress calls (what, done, total)


@pytest.fixture(scope="module")
def table():
    return compare_tables(profiles=ONE_GPU_PROFILES, trials=TRIALS, tokens=TOKENS,   # two GPUs: test_planner_compare_multi
                          progress=lambda *call: PROGRESS.append(call))


def test_every_prediction_within_bound_and_monotone(table):
    assert table.failures == ()
    total = TRIALS * 3 * len(ONE_GPU_PROFILES)          # uniform, skewed and 2x RAM searches a profile: every trial
    assert [c[1] for c in PROGRESS] == list(range(total + 1)) and {c[2] for c in PROGRESS} == {total}
    assert [r.profile for r in table.rows] == ["rtx-4090", "rtx-5090", "a100-80g", "h100-80g", "rtx-pro-6000"]
    for r in table.rows:
        for case in (r.uniform, r.skewed, r.more_ram):
            assert 0 < case.decode_tok_s <= case.bound_decode_tok_s
            assert 0 < case.prefill_tok_s <= case.bound_prefill_tok_s
        assert r.more_ram.decode_tok_s >= r.skewed.decode_tok_s
        assert r.claim == SEED_CLAIMS[r.profile]


def test_needed_hit_rates_follow_the_physics(table):
    rows = {r.profile: r for r in table.rows}
    # a 24 GB card must stream ~20 GB of dense weights per token over ~24 GB/s: 4 tok/s is out of reach
    assert rows["rtx-4090"].needs.decode_vram_hit is None
    # the seed's tested row claims 10.8 tok/s; its NVMe (2.6 GB/s) allows ~0.24 GB per token of ~13.6 GB
    assert rows["rtx-pro-6000"].needs.decode_off_nvme > 0.95
    for r in table.rows:
        n = r.needs
        assert all(v is None or 0.0 <= v <= 1.0 for v in (n.decode_vram_hit, n.decode_off_nvme,
                                                           n.prefill_vram_hit, n.prefill_off_nvme))


def test_markdown_table(table):
    md = to_markdown(table)
    assert md.count("\n| rtx-4090 |") == 2 and "| 10.8 |" in md and "| 36.8 |" in md and "| 4-5.5 |" in md
    assert "olmoe-like" in md and "predictions, not measurements" in md and "FAILED" not in md


def test_machine_bound_and_estimated_inputs_columns(table):
    md = to_markdown(table)
    assert "machine bound, uniform / olmoe-like" in md and "estimated input binding" in md
    assert "predicted at a typical alternative" in md
    rows = {r.profile: r for r in table.rows}
    for r in table.rows:
        for case in (r.uniform, r.skewed):
            assert case.bound_decode_tok_s <= case.machine_decode_tok_s * (1 + 1e-9)
            assert case.bound_prefill_tok_s <= case.machine_prefill_tok_s * (1 + 1e-9)
    # the PRO 6000 row rests on an estimated 2.6 GB/s NVMe: a Gen4 drive's 7 GB/s predicts the plan faster
    pro = rows["rtx-pro-6000"].skewed
    assert pro.decode_binding == "nvme" and pro.decode_estimate.startswith("NVMe random reads")
    assert "7 GB/s" in pro.decode_alternative and pro.decode_at_alternative > 2 * pro.decode_tok_s


def test_checks_catch_a_bound_violation_and_a_slower_fast_link(monkeypatch):
    real_bound, real_scale = compare.physical_bound, compare.scale_links

    def tight_bound(problem, placement):         # a bound 10x too low: every prediction "exceeds" it
        import dataclasses
        b = real_bound(problem, placement)
        return dataclasses.replace(b, decode_tok_s=b.decode_tok_s / 10)

    monkeypatch.setattr(compare, "physical_bound", tight_bound)
    monkeypatch.setattr(compare, "scale_links", lambda profile, **kw: real_scale(profile, **{k: 1 / v for k, v in kw.items()}))
    bad = compare_tables(profiles=["a100-80g"], trials=2, tokens=256)
    assert any("exceeds the physical bound" in f for f in bad.failures)
    assert any("predicts decode_tok_s" in f for f in bad.failures)
    assert "FAILED" in to_markdown(bad)

