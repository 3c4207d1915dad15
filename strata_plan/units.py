"""Byte counts as people read them (GB = 1e9 bytes): enough digits that two different figures never print
the same, and small ones in MB or kB rather than as "0.00 GB"."""
from __future__ import annotations

UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def _unit(n: float) -> tuple[str, float]:
    return next(((u, s) for u, s in UNITS if abs(n) >= s), ("B", 1.0))


def _sig(v: float, digits: int) -> str:
    return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"


def fmt_bytes(n: float, digits: int = 3) -> str:
    """`n` bytes with `digits` significant digits in the largest unit it reaches: 2e6 -> '2 MB'."""
    unit, scale = _unit(n)
    return f"{_sig(n / scale, digits)} {unit}"


def fmt_bytes_pair(a: float, b: float, digits: int = 3) -> tuple[str, str]:
    """`a` and `b` in one unit (the larger's) and with the same decimals: `digits` significant digits of the
    larger, more when that prints two different figures alike: (24.0004e9, 24.001e9) -> ('24.000 GB',
    '24.001 GB'); (2e6, 2.1e6) -> ('2.00 MB', '2.10 MB')."""
    unit, scale = _unit(max(abs(a), abs(b)))
    x, y = a / scale, b / scale
    decimals = max(0, digits - len(str(int(max(abs(x), abs(y))))))
    while decimals < 12 and a != b and f"{x:.{decimals}f}" == f"{y:.{decimals}f}":
        decimals += 1
    return f"{x:.{decimals}f} {unit}", f"{y:.{decimals}f} {unit}"
