"""NVMe: O_DIRECT read bandwidth over block size and queue depth, on a test file that is always removed.

Method (fio's, in Python): a test file of incompressible data is written and fsynced, then read with
O_DIRECT into page-aligned buffers, so the page cache never serves a read. Queue depth Q is Q threads,
each with one read in flight (`os.preadv` releases the GIL). Random reads visit block-aligned offsets in
shuffled order without repeats (fio's random map); sequential reads share one advancing offset. Every
point is timed from the release of all threads to the last completion, and the points are repeated
interleaved. A filesystem that refuses O_DIRECT (EINVAL: tmpfs, some network and FUSE filesystems) is
read through the page cache instead, with posix_fadvise(DONTNEED) dropping the file's pages before every
pass, and the result is marked `direct_io: false`.

The file is removed on every way out: success, an error, Ctrl-C.
"""
from __future__ import annotations

import errno
import mmap
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from strata_plan.errors import UserError

from .timing import GB, GiB, MiB, Stats, interleaved

ALIGN = 4096
WRITE_CHUNK = 64 * MiB
TEST_FILE_PREFIX = ".strata-plan-nvme-test-"


def check_dir(path: str | os.PathLike) -> Path:
    """The folder to measure in, or a UserError if it is missing, not a folder, or not writable."""
    p = Path(path)
    if not p.exists():
        raise UserError("--nvme-dir", str(p), "does not exist", "pass an existing folder on the disk to measure")
    if not p.is_dir():
        raise UserError("--nvme-dir", str(p), "is not a folder", "pass a folder on the disk to measure")
    try:
        fd, probe = tempfile.mkstemp(prefix=TEST_FILE_PREFIX, dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError("--nvme-dir", str(p), f"is not writable ({os.strerror(e.errno) if e.errno else e})",
                        "pass a folder you can write to on the disk to measure") from None
    return p


def clamp_size(requested: int, folder: Path, min_bytes: int) -> tuple[int, str]:
    """The test-file size: the request, clamped to 80% of the free space; (size, warning or '')."""
    free = psutil.disk_usage(str(folder)).free
    usable = int(free * 0.8) // WRITE_CHUNK * WRITE_CHUNK
    size = requested // ALIGN * ALIGN
    if usable < min_bytes:
        raise UserError("--nvme-dir", str(folder), f"only {free / GB:.2f} GB free, too little for a test file",
                        f"free at least {min_bytes / 0.8 / GB:.2f} GB there or choose another folder")
    if size > usable:
        return usable, (f"--max-gib {requested / GiB:g} clamped to {usable / GiB:.2f} GiB "
                        f"(80% of the {free / GB:.1f} GB free in {folder})")
    return size, ""


def _pattern(chunk: int, seed: int = 12345) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**63, size=chunk // 8, dtype=np.uint64)


class TestFile:
    """A file of `size` incompressible bytes in `folder`, fsynced and out of the page cache; removed on
    exit from the `with` block however it is left. `write` is the write call (a seam for tests)."""

    def __init__(self, folder: Path, size: int, tick: Callable[[int], None] | None = None,
                 write: Callable[[int, bytes], int] = os.write):
        self.folder, self.size, self.tick, self._write = Path(folder), size, tick, write
        self.path: Path | None = None

    def __enter__(self) -> "TestFile":
        fd, name = tempfile.mkstemp(prefix=TEST_FILE_PREFIX, suffix=".bin", dir=self.folder)
        self.path = Path(name)
        try:
            base = _pattern(min(WRITE_CHUNK, self.size))
            done, i = 0, 0
            while done < self.size:
                n = min(base.nbytes, self.size - done)
                # each chunk differs (xor with its index): no deduplicating or compressing layer can shrink it
                data = (base ^ np.uint64((i * 0x9E3779B97F4A7C15) % 2**64)).view(np.uint8)[:n]
                view = memoryview(data)
                while view:
                    view = view[self._write(fd, view):]
                done, i = done + n, i + 1
                if self.tick:
                    self.tick(n)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except BaseException:
            os.close(fd)
            self.remove()
            raise
        os.close(fd)
        return self

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def __exit__(self, *exc) -> None:
        self.remove()


def open_reader(path: Path) -> tuple[int, bool]:
    """(fd, direct): O_DIRECT if the filesystem accepts it (checked with one aligned read), else a plain
    descriptor for the posix_fadvise(DONTNEED) fallback."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return os.open(path, os.O_RDONLY), False
    buf = mmap.mmap(-1, ALIGN)
    try:
        os.preadv(fd, [buf], 0)
    except OSError as e:
        os.close(fd)
        if e.errno != errno.EINVAL:
            raise
        return os.open(path, os.O_RDONLY), False
    finally:
        buf.close()
    return fd, True


def _offsets(size: int, block: int, sequential: bool, rng: random.Random) -> Iterator[int]:
    blocks = size // block
    if sequential:
        start = rng.randrange(blocks)
        while True:
            for i in range(blocks):
                yield ((start + i) % blocks) * block
    while True:
        order = list(range(blocks))
        rng.shuffle(order)
        for i in order:
            yield i * block


def read_pass(fd: int, size: int, block: int, qd: int, seconds: float, sequential: bool, rng: random.Random,
              read: Callable[[int, list, int], int] = os.preadv) -> float:
    """GB/s of `qd` threads reading `block`-byte pieces of the first `size` bytes for about `seconds`."""
    offsets = _offsets(size, block, sequential, rng)
    lock, go, stop = threading.Lock(), threading.Event(), threading.Event()
    ready = threading.Barrier(qd + 1)
    done = [0] * qd
    errors: list[BaseException] = []
    deadline = [0.0]

    def worker(i: int) -> None:
        buf = mmap.mmap(-1, block)          # page-aligned, as O_DIRECT requires
        try:
            buf.write(bytes(block))          # fault the pages in now, not inside the timed window
            ready.wait()
            go.wait()
            while not stop.is_set() and time.perf_counter() < deadline[0]:
                with lock:
                    off = next(offsets)
                n = read(fd, [buf], off)
                if n != block:
                    raise OSError(errno.EIO, f"short read: {n} of {block} bytes at offset {off}")
                done[i] += n
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:           # Ctrl-C raised in a worker reaches the caller too
            errors.append(e)
            stop.set()
            ready.abort()
        finally:
            buf.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(qd)]
    for t in threads:
        t.start()
    try:
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            pass                             # a worker failed while preparing: its error is raised below
        t0 = time.perf_counter()
        deadline[0] = t0 + seconds
        go.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
    except BaseException:
        stop.set()
        ready.abort()
        go.set()
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[0]
    return sum(done) / elapsed / GB


@dataclass(frozen=True)
class DiskInfo:
    name: str
    capacity_bytes: int
    source: str          # where name and capacity were read


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def disk_info(folder: Path) -> DiskInfo:
    """The block device under `folder` from sysfs (model, size); the filesystem when there is none."""
    dev = os.stat(folder).st_dev
    sys_dev = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if sys_dev.exists():
        node = sys_dev.resolve()
        disk = node.parent if (node / "partition").exists() else node
        sectors = _read(disk / "size")
        driver = (disk / "device" / "driver").resolve().name if (disk / "device" / "driver").exists() else ""
        model = _read(disk / "device" / "model") or (f"{driver} disk" if driver else "block device")
        if sectors.isdigit():
            return DiskInfo(f"{model} ({disk.name})", int(sectors) * 512, f"/sys/block/{disk.name}")
    mounts = [p for p in psutil.disk_partitions(all=True) if str(folder.resolve()).startswith(p.mountpoint)]
    fs = max(mounts, key=lambda p: len(p.mountpoint)) if mounts else None
    name = f"{fs.fstype} filesystem at {fs.mountpoint}" if fs else "unknown device"
    return DiskInfo(name, psutil.disk_usage(str(folder)).total, "filesystem size (no block device found)")


@dataclass(frozen=True)
class DiskSettings:
    rand_blocks: tuple[int, ...]
    rand_qds: tuple[int, ...]
    seq_blocks: tuple[int, ...]
    seq_qds: tuple[int, ...]
    seconds: float          # per point per repeat
    repeats: int

    @property
    def points(self) -> int:
        return len(self.rand_blocks) * len(self.rand_qds) + len(self.seq_blocks) * len(self.seq_qds)

    @property
    def largest_block(self) -> int:
        return max(self.rand_blocks + self.seq_blocks)


@dataclass(frozen=True)
class DiskResult:
    info: DiskInfo
    folder: str
    file_bytes: int
    direct_io: bool
    rand: dict[tuple[int, int], Stats]
    seq: dict[tuple[int, int], Stats]
    notes: tuple[str, ...] = field(default=())


PHASES = ("writing the disk test file", "disk reads (O_DIRECT)")


def phase_plan(s: DiskSettings, size: int) -> list[tuple[str, float, int]]:
    """(phase, estimated seconds, ticks) of `measure_disk`, for the progress bar's ETA."""
    return [(PHASES[0], size / (1.5 * GB), max(1, -(-size // WRITE_CHUNK))),
            (PHASES[1], s.seconds * s.points * s.repeats + 1, s.points * s.repeats)]


def measure_disk(folder: Path, size: int, s: DiskSettings,
                 step: Callable[[str], Callable[[], None]] = lambda name: lambda: None, seed: int = 0) -> DiskResult:
    """Write the test file, measure every (block, queue depth) point interleaved, remove the file.
    `step(phase)` announces a phase and returns its tick."""
    notes: list[str] = []
    rng = random.Random(seed)
    write_tick = step(PHASES[0])
    with TestFile(folder, size, lambda n: write_tick()) as tf:
        tick = step(PHASES[1])
        fd, direct = open_reader(tf.path)
        try:
            if not direct:
                notes.append(f"{folder}: the filesystem refused O_DIRECT; measured through the page cache with "
                             "posix_fadvise(DONTNEED) before every pass")
            keys = [("rand", b, q) for b in s.rand_blocks for q in s.rand_qds] + \
                   [("seq", b, q) for b in s.seq_blocks for q in s.seq_qds]

            def one(key) -> float:
                kind, b, q = key
                if not direct:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                return read_pass(fd, size, b, q, s.seconds, kind == "seq", rng)

            stats = interleaved(keys, one, s.repeats, tick)
        finally:
            os.close(fd)
    rand = {(b, q): st for (k, b, q), st in stats.items() if k == "rand"}
    seq = {(b, q): st for (k, b, q), st in stats.items() if k == "seq"}
    return DiskResult(disk_info(folder), str(folder.resolve()), size, direct, rand, seq, tuple(notes))
