"""The heat strip and the bar plot draw what they are given: one cell per layer (or group of layers),
brightness by share, bars in proportion with their values on top."""
from __future__ import annotations

from strata_plan.tui.widgets import Bar, BarPlot, LayerTiers, TierMap


def test_many_layers_are_grouped_and_few_are_widened():
    many = [LayerTiers(i, 1, 100, 283) for i in range(92)]
    w = TierMap()
    w.set_layers(many)
    assert w.geometry(80) == (2, 1)                     # 92 layers in 74 columns: two per cell
    w.set_layers(many[:32])
    assert w.geometry(80) == (1, 2)                     # 32 layers: two characters each


def test_cells_show_each_tiers_share():
    w = TierMap()
    w.set_layers([LayerTiers(0, 8, 0, 0), LayerTiers(1, 0, 4, 4), LayerTiers(2, 0, 0, 8)])
    rows = w.render().plain.splitlines()
    cells = lambda row: row[TierMap.LABEL:]  # noqa: E731
    w_ = w.geometry(80)[1]
    assert cells(rows[0]) == "█" * w_ + "·".center(w_) * 2          # VRAM: only layer 0
    assert cells(rows[1]) == "·".center(w_) + "█" * w_ + "·".center(w_)
    assert cells(rows[2]) == "·".center(w_) + "█" * (2 * w_)
    assert rows[3].split() == ["0", "1", "2"]


def test_bars_are_proportional_and_missing_values_are_marked():
    p = BarPlot(rows=6)
    p.set_bars([Bar("a", None), Bar("b", 5.0), Bar("c", 10.0, highlight=True)])
    lines = p.render().plain.splitlines()
    assert len(lines) == 6
    columns = [line[i * 26:(i + 1) * 26] for line in lines[:-1] for i in range(3)]
    heights = [sum("█" in columns[r * 3 + i] for r in range(5)) for i in range(3)]
    assert heights == [0, 2, 4]                          # 10 fills the 4 bar rows under its label, 5 half
    assert "×" in "".join(columns[i] for i in range(0, 15, 3))
    assert "10" in lines[0] and lines[-1].split() == ["a", "b", "c"]
