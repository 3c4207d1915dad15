"""Repeats, medians, spreads and the provenance of measured figures."""
import pytest

from strata_plan import __version__
from strata_plan.profiler.timing import Stats, interleaved, measured, measured_curve, measured_surface, today


def test_stats_median_and_spread():
    st = Stats((10.0, 12.0, 11.0, 9.0, 10.5))
    assert st.median == 10.5
    assert st.spread == pytest.approx((12.0 - 9.0) / 10.5)
    assert st.repeats == 5
    assert Stats((3.0,)).spread == 0.0
    with pytest.raises(ValueError):
        Stats(())


def test_interleaved_visits_every_key_once_per_round():
    order, ticks = [], []
    stats = interleaved(["a", "b", "c"], lambda k: order.append(k) or float(len(order)), 3, lambda: ticks.append(1))
    assert order == ["a", "b", "c"] * 3          # round-robin, not a, a, a, b, b, b
    assert stats["a"].samples == (1.0, 4.0, 7.0)
    assert len(ticks) == 9


def test_measured_figures_carry_date_version_and_spread():
    f = measured(12.345678, "a method", Stats((12.0, 13.0, 12.5)))
    assert f.provenance == "measured" and f.date == today()
    assert f.value == 12.3457
    assert __version__ in f.source and "a method" in f.source and "3 interleaved repeats" in f.source
    assert "spread <= 8.0%" in f.source
    c = measured_curve({1 << 20: Stats((5.0, 6.0)), 4096: Stats((1.0,))}, "copies")
    assert [s for s, _ in c.points] == [4096, 1 << 20] and c.provenance == "measured"
    s = measured_surface({(1 << 20, 8): Stats((2.0,)), (1 << 20, 1): Stats((1.0,))}, "reads")
    assert s.queue_depths == (1, 8) and s.at(1 << 20, 8) == 2.0
