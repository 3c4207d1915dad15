"""The drive beside an engine row: a plain O_DIRECT read of the row's blob files just before and just after it, at
the profile's measured point nearest the blobs (threads as the queue depth, as the profiler measures), and that
rate over the profile's figure at the same point.

    probe = DriveProbe(packed_folder, blob_bytes, profile)   # no NVMe in the profile: probe.point is None
    before = probe.read(); ...row...; after = probe.read()
    probe.factor(before, after)                       # (before + after) / 2 / the profile's GB/s at probe.point

A virtual disk's rate moves between the rows of one call (the H100 machine: demand reads landing in 0.28 to 0.38 ms
across four runs of one configuration, its GPU wait per token moving with them); predicting a row with the profile's
NVMe surfaces times this factor (`planner.estimated.scale_links`) separates the drive's moves from the engine's
own misses. A measurement, not a fit: nothing of the row's own timings enters it.
"""
from __future__ import annotations

from pathlib import Path

QUEUE_DEPTH = 8            # near the stager's reads in flight; the point read is the profile's measured one
PROBE_BYTES = 128 << 20    # each side of a row: about 65 ms at 2 GB/s


class DriveProbe:
    def __init__(self, packed: Path, blob_bytes: float, profile, queue_depth: int = QUEUE_DEPTH,
                 nbytes: int = PROBE_BYTES):
        """`packed`: the packed folder whose experts-*.bin files the probe reads; `blob_bytes`: its mean NVMe blob
        (the point's block is the profile's measured one nearest it); `profile`: the HardwareProfile predicted with."""
        self.files = sorted(Path(packed).glob("experts-*.bin"))
        self.nbytes = nbytes
        self.point = None       # (block, queue depth, GB/s): the profile's measured point the probe repeats
        if profile.nvme and self.files:
            self.point = tuple(profile.nvme[0].rand_read.nearest_point(int(blob_bytes), queue_depth))

    def read(self, seed: int = 0) -> float | None:
        """GB/s of a plain O_DIRECT read at the probe's point now; None without a point."""
        if self.point is None:
            return None
        from strata_plan.engine.directio import plain_read_gbps
        block, qd, _ = self.point
        return plain_read_gbps(self.files, block, threads=qd, nbytes=self.nbytes, seed=seed)

    def factor(self, *reads: float | None) -> float | None:
        """The mean of `reads` over the profile's figure at the probe's point; None when any is missing."""
        if self.point is None or any(r is None for r in reads) or not reads:
            return None
        return sum(reads) / len(reads) / self.point[2]
