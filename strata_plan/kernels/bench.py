"""Timing helpers for the kernels, and the fused-GEMV throughput the profiler records per format.

    measure_gemv_gbps(fmt, n, k, device="cuda") -> GB/s of one packed [n, k] GEMV at batch 1

Everything is timed with CUDA events around CUDA-graph replays (launch gaps removed), on weights rotated
over enough copies that the L2 cache never serves a repeat; bytes are counted once (packed weights +
activations in + outputs), GB = 1e9 bytes. Random packed bytes stand in for quantized weights: the
kernels' speed does not depend on the values (the fp16 scales are set to ordinary numbers).
"""
from __future__ import annotations

import math
import statistics
import threading
import time
from typing import Callable, Sequence

import torch

from strata_plan.nvml import nvml_handle

from .formats import expert_layout, get_format
from .quantizer import PackedMatrix

_DT = {"uint8": torch.uint8, "float16": torch.float16, "bfloat16": torch.bfloat16}


def l2_bytes(device) -> int:
    props = torch.cuda.get_device_properties(torch.device(device))
    return int(getattr(props, "L2_cache_size", 0) or 64 << 20)


def random_packed(fmt: str, n: int, k: int, device, generator: torch.Generator | None = None) -> PackedMatrix:
    """A PackedMatrix of the right layout filled with random codes and plausible fp16 scales."""
    segs = {}
    for name, dtype, shape, _ in get_format(fmt).segments(n, k):
        if dtype == "uint8":
            segs[name] = torch.randint(0, 256, shape, dtype=torch.uint8, device=device, generator=generator)
        else:
            segs[name] = (torch.rand(shape, device=device, generator=generator) * 0.01).to(_DT[dtype])
    return PackedMatrix(fmt, n, k, **segs)


def random_expert_blobs(formats: Sequence[str], hidden: int, intermediate: int, device):
    """An arena of random experts in `formats` (one blob each, 4 KiB aligned) and their int64 offsets."""
    sizes = [expert_layout(f, hidden, intermediate).nbytes for f in formats]
    offsets = [0]
    for s in sizes[:-1]:
        offsets.append(offsets[-1] + s)
    arena = torch.randint(0, 256, (sum(sizes),), dtype=torch.uint8, device=device)
    for f, off in zip(formats, offsets):
        for s in expert_layout(f, hidden, intermediate).segments:
            if s.dtype != "uint8":
                n = s.nbytes // 2
                vals = (torch.rand(n, device=device) * 0.01).to(_DT[s.dtype])
                arena[off + s.offset: off + s.offset + s.nbytes] = vals.view(torch.uint8)
    return arena, torch.tensor(offsets, dtype=torch.int64, device=device)


def copies_to_beat_l2(nbytes: int, device, factor: float = 4.0) -> int:
    """How many distinct copies of an object of `nbytes` make one pass `factor` times the L2 size."""
    return max(2, math.ceil(factor * l2_bytes(device) / max(nbytes, 1)))


def event_times(fn: Callable[[], None], reps: int = 20, warmup: int = 3) -> list[float]:
    """Milliseconds of each of `reps` calls of fn, timed with CUDA events (fn launches GPU work)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def graph_of(fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """Capture fn (after one warm-up call on a side stream, as CUDA graphs require)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def graph_ms(fn: Callable[[], None], reps: int = 20) -> float:
    """Median milliseconds of one replay of a graph holding fn."""
    g = graph_of(fn)
    return statistics.median(event_times(g.replay, reps=reps, warmup=2))


def sustained(fn: Callable[[], None], seconds: float = 2.0, calls: int = 20) -> dict:
    """fn run back to back for `seconds` (a graph of `calls` calls, replayed), as a long prefill runs it,
    rather than in short bursts from an idle GPU: at the board's power limit the clock drops, by how much
    depends on the work. Returns ms a call (events around the whole run), and the median SM clock (MHz)
    and board power (W) that NVML reads every 20 ms after the first half second (None without NVML)."""
    g = graph_of(lambda: [fn() for _ in range(calls)])
    samples, stop = [], threading.Event()
    try:
        import pynvml
        pynvml.nvmlInit()
        h = nvml_handle(pynvml, torch.cuda.current_device())
    except Exception:                                   # no NVML (or no such GPU in it): times only
        h = None

    def watch() -> None:
        t0 = time.perf_counter()
        while h is not None and not stop.wait(0.02):
            if time.perf_counter() - t0 > 0.5:
                samples.append((pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                                pynvml.nvmlDeviceGetPowerUsage(h) / 1000))

    th = threading.Thread(target=watch)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    torch.cuda.synchronize()
    th.start()
    t0, reps = time.perf_counter(), 0
    a.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            g.replay()
        reps += 10
        torch.cuda.synchronize()
    b.record()
    torch.cuda.synchronize()
    stop.set()
    th.join()
    return {"ms": round(a.elapsed_time(b) / (reps * calls), 4),
            "sm_mhz": statistics.median(c for c, _ in samples) if samples else None,
            "watts": round(statistics.median(w for _, w in samples), 1) if samples else None}


def measure_gemv_gbps(fmt: str, n: int, k: int, device="cuda", m: int = 1, reps: int = 20) -> float:
    """GB/s of the fused packed GEMV out = x @ W^T, x [m, k] bf16, W [n, k] in `fmt`, counted as packed
    weight bytes + activations in + outputs out, per replayed call (median of `reps` graph replays)."""
    from .ops import packed_linear
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("measure_gemv_gbps times CUDA kernels: pass a CUDA device")
    wbytes = get_format(fmt).matrix_bytes(n, k)
    copies = copies_to_beat_l2(wbytes, device)
    mats = [random_packed(fmt, n, k, device) for _ in range(copies)]
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    outs = [torch.empty(m, n, dtype=torch.bfloat16, device=device) for _ in range(copies)]

    def run() -> None:
        for p, o in zip(mats, outs):
            packed_linear(x, p, out=o)

    ms = graph_ms(run, reps=reps) / copies
    return (wbytes + 2 * m * (k + n)) / (ms * 1e-3) / 1e9
