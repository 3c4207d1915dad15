"""Reading expert blobs past the page cache: O_DIRECT file handles and aligned reads into host buffers.

    f = BlobFile.open(path)            # O_DIRECT where the filesystem allows it, else buffered (+ warning)
    f.read_into(buf, offset, nbytes)   # buf: a writable 4 KiB-aligned memoryview (pinned or not)
    f.read_split(pool, buf, offset, nbytes, split)   # the same read as `split` requests in flight at once

O_DIRECT needs the file offset, the length and the buffer address to be multiples of the logical block
size; every blob is 4 KiB-aligned in offset and size (`formats.EXPERT_ALIGN`), and host buffers come from
`aligned_view`. `os.preadv` releases the GIL, so reads on several threads are several requests in flight
(the profiler's NVMe method). A filesystem that refuses O_DIRECT (tmpfs, some FUSE and network
filesystems) is read through the page cache with `posix_fadvise(DONTNEED)` before each read, and
`BlobFile.direct` is False: benchmarks refuse such files, the engine warns once.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import warnings
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import torch

from strata_plan.pinned import HostRegion

ALIGN = 4096
BIG_PINNED = 64 << 20      # pinned buffers from this size are registered mappings of their own size


def aligned_view(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU uint8 tensor (pinned or not), for `os.preadv`."""
    assert t.dtype == torch.uint8 and t.is_contiguous() and t.device.type == "cpu"
    return memoryview((ctypes.c_uint8 * t.numel()).from_address(t.data_ptr())).cast("B")


def aligned_empty(nbytes: int, pin: bool) -> tuple[object, torch.Tensor]:
    """(backing, view): a uint8 CPU buffer of `nbytes` whose view starts on a 4 KiB boundary; pinned
    (page-locked, registered with CUDA) when `pin`: from 64 MiB up a `pinned.HostRegion` of the size asked
    (torch's pinned allocator would round it up to a power of two), below that torch's. Keep `backing` alive as
    long as `view`."""
    if pin and nbytes >= BIG_PINNED:
        region = HostRegion(nbytes, torch.device("cuda", torch.cuda.current_device()))
        return region, region.tensor
    backing = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
    skip = (-backing.data_ptr()) % ALIGN
    return backing, backing[skip:skip + nbytes]


def split_parts(nbytes: int, split: int) -> list[tuple[int, int]]:
    """(start, bytes) of a read of `nbytes` as `split` requests, each 4 KiB-aligned (the last takes the rest)."""
    step = -(-nbytes // max(1, split) // ALIGN) * ALIGN
    return [(a, min(step, nbytes - a)) for a in range(0, nbytes, step)]


@dataclass
class BlobFile:
    path: Path
    fd: int
    direct: bool

    @classmethod
    def open(cls, path: str | os.PathLike, warn: bool = True) -> "BlobFile":
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            probe = mmap.mmap(-1, ALIGN)
            try:
                os.preadv(fd, [probe], 0)
                return cls(path, fd, True)
            except OSError as e:
                os.close(fd)
                if e.errno != errno.EINVAL:
                    raise
            finally:
                probe.close()
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
        if warn:
            warnings.warn(f"{path}: the filesystem refuses O_DIRECT; the NVMe tier is read through the page cache "
                          f"(dropped before each read), so its figures are not a cold disk's", stacklevel=2)
        return cls(path, os.open(path, os.O_RDONLY), False)

    def read_into(self, buf: memoryview, offset: int, nbytes: int) -> None:
        """Read exactly `nbytes` at `offset` into buf[:nbytes]; OSError on a short read (truncated file)."""
        if not self.direct:
            os.posix_fadvise(self.fd, offset, nbytes, os.POSIX_FADV_DONTNEED)
        done = 0
        while done < nbytes:
            n = os.preadv(self.fd, [buf[done:nbytes]], offset + done)
            if n <= 0:
                raise OSError(errno.EIO, f"short read: {done} of {nbytes} bytes at offset {offset}", str(self.path))
            done += n

    def read_split(self, pool: Executor | None, buf: memoryview, offset: int, nbytes: int, split: int) -> None:
        """`read_into` as `split` 4 KiB-aligned requests in flight at once on `pool` (inline without one)."""
        parts = split_parts(nbytes, split)
        if pool is None or len(parts) == 1:
            for a, n in parts:
                self.read_into(buf[a:], offset + a, n)
            return
        for f in [pool.submit(self.read_into, buf[a:], offset + a, n) for a, n in parts]:
            f.result()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def page_cache_residency(path: str | os.PathLike) -> float:
    """Share of a file's pages in the page cache (mincore over an mmap of the file); 0.0 for an empty file.
    The benchmark calls it before and after a run to show that the NVMe tier stayed cold."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    pages = -(-size // page)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed", str(path))
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed", str(path))
            return sum(v & 1 for v in vec) / pages
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def _random_spots(files: list[BlobFile], block: int, nbytes: int, seed: int) -> list[tuple[BlobFile, int]]:
    """(file, offset) of `nbytes` worth of distinct `block`-aligned pieces of `files`, in a random order."""
    import random
    spots = [(f, o) for f in files for o in range(0, os.fstat(f.fd).st_size - block + 1, block)]
    random.Random(seed).shuffle(spots)
    return spots[:max(1, nbytes // block)]


def plain_read_gbps(paths, block: int, threads: int, nbytes: int, seed: int = 0) -> float:
    """The reference the NVMe tier is held to: `nbytes` read with O_DIRECT from random `block`-aligned
    offsets of `paths`, `threads` requests in flight, no copies. GB/s (1e9 bytes)."""
    import time
    from concurrent.futures import ThreadPoolExecutor
    files = [BlobFile.open(p, warn=False) for p in paths]
    try:
        spots = _random_spots(files, block, nbytes, seed)
        bufs = [aligned_empty(block, pin=False) for _ in range(threads)]
        views = [aligned_view(v) for _, v in bufs]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda i: spots[i][0].read_into(views[i % threads], spots[i][1], block), range(len(spots))))
        return len(spots) * block / (time.perf_counter() - t0) / 1e9
    finally:
        for f in files:
            f.close()


def plain_read_aio_gbps(paths, block: int, split: int, in_flight: int, nbytes: int, seed: int = 0) -> float:
    """`plain_read_gbps` shaped as the AIO stager reads (engine/aio.py): random `block` x `split` regions of
    `paths`, each as its `split` requests submitted in one call, new regions submitted as parts complete while at
    most `in_flight` requests (at least one region's) are outstanding; no copies. GB/s (1e9 bytes). The kernel may
    merge a region's adjacent requests, as it may the stager's."""
    import time

    from .aio import AioContext
    region = block * split
    files = [BlobFile.open(p, warn=False) for p in paths]
    in_flight = max(in_flight, split)
    ctx = AioContext(in_flight)
    try:
        spots = _random_spots(files, region, nbytes, seed)
        slots = in_flight // split
        backing, buf = aligned_empty(slots * region, pin=False)
        free, left, todo, out = list(range(slots)), {}, list(reversed(spots)), 0
        t0 = time.perf_counter()
        while todo or left:
            batch = []
            while todo and free:
                (f, off), b = todo.pop(), free.pop()
                left[b] = split
                batch += [(b * split + k, f.fd, buf.data_ptr() + b * region + k * block, block, off + k * block)
                          for k in range(split)]
            if batch:
                started, err = ctx.submit(batch)
                if err is not None:
                    raise err
            for tag, res in ctx.wait(1, in_flight, None):
                if res != block:
                    raise OSError(errno.EIO, f"plain read: {res} of {block} bytes")
                b = tag // split
                left[b] -= 1
                if not left[b]:
                    del left[b]
                    free.append(b)
                    out += region
        return out / (time.perf_counter() - t0) / 1e9
    finally:
        ctx.close()
        for f in files:
            f.close()

