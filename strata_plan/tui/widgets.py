"""Widgets the wizard draws with: the step bar, the per-layer tier heat strip, and a small bar plot.

They render Rich `Text` from plain data and know nothing about the planner; colours come from the app's
theme variables where Textual exposes them and from fixed tier colours otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rich.text import Text
from textual.color import Color
from textual.widget import Widget
from textual.widgets import Static

STEPS = ("Hardware", "Model", "Search", "Result", "Save")
TIER_COLORS = {"VRAM": "#4fc35b", "RAM": "#e0a93a", "NVMe": "#d9534f"}
EMPTY = Color.parse("#2a2a2a")
BLOCKS = " ▁▂▃▄▅▆▇█"


class StepBar(Static):
    """`1 Hardware > 2 Model > ...` with the current step highlighted and the finished ones marked."""

    def __init__(self, step: int, **kw) -> None:
        super().__init__(self._text(step), **kw)

    @staticmethod
    def _text(step: int) -> Text:
        t = Text()
        for i, name in enumerate(STEPS):
            if i:
                t.append(" › ", style="dim")
            style = "bold reverse" if i == step else ("" if i < step else "dim")
            t.append(f" {i + 1} {name} ", style=style)
        return t


@dataclass(frozen=True)
class LayerTiers:
    layer: int          # decoder layer index
    vram: int
    ram: int
    nvme: int

    @property
    def n(self) -> int:
        return self.vram + self.ram + self.nvme


class TierMap(Widget):
    """Heat strip: one row per tier, one cell per MoE layer (or per group of layers when they outnumber the
    columns); the brighter the cell, the larger the share of that layer's experts in that tier."""

    LABEL = 6

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._layer_tiers: tuple[LayerTiers, ...] = ()

    @property
    def tiers(self) -> tuple[LayerTiers, ...]:
        return self._layer_tiers

    def set_layers(self, layers) -> None:
        self._layer_tiers = tuple(layers)
        self.refresh(layout=True)

    def get_content_height(self, container, viewport, width) -> int:
        return 5 if self._layer_tiers else 1

    def geometry(self, width: int) -> tuple[int, int]:
        """(layers per cell, characters per cell) at this width: wide cells for few layers, grouped layers
        when they outnumber the columns."""
        room, n = max(width - self.LABEL, 1), max(len(self._layer_tiers), 1)
        if n <= room:
            return 1, min(3, room // n)
        return math.ceil(n / room), 1

    def render(self) -> Text:
        if not self._layer_tiers:
            return Text("no plan yet", style="dim")
        g, w = self.geometry(self.size.width or 80)
        cells = [self._layer_tiers[i:i + g] for i in range(0, len(self._layer_tiers), g)]
        out = Text(no_wrap=True, overflow="crop")
        for tier, color in TIER_COLORS.items():
            out.append(f"{tier:<{self.LABEL}}", style="bold")
            base = Color.parse(color)
            for cell in cells:
                share = sum(getattr(c, tier.lower()) for c in cell) / max(sum(c.n for c in cell), 1)
                if share <= 0:
                    out.append("·".center(w), style="#555555")
                else:
                    out.append("█" * w, style=EMPTY.blend(base, 0.3 + 0.7 * share).hex)
            out.append("\n")
        out.append(" " * self.LABEL)
        out.append(self._axis(cells, w), style="dim")
        out.append("\n")
        unit = "cell = layer" if g == 1 else f"cell = {g} layers"
        out.append(f"{unit} · brighter: larger share of the layer's experts · '·': none", style="dim")
        return out

    @staticmethod
    def _axis(cells, w: int) -> str:
        """Decoder-layer numbers under the first, middle and last cells."""
        n = len(cells) * w
        axis = [" "] * n
        for i in sorted({0, len(cells) // 2, len(cells) - 1}):
            label = str(cells[i][0].layer)
            start = min(i * w, max(n - len(label), 0))
            if all(c == " " for c in axis[max(start - 1, 0):start + len(label) + 1]):
                axis[start:start + len(label)] = label
        return "".join(axis)[:n]


@dataclass(frozen=True)
class Bar:
    label: str
    value: float | None      # None: no value (drawn as ×)
    highlight: bool = False


class BarPlot(Widget):
    """Vertical bars with their values on top and labels below; `height` rows in all."""

    def __init__(self, rows: int = 8, **kw) -> None:
        super().__init__(**kw)
        self._rows = rows
        self._bars: tuple[Bar, ...] = ()

    @property
    def bars(self) -> tuple[Bar, ...]:
        return self._bars

    def set_bars(self, bars) -> None:
        self._bars = tuple(bars)
        self.refresh(layout=True)

    def get_content_height(self, container, viewport, width) -> int:
        return self._rows if self._bars else 1

    def render(self) -> Text:
        if not self._bars:
            return Text("computing…", style="dim")
        n = len(self._bars)
        slot = max(3, (self.size.width or 80) // n)
        width = slot - 1
        top = max((b.value or 0.0 for b in self._bars), default=0.0) or 1.0
        body = self._rows - 1                                   # bars with their values on top; labels below
        eighths = [round((b.value or 0.0) / top * (body - 1) * 8) for b in self._bars]
        out = Text(no_wrap=True, overflow="crop")
        grid: list[list[tuple[str, str]]] = [[(" " * slot, "")] * n for _ in range(body)]
        for i, (b, e) in enumerate(zip(self._bars, eighths)):
            color = "bold #4fc35b" if b.highlight else "#5b8fd9"
            full, part = divmod(e, 8)
            for r in range(full):
                grid[body - 1 - r][i] = ("█" * width + " ", color)
            if part and full < body:
                grid[body - 1 - full][i] = (BLOCKS[part] * width + " ", color)
            label_row = body - 1 - full - (1 if part else 0)
            text = "×" if b.value is None else f"{b.value:.3g}"
            if label_row >= 0:
                grid[label_row][i] = (text[:width].center(width) + " ", "bold" if b.highlight else "")
        for row in grid:
            for seg, style in row:
                out.append(seg, style=style)
            out.append("\n")
        for b in self._bars:
            out.append(b.label[:width].center(width) + " ", style="bold" if b.highlight else "dim")
        return out
