"""Host RAM: size, multi-threaded copy bandwidth (STREAM's Copy), and how much memory can be pinned.

Copy bandwidth counts bytes read plus bytes written (STREAM's convention: 2 x the array per copy; the
hidden write-allocate read is not counted, so real traffic is a little higher). Arrays are far larger
than any last-level cache and are touched before timing, so neither the cache nor first-touch page
faults are measured.

Pinning is probed in chunks up to a cap the caller chooses and never further: probing until the machine
runs out of memory would push everything else into swap or the OOM killer.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import psutil

from .timing import GB, GiB, Stats, interleaved, timed


@dataclass(frozen=True)
class RamInfo:
    total_bytes: int
    available_bytes: int

    @property
    def total_gb(self) -> float:
        return self.total_bytes / GB

    @property
    def available_gb(self) -> float:
        return self.available_bytes / GB


def ram_info() -> RamInfo:
    vm = psutil.virtual_memory()
    return RamInfo(int(vm.total), int(vm.available))


def copy_threads() -> int:
    """One copying thread per physical core (hyper-threads add no memory bandwidth)."""
    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def memcpy_bandwidth(nbytes: int, threads: int, repeats: int, tick: Callable[[], None] | None = None) -> Stats:
    """GB/s of a parallel copy of `nbytes` (read + write counted): each thread copies one slice with
    numpy, which releases the GIL for the copy."""
    n = max(nbytes // 8, threads)
    src = np.arange(n, dtype=np.uint64)           # touched: every page is resident before timing
    dst = np.ones(n, dtype=np.uint64)
    bounds = np.linspace(0, n, threads + 1, dtype=np.int64)
    slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]

    with ThreadPoolExecutor(threads) as pool:
        def one_copy() -> None:
            list(pool.map(lambda s: np.copyto(dst[s], src[s]), slices))

        one_copy()                                  # warm-up: threads started, TLBs filled
        stats = interleaved([0], lambda _: 2 * src.nbytes / timed(one_copy) / GB, repeats, tick)[0]
    if not np.array_equal(dst[:: max(1, n // 4096)], src[:: max(1, n // 4096)]):
        raise RuntimeError("host copy check failed: destination differs from source")
    return stats


@dataclass(frozen=True)
class PinProbe:
    """How much memory could be pinned, and how fast."""

    pinned_bytes: int            # held at once before the probe stopped
    seconds: float               # spent in the pinning calls
    hit_cap: bool                # True: stopped at the cap (the limit may be higher); False: pinning failed
    error: str = ""

    @property
    def pinned_gb(self) -> float:
        return self.pinned_bytes / GB

    @property
    def rate_gbps(self) -> float:
        return self.pinned_bytes / self.seconds / GB if self.seconds > 0 else 0.0


def probe_pinnable(pin: Callable[[int], Callable[[], None]], cap_bytes: int, chunk_bytes: int = GiB) -> PinProbe:
    """Pin `chunk_bytes` at a time with `pin(n)` (which returns a release function, or raises when the
    memory cannot be pinned) until `cap_bytes` are held or pinning fails; then release everything."""
    releases: list[Callable[[], None]] = []
    held, seconds, error = 0, 0.0, ""
    try:
        while held < cap_bytes:
            n = min(chunk_bytes, cap_bytes - held)
            release = None

            def one() -> None:
                nonlocal release
                release = pin(n)
            try:
                seconds += timed(one)
            except (RuntimeError, OSError, MemoryError) as e:
                error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
                break
            releases.append(release)
            held += n
    finally:
        for release in reversed(releases):
            release()
    return PinProbe(held, seconds, hit_cap=not error, error=error)
