"""Independent reference measurements for the profiler's headline figures, by other mechanisms.

- PCIe and device copies: CuPy's bindings of cudaMemcpyAsync / cudaMemcpy, timed with CuPy's CUDA
  events (the profiler goes through PyTorch's copy_ and its own event and host-clock harness).
- Disk: `dd iflag=direct` (sequential, one read in flight) and a plain single-threaded Python loop of
  lseek + readv on an O_DIRECT descriptor (random offsets); the profiler uses threaded preadv.

Each reference repeats its measurement and returns the samples, so its spread is reported beside the
profiler's. GB = 1e9 bytes.
"""
from __future__ import annotations

import mmap
import os
import random
import re
import subprocess
import time
from pathlib import Path

GB = 1e9
MiB = 1 << 20


def _rotate(i: int, size: int, span: int) -> int:
    return (i % (span // size)) * size


class CupyCopies:
    """Buffers allocated once; `sample(key)` returns one GB/s sample for keys 'h2d_pinned@S',
    'd2h_pinned@S', 'h2d_pageable@S' (S in `sizes`) and 'device_copy' (read + write counted)."""

    def __init__(self, sizes: dict[str, int], span: int = 1 << 30, target: int = 1 << 30, hbm_bytes: int = 2 << 30):
        import cupy as cp
        import numpy as np

        self.cp, self.rt, self.span, self.target, self.hbm_bytes = cp, cp.cuda.runtime, span, target, hbm_bytes
        self.pinned_mem = cp.cuda.alloc_pinned_memory(span)
        self.pinned = np.frombuffer(self.pinned_mem, dtype=np.uint8, count=span)
        self.pinned[:] = 7
        self.pageable = np.full(span, 7, dtype=np.uint8)
        self.dev = cp.empty(span, dtype=cp.uint8)
        self.src, self.dst = cp.empty(hbm_bytes, dtype=cp.uint8), cp.empty(hbm_bytes, dtype=cp.uint8)
        self.src.fill(3)
        self.stream = cp.cuda.Stream(non_blocking=True)
        rt = self.rt
        self.jobs = {}
        for label, size in sizes.items():
            self.jobs[f"h2d_pinned@{label}"] = lambda z=size: self._async(rt.memcpyHostToDevice, z)
            self.jobs[f"d2h_pinned@{label}"] = lambda z=size: self._async(rt.memcpyDeviceToHost, z)
            self.jobs[f"h2d_pageable@{label}"] = lambda z=size: self._pageable(z)
        self.jobs["device_copy"] = self._d2d
        for fn in self.jobs.values():          # warm-up
            fn()

    def sample(self, key: str) -> float:
        return self.jobs[key]()

    def _timed(self, stream, enqueue) -> float:
        cp = self.cp
        start, end = cp.cuda.Event(), cp.cuda.Event()
        stream.synchronize()
        start.record(stream)
        enqueue()
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3

    def _async(self, kind: int, size: int) -> float:
        n = max(1, self.target // size)
        host, dev = self.pinned.ctypes.data, self.dev.data.ptr
        h2d = kind == self.rt.memcpyHostToDevice

        def go() -> None:
            for i in range(n):
                off = _rotate(i, size, self.span)
                dst, src = (dev + off, host + off) if h2d else (host + off, dev + off)
                self.rt.memcpyAsync(dst, src, size, kind, self.stream.ptr)
        return size * n / self._timed(self.stream, go) / GB

    def _pageable(self, size: int) -> float:
        n = max(1, self.target // size)
        host, dev = self.pageable.ctypes.data, self.dev.data.ptr

        def go() -> None:                       # synchronous cudaMemcpy on the legacy default stream
            for i in range(n):
                off = _rotate(i, size, self.span)
                self.rt.memcpy(dev + off, host + off, size, self.rt.memcpyHostToDevice)
        return size * n / self._timed(self.cp.cuda.Stream.null, go) / GB

    def _d2d(self) -> float:
        n = 10

        def go() -> None:
            for _ in range(n):
                self.rt.memcpyAsync(self.dst.data.ptr, self.src.data.ptr, self.hbm_bytes,
                                    self.rt.memcpyDeviceToDevice, self.stream.ptr)
        return 2 * self.hbm_bytes * n / self._timed(self.stream, go) / GB

    def close(self) -> None:
        if not bool((self.dst[:: 1 << 20] == 3).all()) or int(self.dev[:: 1 << 20].min()) != 7:
            raise RuntimeError("reference copies did not move the data")
        del self.dev, self.src, self.dst, self.pinned, self.pinned_mem
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()


def cupy_copies(sizes: dict[str, int], repeats: int, hbm_bytes: int = 2 << 30) -> dict[str, list[float]]:
    """Every CupyCopies key, `repeats` interleaved rounds: {key: [GB/s, ...]}."""
    c = CupyCopies(sizes, hbm_bytes=hbm_bytes)
    out: dict[str, list[float]] = {k: [] for k in c.jobs}
    for _ in range(repeats):
        for k in c.jobs:
            out[k].append(c.sample(k))
    c.close()
    return out


_DD_SECONDS = re.compile(r"copied, ([0-9.eE+-]+) s")


def dd_direct(path: Path, block: int, count: int, repeats: int, seed: int = 1) -> list[float]:
    """GB/s of `dd iflag=direct` reading `count` blocks sequentially from a random block-aligned start."""
    blocks = os.path.getsize(path) // block
    rng = random.Random(seed)
    out = []
    for _ in range(repeats):
        skip = rng.randrange(max(1, blocks - count))
        r = subprocess.run(["dd", f"if={path}", "of=/dev/null", f"bs={block}", f"count={count}", f"skip={skip}",
                            "iflag=direct"], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"},
                           check=True)
        m = _DD_SECONDS.search(r.stderr)
        if not m:
            raise RuntimeError(f"cannot read dd's time from: {r.stderr.strip()}")
        out.append(block * count / float(m.group(1)) / GB)
    return out


def python_direct_random(path: Path, block: int, count: int, repeats: int, seed: int = 2) -> list[float]:
    """GB/s of one thread reading `count` random block-aligned blocks with lseek + readv on O_DIRECT."""
    blocks = os.path.getsize(path) // block
    rng = random.Random(seed)
    buf = mmap.mmap(-1, block)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    out = []
    try:
        for _ in range(repeats):
            offsets = [rng.randrange(blocks) * block for _ in range(count)]
            t0 = time.perf_counter()
            for off in offsets:
                os.lseek(fd, off, os.SEEK_SET)
                if os.readv(fd, [buf]) != block:
                    raise RuntimeError("short read")
            out.append(block * count / (time.perf_counter() - t0) / GB)
    finally:
        os.close(fd)
        buf.close()
    return out
