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


def cupy_copies(sizes: dict[str, int], repeats: int, span: int = 1 << 30, target: int = 1 << 30,
                hbm_bytes: int = 2 << 30) -> dict[str, list[float]]:
    """GB/s samples for keys 'h2d_pinned@S', 'd2h_pinned@S', 'h2d_pageable@S' (S in `sizes`) and
    'device_copy' (read + write counted), interleaved over `repeats` rounds."""
    import cupy as cp
    import numpy as np

    rt = cp.cuda.runtime
    h2d, d2h, d2d = rt.memcpyHostToDevice, rt.memcpyDeviceToHost, rt.memcpyDeviceToDevice
    pinned_mem = cp.cuda.alloc_pinned_memory(span)
    pinned = np.frombuffer(pinned_mem, dtype=np.uint8, count=span)
    pinned[:] = 7
    pageable = np.full(span, 7, dtype=np.uint8)
    dev = cp.empty(span, dtype=cp.uint8)
    src, dst = cp.empty(hbm_bytes, dtype=cp.uint8), cp.empty(hbm_bytes, dtype=cp.uint8)
    src.fill(3)
    stream = cp.cuda.Stream(non_blocking=True)

    def timed_async(kind: int, size: int, host_ptr: int) -> float:
        n = max(1, target // size)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        stream.synchronize()
        start.record(stream)
        for i in range(n):
            off = _rotate(i, size, span)
            if kind == h2d:
                rt.memcpyAsync(dev.data.ptr + off, host_ptr + off, size, kind, stream.ptr)
            else:
                rt.memcpyAsync(host_ptr + off, dev.data.ptr + off, size, kind, stream.ptr)
        end.record(stream)
        end.synchronize()
        return size * n / (cp.cuda.get_elapsed_time(start, end) / 1e3) / GB

    def timed_pageable(size: int) -> float:
        n = max(1, target // size)
        null = cp.cuda.Stream.null
        start, end = cp.cuda.Event(), cp.cuda.Event()
        null.synchronize()
        start.record(null)
        for i in range(n):
            off = _rotate(i, size, span)
            rt.memcpy(dev.data.ptr + off, pageable.ctypes.data + off, size, h2d)   # synchronous cudaMemcpy
        end.record(null)
        end.synchronize()
        return size * n / (cp.cuda.get_elapsed_time(start, end) / 1e3) / GB

    def timed_d2d() -> float:
        n = 10
        start, end = cp.cuda.Event(), cp.cuda.Event()
        stream.synchronize()
        start.record(stream)
        for _ in range(n):
            rt.memcpyAsync(dst.data.ptr, src.data.ptr, hbm_bytes, d2d, stream.ptr)
        end.record(stream)
        end.synchronize()
        return 2 * hbm_bytes * n / (cp.cuda.get_elapsed_time(start, end) / 1e3) / GB

    jobs = {}
    for label, size in sizes.items():
        jobs[f"h2d_pinned@{label}"] = lambda s=size: timed_async(h2d, s, pinned.ctypes.data)
        jobs[f"d2h_pinned@{label}"] = lambda s=size: timed_async(d2h, s, pinned.ctypes.data)
        jobs[f"h2d_pageable@{label}"] = lambda s=size: timed_pageable(s)
    jobs["device_copy"] = timed_d2d
    for fn in jobs.values():                     # warm-up
        fn()
    out: dict[str, list[float]] = {k: [] for k in jobs}
    for _ in range(repeats):
        for k, fn in jobs.items():
            out[k].append(fn())
    if not bool((dst[:: 1 << 20] == 3).all()) or int(dev[:: 1 << 20].min()) != 7:
        raise RuntimeError("reference copies did not move the data")
    del dev, src, dst, pinned, pinned_mem
    cp.get_default_memory_pool().free_all_blocks()
    cp.get_default_pinned_memory_pool().free_all_blocks()
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
