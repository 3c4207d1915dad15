"""Repeats and their summary: the median, and the spread that says how far to trust it.

Every figure the profiler writes is the median of several repeats. Repeats of different settings are
interleaved (all sizes once, then all sizes again, ...), as nvbandwidth and fio do, so a slow drift of the
machine (clocks, a neighbour's load) spreads over every setting instead of biasing the last one.
GB = 1e9 bytes throughout.
"""
from __future__ import annotations

import datetime as _dt
import statistics
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from strata_plan import __version__
from strata_plan.profiles.schema import Curve, Figure, Surface

GB = 1e9
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclass(frozen=True)
class Stats:
    """Repeated measurements of one quantity (GB/s, or any rate)."""

    samples: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("Stats needs at least one sample")

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(max - min) / median: the relative range of the repeats (0.03 = 3%)."""
        m = self.median
        return (max(self.samples) - min(self.samples)) / m if m > 0 else 0.0

    @property
    def repeats(self) -> int:
        return len(self.samples)

    def to_dict(self) -> dict:
        return {"median": round(self.median, 4), "spread": round(self.spread, 4), "repeats": self.repeats,
                "samples": [round(s, 4) for s in self.samples]}


def interleaved(keys: Iterable[Hashable], measure: Callable[[Hashable], float], repeats: int,
                tick: Callable[[], None] | None = None) -> dict[Hashable, Stats]:
    """Measure every key once per round, `repeats` rounds; return the Stats of each key."""
    keys = list(keys)
    samples: dict[Hashable, list[float]] = {k: [] for k in keys}
    for _ in range(repeats):
        for k in keys:
            samples[k].append(measure(k))
            if tick:
                tick()
    return {k: Stats(tuple(v)) for k, v in samples.items()}


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of `fn` takes on the monotonic high-resolution clock."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def today() -> str:
    return _dt.date.today().isoformat()


def _tag(method: str, stats: Iterable[Stats] = ()) -> str:
    stats = list(stats)
    tail = ""
    if stats:
        n = min(s.repeats for s in stats)
        worst = max(s.spread for s in stats)
        tail = f"; median of {n} interleaved repeats, spread <= {worst:.1%}"
    return f"strata-plan {__version__} profile: {method}{tail}"


def measured(value: float, method: str, stats: Stats | None = None) -> Figure:
    """A Figure marked measured today, its source naming the method, version and spread."""
    return Figure(round(float(value), 4), "measured", _tag(method, [stats] if stats else []), today())


def measured_curve(stats_by_size: dict[int, Stats], method: str) -> Curve:
    points = tuple((int(s), round(st.median, 3)) for s, st in sorted(stats_by_size.items()))
    return Curve(points, "measured", _tag(method, stats_by_size.values()), today())


def measured_surface(stats: dict[tuple[int, int], Stats], method: str) -> Surface:
    points = tuple((int(b), int(q), round(st.median, 4)) for (b, q), st in sorted(stats.items()))
    return Surface(points, "measured", _tag(method, stats.values()), today())
