"""Diagnostic (CPU and a drive, under a minute): how long a burst of i O_DIRECT reads issued together on an idle
drive takes, against what the cost model's steady-state surface says.

    python3 benchmarks/tools/burst_read.py [--dir /root] [--size-gib 2] [--blocks 131072,188416]
        [--batches 1,2,4,6] [--repeats 150] [--gap-us 300] [--profile run-profile.yaml] [--split S --blobs B]

At decode a MoE layer's misses are known only after its router, so the stager reads them as one burst on a drive
that idled through the layer before: the GPU waits for the burst's last read. The planner prices that burst from the
profile's `rand_read` surface, measured as a steady stream at a fixed queue depth (planner/reads.py:
T(i) = i x block / R*(block, i)). This issues each burst of i reads of `block` bytes at random aligned offsets of a
fresh test file (out of the page cache), two ways: one `io_submit` (engine/aio.py, the stager's `io="aio"`) and a
pool of i threads each in `os.preadv` (the stager's reader threads, without its queue); then idles `--gap-us`.
Prints per (block, i) the median and p90 of the burst's last completion and the mean completion, beside the
surface's T(i) when `--profile` names a profile YAML. `--split S [--blobs B]`: bursts of i blobs of B bytes read as S
requests each through AIO, a blob's requests adjacent (as the stager reads it) against as many scattered: whether
the kernel merges them (the kimi5 seed plan read faster through AIO than a thread-a-request plain read, 2026-12-06).
`--reread N [--reread-mb 64,256,1024]`: per size, that many MB at random spots (`--blobs`' first size over `--split`
a request, 16 in flight, `directio.plain_read_aio_gbps`) read once, then N rounds of the same spots again against as
many fresh spots: whether anything beneath O_DIRECT (a virtual disk's host) caches what was just read, and how much
(an LRU cache smaller than the set re-read cyclically never hits). `--sustained S`: S seconds of back-to-back reads
of 256 MB at fresh random spots (the same request size and depth), GB/s of each with its start: whether the drive's
rate holds or falls after a burst (a virtual disk's credits). Not a benchmark: no results file.

    python3 benchmarks/tools/burst_read.py --dir /root --split 4 --blobs 27095040 --batches 1,4,8   # kimi5's slot"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from strata_plan.engine.aio import AioContext
from strata_plan.engine.directio import aligned_empty, aligned_view, plain_read_aio_gbps
from strata_plan.profiler.nvme import TestFile, open_reader


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def bursts_aio(fd: int, addrs: list[int], offsets: list[list[int]], block: int, gap: float) -> np.ndarray:
    """[repeats, i] seconds from submit to each read's completion (sorted), one io_submit a burst."""
    ctx = AioContext(len(addrs) + 1)
    out = []
    try:
        for offs in offsets:
            t0 = time.perf_counter()
            ctx.submit([(k, fd, addrs[k], block, o) for k, o in enumerate(offs)])
            done = []
            while len(done) < len(offs):
                for _, res in ctx.wait(1, len(offs), 1.0):
                    if res != block:
                        raise OSError(f"read returned {res} of {block} bytes")
                    done.append(time.perf_counter() - t0)
            out.append(sorted(done))
            spin(gap)
    finally:
        ctx.close()
    return np.array(out)


def bursts_threads(fd: int, views: list[memoryview], offsets: list[list[int]], gap: float) -> np.ndarray:
    """[repeats, i] as `bursts_aio`, each read by its own thread of a pool (os.preadv)."""
    out = []
    with ThreadPoolExecutor(len(views)) as pool:
        for offs in offsets:
            t0 = time.perf_counter()

            def one(k: int) -> float:
                os.preadv(fd, [views[k]], offs[k])
                return time.perf_counter() - t0
            out.append(sorted(pool.map(one, range(len(offs)))))
            spin(gap)
    return np.array(out)


def surface_seconds(profile: str, block: int, i: int) -> float:
    """The cost model's seconds for i reads of `block` together, split 1 (planner/reads.py)."""
    from strata_plan.planner.reads import envelope_rates
    from strata_plan.profiles.schema import load_profile
    disk = load_profile(profile).nvme[0].rand_read
    rates = envelope_rates(lambda b, q: disk.at(b, q) * 1e9, disk.queue_depths, block, i)
    return i * block / rates[i]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/root")
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--blocks", default="131072,188416")
    ap.add_argument("--batches", default="1,2,4,6")
    ap.add_argument("--repeats", type=int, default=150)
    ap.add_argument("--gap-us", type=float, default=300.0)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--split", type=int, default=0, help="also: bursts of i blobs of each --blobs size read as SPLIT "
                    "requests through AIO, a blob's requests adjacent (as the stager reads it) against as many at "
                    "random offsets: does the kernel merge a blob's requests?")
    ap.add_argument("--blobs", default="27095040", help="blob bytes for --split (default: a kimi5 staging slot)")
    ap.add_argument("--reread", type=int, default=0, help="also: N rounds of the same spots read again against "
                    "fresh spots (GB/s through AIO): is what was just read served faster?")
    ap.add_argument("--reread-mb", default="64,256,1024", help="--reread's sizes, MB (at most the file)")
    ap.add_argument("--sustained", type=float, default=0, help="also: this many seconds of back-to-back reads, GB/s "
                    "of each 256 MB: does the rate hold?")
    a = ap.parse_args()
    blocks = [int(x) for x in a.blocks.split(",")]
    batches = [int(x) for x in a.batches.split(",")]
    rng = random.Random(0)
    with TestFile(Path(a.dir), int(a.size_gib * 2**30) // 2**20 * 2**20) as tf:
        fd, direct = open_reader(tf.path)
        print(f"test file {tf.path} {a.size_gib:g} GiB, O_DIRECT {direct}; gap {a.gap_us:g} us; "
              f"{a.repeats} bursts each (times in ms: median / p90 of the last read, mean of all)")
        print(f"{'block':>8} {'i':>3} {'aio last':>16} {'aio mean':>9} {'threads last':>16} {'thr mean':>9} "
              f"{'surface T(i)':>13}")
        for block in blocks:
            for i in batches:
                bufs = [aligned_empty(block, pin=False) for _ in range(i)]
                views = [aligned_view(v) for _, v in bufs]
                addrs = [v.data_ptr() for _, v in bufs]
                n = tf.size // block
                res = {}
                for way in ("aio", "threads", "aio", "threads"):     # interleaved, each twice
                    offs = [[rng.randrange(n) * block for _ in range(i)] for _ in range(a.repeats)]
                    t = (bursts_aio(fd, addrs, offs, block, a.gap_us / 1e6) if way == "aio"
                         else bursts_threads(fd, views, offs, a.gap_us / 1e6))
                    res.setdefault(way, []).append(t)
                cells = []
                for way in ("aio", "threads"):
                    t = np.concatenate(res[way]) * 1e3
                    last = t[:, -1]
                    cells.append(f"{statistics.median(last):7.3f} / {np.percentile(last, 90):6.3f} "
                                 f"{t.mean():9.3f}")
                model = f"{surface_seconds(a.profile, block, i) * 1e3:13.3f}" if a.profile else ""
                print(f"{block:>8} {i:>3} {cells[0]} {cells[1]} {model}", flush=True)
        if a.split > 1:
            split_table(tf, fd, a, batches, rng)
        if a.reread:
            reread_table(tf, a)
        if a.sustained:
            sustained_table(tf, a)
    return 0


def split_table(tf, fd: int, a, batches: list[int], rng: random.Random) -> None:
    """Per blob size and i: a burst of i blobs, each as `a.split` AIO requests, adjacent against scattered."""
    print(f"\nblobs as {a.split} requests through AIO (ms: median / p90 of the last, repeats {max(a.repeats // 5, 10)})")
    print(f"{'blob':>9} {'i':>3} {'adjacent':>16} {'scattered':>16} {'scattered / adjacent':>21}")
    for blob in (int(x) for x in a.blobs.split(",")):
        part = -(-blob // a.split // 4096) * 4096
        for i in batches:
            n_parts = i * a.split
            backing, buf = aligned_empty(n_parts * part, pin=False)
            addrs = [buf.data_ptr() + k * part for k in range(n_parts)]
            res: dict[str, list] = {}
            for way in ("adjacent", "scattered") * 2:
                reps = max(a.repeats // 5, 10)
                if way == "adjacent":
                    starts = [[rng.randrange(tf.size // (part * a.split)) * part * a.split for _ in range(i)]
                              for _ in range(reps)]
                    offs = [[s + k * part for s in st for k in range(a.split)] for st in starts]
                else:
                    offs = [[rng.randrange(tf.size // part) * part for _ in range(n_parts)] for _ in range(reps)]
                res.setdefault(way, []).append(bursts_aio(fd, addrs, offs, part, a.gap_us / 1e6))
            last = {w: np.concatenate(v)[:, -1] * 1e3 for w, v in res.items()}
            cell = {w: f"{statistics.median(x):7.3f} / {np.percentile(x, 90):6.3f}" for w, x in last.items()}
            ratio = statistics.median(last["scattered"]) / statistics.median(last["adjacent"])
            print(f"{blob:>9} {i:>3} {cell['adjacent']} {cell['scattered']} {ratio:21.3f}", flush=True)


def blob_request(a) -> tuple[int, int]:
    """(request bytes, requests a blob) of `--reread` and `--sustained`: `--blobs`' first size over `--split`."""
    split = max(a.split, 1)
    return -(-int(a.blobs.split(",")[0]) // split // 4096) * 4096, split


def reread_table(tf, a) -> None:
    """GB/s of the same random spots read again, round by round against as many fresh spots, per size."""
    part, split = blob_request(a)
    print(f"\nre-read: random spots of {part} B, {split} a blob, 16 in flight (GB/s through AIO)")
    seeds = iter(range(100, 10**6))
    for mb in (int(x) for x in a.reread_mb.split(",")):
        nbytes = min(mb * 10**6, tf.size)
        once = lambda seed: plain_read_aio_gbps([tf.path], part, split, 16, nbytes, seed=seed)  # noqa: E731
        first, again, fresh = once(1), [], []
        for _ in range(a.reread):
            again.append(once(1))
            fresh.append(once(next(seeds)))
        print(f"  {mb:>6} MB: first {first:.3f}; again {' '.join(f'{x:.3f}' for x in again)}; fresh "
              f"{' '.join(f'{x:.3f}' for x in fresh)}; medians again / fresh "
              f"{statistics.median(again) / statistics.median(fresh):.3f}", flush=True)


def sustained_table(tf, a) -> None:
    """GB/s of back-to-back reads of 256 MB at fresh random spots for `a.sustained` seconds, with their start."""
    part, split = blob_request(a)
    nbytes = min(256 * 10**6, tf.size)
    print(f"\nsustained: {nbytes / 1e6:.0f} MB at a time, random spots of {part} B, {split} a blob, 16 in flight "
          f"(s from the start: GB/s through AIO)")
    t0, got, seed = time.perf_counter(), [], 1000
    while time.perf_counter() - t0 < a.sustained:
        start = time.perf_counter() - t0
        got.append((start, plain_read_aio_gbps([tf.path], part, split, 16, nbytes, seed=seed)))
        seed += 1
    print("  " + "  ".join(f"{t:.1f}: {g:.2f}" for t, g in got))
    third = max(1, len(got) // 3)
    first, last = (statistics.median(g for _, g in got[s]) for s in (slice(0, third), slice(-third, None)))
    print(f"  median of the first third {first:.3f}, of the last {last:.3f} GB/s (last / first {last / first:.3f})")


if __name__ == "__main__":
    sys.exit(main())
