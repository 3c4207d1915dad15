"""How many threads torch computes with, set once when a command that computes with torch starts (`pack`,
`run`, `bench`, `eval`, `profile`).

torch's default (one thread per core) spins every core in its parallel regions. On a machine of two cores
where any other process uses one, each region waits for the busy core: the fixture's `pack` went from 7 s
to 83-224 s, `bench` from 57 s to 25 minutes, and to 7.9 s with `OMP_NUM_THREADS=1`. So:

    usable_cores()        the cores this process may run on: its CPU affinity, capped by a cgroup CPU quota
    torch_threads(cores)  cores - 1 (at least 1) where there are two cores or fewer, else cores
    limit_torch_threads() set torch to that, never above the count torch has (its default, or one set
                          before with torch.set_num_threads), unless the user chose: OMP_NUM_THREADS or
                          MKL_NUM_THREADS in the environment leaves torch as it is
"""
from __future__ import annotations

import math
import os
from pathlib import Path

USER_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota in cores (cgroup v2 `cpu.max`, else v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), or
    None without one."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cores(root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its affinity (all cores where the system has none), capped by the
    cgroup's CPU quota rounded up."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota(root)
    if quota is not None and quota > 0:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def torch_threads(cores: int) -> int:
    """Threads for `cores` usable cores: one core left to the rest of the machine where there are two or
    fewer (at least one thread), all of them otherwise."""
    return max(1, cores - 1) if cores <= 2 else cores


def limit_torch_threads(environ=os.environ) -> int | None:
    """Set torch's thread count to `torch_threads(usable_cores())`, never raising it; returns the count set,
    or None where the user chose (OMP_NUM_THREADS / MKL_NUM_THREADS set) or torch is missing."""
    if any(environ.get(v) for v in USER_VARS):
        return None
    try:
        import torch
    except ImportError:
        return None
    n = min(torch.get_num_threads(), torch_threads(usable_cores()))
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n
