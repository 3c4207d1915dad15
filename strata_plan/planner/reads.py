"""NVMe expert reads as the expert store issues them: sub-reads per expert, experts in flight, seconds.

The store reads one packed expert blob of format f as `split` O_DIRECT requests of
ceil(bytes / split / 4 KiB) x 4 KiB each, and keeps the requests of up to `in_flight` experts outstanding
at once (queue depth `in_flight x split`). At decode a layer's misses are all known after its router, so
the store submits them together (in_flight = top_k); prefill keeps every staging slot busy.

The drive's rate at (block, queue depth) comes from the profile's `rand_read` surface, read through an
envelope the store can always reach:

    R_env(q)  = max over measured depths q' <= q of R(block, q')     (the store may hold fewer requests),
                linear in q between measured depths, q / q_min x R_env(q_min) below the smallest
    R*(q)     = min over q' <= q of R_env(q') x q / q'                (Little's law: per-request rate never
                                                                      grows with depth)

so R* never falls with depth and R*(q) / q never rises. The seconds to read i experts of one format
together are then

    T_f(i) = i x bytes_f / R*(block_f, i x split_f),   i = 1 .. in_flight,   T_f(0) = 0,

non-decreasing in i, read at a fractional expected count n by linear interpolation (n < 1: a miss with
probability n). The split of each format is chosen per batch size (the fastest for i experts together), so it
does not depend on the placement. A batch of experts of several formats
takes the longer of each format's own batch time and the bytes at the full queue's rate:

    T(n_f) = max( max_f T_f(n_f),  sum_f n_f x T_f(in_flight) / in_flight ).

This module knows nothing about placements; cost.py reads batches of expected misses through it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata_plan.kernels.formats import EXPERT_ALIGN

NVME_SPLITS = (1, 2, 4, 8, 16)   # sub-reads per expert the store may issue to deepen the NVMe queue
TINY_RATE = 1.0                  # bytes/s standing in for a tier the machine lacks (an NVMe-less profile)


def sub_read_bytes(nbytes: int, split: int) -> int:
    """Bytes of one of the `split` O_DIRECT requests of an expert blob of `nbytes` (4 KiB multiples)."""
    return -(-nbytes // split // EXPERT_ALIGN) * EXPERT_ALIGN


def envelope_rates(rate, depths: tuple[int, ...], block: int, max_depth: int) -> np.ndarray:
    """[max_depth + 1] bytes/s R*(block, q) for q = 0 .. max_depth (index 0 unused, 0.0), from `rate(block,
    q)` (bytes/s) at the measured queue `depths`; see the module doc. No depths (no drive): TINY_RATE."""
    out = np.zeros(max_depth + 1)
    if not depths:
        out[1:] = TINY_RATE
        return out
    q = np.arange(1, max_depth + 1)
    d = np.array(sorted(depths), dtype=np.float64)
    measured = np.maximum.accumulate(np.array([rate(block, int(x)) for x in d]))    # the store may hold fewer
    env = np.where(q < d[0], measured[0] * q / d[0], np.interp(q, d, measured))     # linear between depths
    per_request = np.minimum.accumulate(env / q)          # R*(q) / q never rises
    out[1:] = np.minimum(env, per_request * q)
    return out


@dataclass(frozen=True)
class ExpertRead:
    """How the store reads experts of one format, and the seconds a batch of them takes."""

    fmt: str
    nbytes: int
    splits: tuple[int, ...]         # sub-reads per expert when i experts are read together, i = 1 .. in_flight
    times: tuple[float, ...]        # seconds to read i experts together, i = 0 .. in_flight

    @property
    def in_flight(self) -> int:
        return len(self.splits)

    @property
    def split(self) -> int:
        """Sub-reads per expert at a full batch (in_flight experts together)."""
        return self.splits[-1]

    @property
    def queue_depth(self) -> int:
        """Requests outstanding when `in_flight` experts of this format are read together."""
        return self.in_flight * self.split

    @property
    def block(self) -> int:
        return sub_read_bytes(self.nbytes, self.split)

    @property
    def seconds_per_expert(self) -> float:
        """At a full queue (in_flight experts outstanding): what a long stream of reads costs each expert."""
        return self.times[-1] / self.in_flight

    @property
    def full_rate(self) -> float:
        """Bytes/s with `in_flight` experts outstanding."""
        return self.in_flight * self.nbytes / self.times[-1]

    def seconds(self, n: np.ndarray) -> np.ndarray:
        """Seconds to read n experts (fractional, expected) together; beyond in_flight, full-queue batches."""
        n = np.asarray(n, dtype=np.float64)
        t = np.asarray(self.times)
        inside = np.interp(np.minimum(n, self.in_flight), np.arange(self.in_flight + 1), t)
        return inside + np.maximum(n - self.in_flight, 0.0) * self.seconds_per_expert


def expert_read(rate, depths: tuple[int, ...], fmt: str, nbytes: int, in_flight: int,
                min_block: int = 0) -> ExpertRead:
    """For each batch size i = 1 .. in_flight, the split of `NVME_SPLITS` that reads i experts together
    fastest (ties: fewer sub-reads), and those seconds (`rate`, `depths`: as `envelope_rates` reads them).
    The minimum of non-decreasing batch times is non-decreasing, so more misses never read faster. Splits whose
    sub-reads are smaller than `min_block` (the smallest block the profile measured) are not taken: below it the
    rate is a line through two larger blocks' times (a latency of about 10 us on the H100 machine's virtual
    disk), and the stager's host time a sub-read, which is not in the surface, dominates there
    (benchmarks/tools/split_ab.py: a 49 KB blob read in 0.14 ms whole, 0.58 ms as 2 sub-reads, 1.9 ms as 16)."""
    i = np.arange(1, in_flight + 1)
    splits = [sp for sp in NVME_SPLITS if sp == 1 or sub_read_bytes(nbytes, sp) >= min_block]
    table = []
    for split in splits:
        rates = envelope_rates(rate, depths, sub_read_bytes(nbytes, split), in_flight * split)
        table.append(i * nbytes / rates[i * split])
    table = np.array(table)                                   # [splits, in_flight]
    pick = np.argmin(table * (1 + 1e-12 * np.arange(len(splits)))[:, None], axis=0)
    times = table[pick, i - 1]
    return ExpertRead(fmt, int(nbytes), tuple(splits[j] for j in pick), (0.0, *map(float, times)))


def batch_seconds(reads: list[ExpertRead], counts: np.ndarray) -> np.ndarray:
    """Seconds to read batches of experts of several formats together: counts [F, ...] expected experts of
    each format in `reads` order -> [...]: the longer of each format's own batch and the full-queue bytes."""
    own = np.max([r.seconds(c) for r, c in zip(reads, counts)], axis=0)
    stream = np.sum([c * r.seconds_per_expert for r, c in zip(reads, counts)], axis=0)
    return np.maximum(own, stream)
