"""GPU: identity and PCIe link (NVML), HBM and copy bandwidths, bf16 matmul rate, host<->GPU copy curves.

Method (nvbandwidth's, through PyTorch): warm-up first; copies that the GPU times itself are bracketed by
CUDA events and held back by a spin kernel (`torch.cuda._sleep`) until all of them are enqueued, so the
cost of enqueuing from Python never shows up as idle time inside the timed window. Pageable copies are
timed on the host clock between two synchronizations instead, because the driver stages them through
its own pinned buffer on the CPU, and that CPU work is part of their cost. Each host<->GPU copy of size
s cycles through the whole 1 GiB buffer (s-sized slots), so small copies are not served from a CPU cache.
Device copy bandwidth counts bytes read plus bytes written (nvbandwidth's device_local_copy does too);
HBM read bandwidth counts the bytes a reduction reads. The PCIe generation and width are read while a
copy is running: idle links drop to Gen1.
Zero-copy reads (`zero_copy_curve`): a kernel (`kernels.stream_read`) reads registered pinned host memory in
place, as the engine's device loop reads RAM experts, timed with CUDA events like the pinned copies and
interleaved with them; the bytes read are checked once against a checksum computed on the CPU.
"""
from __future__ import annotations

import ctypes
import math
import mmap
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .host import PinProbe, probe_pinnable
from .timing import GB, GiB, MiB, Stats, interleaved

HOLD_SECONDS_PER_OP = 30e-6     # enqueue time one copy or kernel launch may take from Python
HOLD_CLOCK_HZ = 2.0e9           # spin-kernel cycles are counted at the boost clock (longer when slower)
TRITON_LAUNCH_OPS = 3           # a Triton launch is held as 3 ops: it took 15 us to enqueue on the H200 (Triton 3.6)
LAYER_READ_SIZES = (64 << 20, 128 << 20, 256 << 20)   # a MoE layer's RAM reads a token (kimi-k3.1-pro: ~100-200 MB)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def device_count() -> int:
    return torch.cuda.device_count()


@dataclass(frozen=True)
class GpuSettings:
    sizes: tuple[int, ...]              # host<->GPU transfer sizes (bytes)
    during_sizes: tuple[int, ...]       # sizes for H2D while a kernel runs
    repeats: int
    target_bytes: int                   # bytes moved per timed sample (at least one copy)
    max_iters: int                      # copies per timed sample at most
    hbm_bytes: int                      # reduction / device-copy buffer size
    matmul_n: int                       # n of the n x n x n bf16 matmul
    gemv_shape: tuple[int, int]         # (n, k) for the packed-format GEMV throughput
    moe: object = None                  # profiler.moe.MoESettings: the fused MoE call (None: skipped)


@dataclass(frozen=True)
class Identity:
    name: str
    total_bytes: int
    free_bytes: int
    driver: str
    pcie_gen: int
    pcie_width: int
    idle_gen: int
    max_gen: int
    max_width: int
    source: str


@dataclass(frozen=True)
class GpuResult:
    identity: Identity
    hbm_read: Stats
    device_copy: Stats
    bf16_tflops: Stats
    curves: dict[str, dict[int, Stats]]     # h2d_pinned, h2d_pageable, d2h_pinned, d2h_pageable, h2d_during_kernel,
                                            # zero_copy (absent when the zero-copy probe could not run)
    pin: PinProbe | None
    kernel_gbps: dict[str, Stats]
    notes: tuple[str, ...] = field(default=())
    moe: object = None                      # profiler.moe.MoEResult, or None when skipped
    graph_launch: Stats | None = None       # us of one small kernel replayed in a CUDA graph (None: not measured)
    lookahead_layer: Stats | None = None    # us the lookahead's slot kernels add to a MoE layer (None: not measured)
    cache_layer: Stats | None = None        # us the device LRU's step and fill add to a MoE layer (None: not measured)
    stage_layer: Stats | None = None        # us the NVMe stager's handshake adds to a MoE layer (None: not measured)


# ---------------------------------------------------------------- timing


def _event_seconds(enqueue: Callable[[], None], ops: int, stream: torch.cuda.Stream | None = None) -> float:
    """GPU seconds of the work `enqueue` puts on `stream`, with the stream held until all is enqueued."""
    stream = stream or torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int((ops * HOLD_SECONDS_PER_OP + 1e-3) * HOLD_CLOCK_HZ))
        start.record(stream)
        enqueue()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _host_seconds(enqueue: Callable[[], None]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    enqueue()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


# ---------------------------------------------------------------- identity and link


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def identity(index: int, load: Callable[[Callable[[], None]], None]) -> Identity:
    """Name, memory, driver and PCIe link from NVML (the link from sysfs if NVML cannot read it); the link
    is sampled while `load` runs copies."""
    import pynvml

    from strata_plan.nvml import nvml_handle
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return _identity_sysfs(index, load, f"NVML unusable ({e})")
    try:
        h = nvml_handle(pynvml, index)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        name, driver = _text(pynvml.nvmlDeviceGetName(h)), _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            idle = (pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h), pynvml.nvmlDeviceGetCurrPcieLinkWidth(h))
        except pynvml.NVMLError as e:
            return replace(_identity_sysfs(index, load, f"NVML cannot read the PCIe link ({e})"),
                           name=name, total_bytes=int(mem.total), free_bytes=int(mem.free), driver=driver)
        seen: list[tuple[int, int]] = []
        load(lambda: seen.append((pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                                  pynvml.nvmlDeviceGetCurrPcieLinkWidth(h))))
        gen, width = max(seen) if seen else idle
        try:
            top = (pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h), pynvml.nvmlDeviceGetMaxPcieLinkWidth(h))
        except pynvml.NVMLError:
            top = (gen, width)
        return Identity(name, int(mem.total), int(mem.free), driver, int(gen), int(width), int(idle[0]),
                        int(top[0]), int(top[1]), "NVML")
    finally:
        pynvml.nvmlShutdown()


GT_PER_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


def _identity_sysfs(index: int, load: Callable[[Callable[[], None]], None], why: str) -> Identity:
    p = torch.cuda.get_device_properties(index)
    dev = Path("/sys/bus/pci/devices")

    def link(kind: str) -> tuple[int, int]:
        speed = float((dev / f"{kind}_link_speed").read_text().split()[0])
        return GT_PER_GEN.get(speed, 1), int((dev / f"{kind}_link_width").read_text())
    try:
        dev = dev / f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        idle = link("current")
        seen: list[tuple[int, int]] = []
        load(lambda: seen.append(link("current")))
        gen, width = max(seen) if seen else idle
        top = link("max")
    except (OSError, ValueError, AttributeError) as e:
        raise RuntimeError(f"{why}, and the PCIe link is not readable from {dev}: {e}") from None
    free, total = torch.cuda.mem_get_info(index)
    return Identity(torch.cuda.get_device_name(index), int(total), int(free), "", gen, width, idle[0], top[0], top[1],
                    f"torch and {dev} ({why})")


def _copy_load(host: torch.Tensor, dev: torch.Tensor, sample: Callable[[], None], seconds: float = 0.25) -> None:
    """Keep H2D copies running on a side stream for about `seconds` and call `sample` meanwhile."""
    side = torch.cuda.Stream()
    n = min(host.numel(), dev.numel(), 256 * MiB)
    with torch.cuda.stream(side):
        for _ in range(max(1, int(seconds * 50 * GB / n))):
            dev[:n].copy_(host[:n], non_blocking=True)
    deadline = time.perf_counter() + seconds
    time.sleep(0.02)
    while not side.query() and time.perf_counter() < deadline:
        sample()
        time.sleep(0.01)
    side.synchronize()


# ---------------------------------------------------------------- bandwidths


def _slots(buf: torch.Tensor, size: int, i: int) -> torch.Tensor:
    k = buf.numel() // size
    j = i % k
    return buf[j * size:(j + 1) * size]


def _iters(size: int, s: GpuSettings) -> int:
    return max(1, min(s.max_iters, s.target_bytes // size))


def copy_buffers(nbytes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pinned host, pageable host, device) byte buffers for the copy curves, filled and touched."""
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned.view(torch.int32).copy_(torch.arange(nbytes // 4, dtype=torch.int32))   # distinct words, not zeros
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pageable.copy_(pinned)                          # touched pages: no first-touch faults while timing
    if pageable.is_pinned() or not pinned.is_pinned():
        raise RuntimeError("pinned/pageable buffers are not what they should be")
    return pinned, pageable, torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def copy_curves(s: GpuSettings, pinned: torch.Tensor, pageable: torch.Tensor, dev: torch.Tensor,
                tick: Callable[[], None] | None = None, zero_copy=None) -> dict[str, dict[int, Stats]]:
    """Pinned and pageable H2D and D2H over `s.sizes`, interleaved; with `zero_copy` (a `ZeroCopyProbe`) also
    its kernel's reads of registered host memory over `zero_copy_sizes(s)`, interleaved with the copies."""
    def h2d_pinned(size: int) -> float:
        it = _iters(size, s)

        def go() -> None:
            for i in range(it):
                _slots(dev, size, i).copy_(_slots(pinned, size, i), non_blocking=True)
        return size * it / _event_seconds(go, it) / GB

    def d2h_pinned(size: int) -> float:
        it = _iters(size, s)

        def go() -> None:
            for i in range(it):
                _slots(pinned, size, i).copy_(_slots(dev, size, i), non_blocking=True)
        return size * it / _event_seconds(go, it) / GB

    def h2d_pageable(size: int) -> float:
        it = _iters(size, s)
        return size * it / _host_seconds(lambda: [_slots(dev, size, i).copy_(_slots(pageable, size, i))
                                                  for i in range(it)]) / GB

    def d2h_pageable(size: int) -> float:
        it = _iters(size, s)
        return size * it / _host_seconds(lambda: [_slots(pageable, size, i).copy_(_slots(dev, size, i))
                                                  for i in range(it)]) / GB

    modes = {"h2d_pinned": h2d_pinned, "h2d_pageable": h2d_pageable, "d2h_pinned": d2h_pinned,
             "d2h_pageable": d2h_pageable}
    sizes = {m: s.sizes for m in modes}
    if zero_copy is not None:
        modes["zero_copy"] = lambda size: zero_copy.gbps(size, s)
        sizes["zero_copy"] = zero_copy_sizes(s)
    for fn in modes.values():                              # warm-up: contexts, staging buffers, clocks
        fn(s.sizes[-1])
    stats = interleaved([(m, z) for m in modes for z in sizes[m]], lambda k: modes[k[0]](k[1]), s.repeats, tick)
    return {m: {z: stats[(m, z)] for z in sizes[m]} for m in modes}


# ---------------------------------------------------------------- zero-copy reads


def zero_copy_sizes(s: GpuSettings) -> tuple[int, ...]:
    """Read sizes of the zero-copy curve: the transfer sizes and the layer-sized reads (LAYER_READ_SIZES)."""
    return tuple(sorted(set(s.sizes) | set(LAYER_READ_SIZES)))


class ZeroCopyProbe:
    """Registered pinned host memory (`pinned.HostRegion`) of `nbytes`, filled with distinct non-zero int32
    words, and the kernel that reads it in place (`kernels.stream_read`) from a small device arena at offset
    `region.device_ptr - arena.data_ptr()`, as `fused_moe` reads a RAM expert. `close()` unregisters it.
    On a CPU device (tests, Triton's interpreter) the region is not registered and is read at its host address."""

    def __init__(self, nbytes: int, device: torch.device | str = "cuda", node: int | None = -1):
        from strata_plan.kernels.stream_read import stream_read
        from strata_plan.pinned import HostRegion
        self._read = stream_read
        self.region = HostRegion(nbytes, device, node)           # node -1: the GPU's NUMA node, as the engine's
        words = self.region.tensor.view(torch.int32)
        step = 16 << 20
        for i in range(0, words.numel(), step):            # 1, 2, 3, ...: no word is zero, no two are equal
            n = min(step, words.numel() - i)
            words[i:i + n].copy_(torch.arange(i + 1, i + n + 1, dtype=torch.int32))
        del words
        self.arena = torch.empty(256, dtype=torch.uint8, device=device)
        # where the kernel reads the region: its device address (a CPU device, in Triton's interpreter: its own)
        self.base = (self.region.device_ptr or self.region.host_ptr) - self.arena.data_ptr()
        self._outs: dict[int, torch.Tensor] = {}

    def read(self, offset: int, size: int) -> torch.Tensor:
        """Enqueue one kernel reading `size` bytes at byte `offset` of the region; its per-program partials."""
        if size not in self._outs:
            from strata_plan.kernels.stream_read import programs_for
            self._outs[size] = torch.empty(programs_for(self.arena.device, size), dtype=torch.int64,
                                           device=self.arena.device)
        return self._read(self.arena, self.base + offset, size, self._outs[size])

    def check(self, size: int) -> None:
        """The kernel's checksum of the region's first `size` bytes equals the CPU's of the same bytes."""
        from strata_plan.kernels.stream_read import checksum, reference_checksum
        got = checksum(self.read(0, size))
        want = reference_checksum(self.region.tensor[:size])
        if got != want:
            raise RuntimeError(f"zero-copy check failed: the kernel's checksum of {size} bytes of registered host "
                               f"memory is {got}, the CPU's {want}")

    def gbps(self, size: int, s: GpuSettings) -> float:
        """GB/s of one timed sample: reads of `size` bytes cycling through the region's size-sized slots
        (as the copies cycle through their buffer), CUDA events around them."""
        it = _iters(size, s)
        slots = max(1, self.region.nbytes // size)
        offsets = [(i % slots) * size for i in range(it)]

        def go() -> None:
            for off in offsets:
                self.read(off, size)
        return size * it / _event_seconds(go, TRITON_LAUNCH_OPS * it) / GB

    def close(self) -> None:
        self._outs.clear()
        self.region.close()


def zero_copy_probe(s: GpuSettings, notes: list[str]) -> ZeroCopyProbe | None:
    """A `ZeroCopyProbe` over the largest zero-copy size, its kernel compiled and its reads checked; None with a
    note when it cannot run here (no Triton, registration refused, wrong bytes read)."""
    probe = None
    try:
        probe = ZeroCopyProbe(max(zero_copy_sizes(s)))
        probe.check(max(zero_copy_sizes(s)))
        share = probe.region.huge_share()          # 4 KiB pages cost the GPU's reads more address translations
        if share is not None:
            notes.append(f"zero-copy reads: {share:.0%} of the probe's {probe.region.mapped / GiB:.2f} GiB region on "
                         "transparent huge pages" + (f", its pages asked of NUMA node {probe.region.node} (the GPU's)"
                                                     if probe.region.node is not None else ""))
        return probe
    except Exception as e:  # noqa: BLE001 -- a kernel failure must not lose the whole profile
        if probe is not None:
            probe.close()
        notes.append(f"zero-copy reads skipped: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
        return None


def h2d_during_kernel(s: GpuSettings, pinned: torch.Tensor, dev: torch.Tensor, work: torch.Tensor,
                      h2d: dict[int, Stats], tick: Callable[[], None] | None = None) -> dict[int, Stats]:
    """Pinned H2D while a memory-bound kernel (an elementwise pass over `work`) runs on another stream.
    The kernels are released together with the copies and outlast them by half again."""
    half = work.numel() // 2
    a, b = work[:half], work[half:2 * half]
    side, copy = torch.cuda.Stream(), torch.cuda.Stream()
    kernel = lambda: torch.mul(a, 1.0001, out=b)  # noqa: E731
    k_seconds = _event_seconds(lambda: [kernel() for _ in range(10)], 10) / 10

    def one(size: int) -> float:
        it = _iters(size, s)
        n_kernels = min(5000, math.ceil(1.5 * size * it / (h2d[size].median * GB) / k_seconds) + 2)
        start, end, released = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
                                torch.cuda.Event())
        torch.cuda.synchronize()
        with torch.cuda.stream(copy):
            torch.cuda._sleep(int(((it + n_kernels) * HOLD_SECONDS_PER_OP + 1e-3) * HOLD_CLOCK_HZ))
            released.record(copy)
        side.wait_event(released)
        with torch.cuda.stream(side):
            for _ in range(n_kernels):
                kernel()
        with torch.cuda.stream(copy):
            start.record(copy)
            for i in range(it):
                _slots(dev, size, i).copy_(_slots(pinned, size, i), non_blocking=True)
            end.record(copy)
        torch.cuda.synchronize()
        return size * it / (start.elapsed_time(end) / 1e3) / GB

    one(s.during_sizes[-1])
    return interleaved(s.during_sizes, one, s.repeats, tick)


def hbm_and_copy(s: GpuSettings, tick: Callable[[], None] | None = None) -> tuple[Stats, Stats]:
    """(HBM read GB/s of a sum reduction, device copy GB/s with read + write counted)."""
    n = s.hbm_bytes // 4
    x = torch.rand(n, device="cuda")
    y = torch.empty_like(x)
    it = 10

    def read() -> float:
        return x.numel() * 4 * it / _event_seconds(lambda: [x.sum() for _ in range(it)], it) / GB

    def copy() -> float:
        return 2 * x.numel() * 4 * it / _event_seconds(lambda: [y.copy_(x) for _ in range(it)], it) / GB

    read(), copy()
    st = interleaved(["read", "copy"], lambda k: read() if k == "read" else copy(), s.repeats, tick)
    if not torch.equal(x[:: max(1, n // 4096)], y[:: max(1, n // 4096)]):
        raise RuntimeError("device copy check failed: destination differs from source")
    del x, y
    return st["read"], st["copy"]


def bf16_tflops(s: GpuSettings, tick: Callable[[], None] | None = None) -> Stats:
    n = s.matmul_n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)    # random data: zeros run faster
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    it = 5
    (a @ b)
    st = interleaved([0], lambda _: 2 * n**3 * it / _event_seconds(lambda: [a @ b for _ in range(it)], it) / 1e12,
                     s.repeats, tick)[0]
    return st


def captured(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """`fn`'s work captured in a CUDA graph, after one run on a side stream (torch's rule: compiled, allocated and
    warmed outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def replay_us(g: torch.cuda.CUDAGraph) -> float:
    """Microseconds of one replay of `g` on the current stream, CUDA events around it."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3


LOOKAHEAD_SHAPE = (24, 8, 64)   # the slot kernels' probe: staging slots (depth 2 at top-8), top-k, experts a layer
LOOKAHEAD_CACHE = 8             # ... and the device LRU's slots a layer


def lookahead_layer_us(repeats: int) -> Stats:
    """Microseconds the device loop's VRAM lookahead adds to a MoE layer's main stream, its structure as in the decode
    graph (engine/prefetch.py) over LOOKAHEAD_SHAPE: `kernels.prefetch.resolve_step` (the layer's routed ids, then its
    device LRU's step in the same launch, LOOKAHEAD_CACHE slots) after a small kernel, then after another the side
    stream forked for the next layer's guesses (the slots of the layers run released, the guesses noted, claimed,
    copied, 4 KiB an expert from VRAM here, and so published) and joined at the token's end, where the last release
    runs, 4 layers a token. A graph of GRAPH_LAUNCHES / 8 tokens against the same graph with the LRU's step alone
    (`kernels.lru.lru_step`) between the small kernels, each replay timed with CUDA events, the two interleaved,
    `repeats` pairs after a warm-up: the difference a layer (the cross-stream edges included)."""
    from strata_plan.kernels import lru
    from strata_plan.kernels import prefetch as pk
    S, K, E = LOOKAHEAD_SHAPE
    L = 4
    st, cache = pk.probe_cache(pk.probe_state(S, L, E, K, "cuda", ram_base=S * 4096), LOOKAHEAD_CACHE)
    arena = torch.zeros((S + L * E) * 4096, dtype=torch.uint8, device="cuda")
    ids = torch.arange(K, dtype=torch.int64, device="cuda")          # routed, and guessed right
    x = torch.zeros(1, dtype=torch.float32, device="cuda")
    side = torch.cuda.Stream()

    def token(slots: bool) -> None:
        main = torch.cuda.current_stream()
        for j in range(L):
            x.add_(1.0)
            if slots:
                pk.resolve_step(ids, j, st, cache)
            else:
                lru.lru_step(ids, j, cache)
            x.add_(1.0)
            if slots and j + 1 < L:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    pk.release(j, st)
                    pk.note_guesses(ids, j + 1, st)
                    pk.claim(ids, j + 1, st)
                    pk.copy(arena, ids, j + 1, st, 4096)
        if slots:
            main.wait_stream(side)
            pk.release(L - 1, st)
    out = added_us(token, repeats, L)
    if int(st.counts[:, pk.COPIED].sum()) == 0:
        raise RuntimeError("lookahead probe: the side stream copied nothing")
    return out


def cache_layer_us(repeats: int) -> Stats:
    """Microseconds the device LRU adds to a MoE layer's main stream in the decode graph: `kernels.lru.lru_step` (the
    layer's routed ids: hits, admissions, evictions) then `fill_slots` (the admitted experts copied into their slots;
    none once the ids repeat, so this is the two launches' fixed part: a fill's bytes are charged as reads) between
    small kernels, LOOKAHEAD_SHAPE's top-k and experts (4 KiB each), LOOKAHEAD_CACHE slots a layer, 4 layers a token.
    A graph of GRAPH_LAUNCHES / 8 tokens against the same graph without them, each replay timed with CUDA events, the
    two interleaved, `repeats` pairs after a warm-up: the difference a layer."""
    from strata_plan.kernels import lru
    from strata_plan.kernels import prefetch as pk
    S, K, E = LOOKAHEAD_SHAPE
    C, L = LOOKAHEAD_CACHE, 4
    base = L * C * 4096                                             # the LRU's slots, then the experts' RAM rows
    _, cache = pk.probe_cache(pk.probe_state(S, L, E, K, "cuda", ram_base=base), C)
    arena = torch.zeros(base + L * E * 4096, dtype=torch.uint8, device="cuda")
    ids = torch.arange(K, dtype=torch.int64, device="cuda")          # the same ids every token: hits once admitted
    x = torch.zeros(1, dtype=torch.float32, device="cuda")

    def token(on: bool) -> None:
        for j in range(L):
            x.add_(1.0)
            if on:
                lru.lru_step(ids, j, cache)
                lru.fill_slots(arena, ids, j, cache, 4096)
            x.add_(1.0)
    out = added_us(token, repeats, L)
    if int(cache.counts[:, lru.HIT].sum()) == 0:
        raise RuntimeError("cache probe: the device LRU counted no hit")
    return out


STAGE_GUESSES = 2              # the handshake probe's lookahead depth: stage_done writes 2 x (2 top-k) guesses a layer


def stage_layer_us(repeats: int) -> Stats:
    """Microseconds the device loop's handshake with the NVMe stager adds to a MoE layer's main stream (an NVMe tier:
    engine/staging.py): `kernels.stage_wait.stage_wait` (the request row and REQ stored to pinned host memory, a
    system-scope fence, the routed ids' `ready` words loaded over the link; every one published already, so nothing
    is waited for: the waits are the reads' time, charged apart) and `stage_done` (STAGE_GUESSES depths of guesses,
    then DONE) between small kernels, LOOKAHEAD_SHAPE's top-k and experts, 4 layers a token. A graph of
    GRAPH_LAUNCHES / 8 tokens against the same graph without them, each replay timed with CUDA events, the two
    interleaved, `repeats` pairs after a warm-up: the difference a layer."""
    from strata_plan.kernels import stage_wait as sw
    _, K, E = LOOKAHEAD_SHAPE
    L, W = 4, 2 * LOOKAHEAD_SHAPE[1]
    G = STAGE_GUESSES * W
    arena, cb, _, block = sw.probe_block(L, E, K, G, 64, "cuda")    # block: the pinned memory, held while replayed
    ids = torch.arange(K, dtype=torch.int64, device="cuda")
    gids = torch.arange(G, dtype=torch.int64, device="cuda") % E
    gscores = torch.ones(G, dtype=torch.float32, device="cuda")
    x = torch.zeros(1, dtype=torch.float32, device="cuda")

    def token(on: bool) -> None:
        for j in range(L):
            x.add_(1.0)
            if on:
                sw.stage_wait(arena, ids, j, cb)
            x.add_(1.0)
            if on:
                sw.stage_done(arena, j, cb, K, gids, gscores, per_layer=W)
    out = added_us(token, repeats, L)
    if int(cb.counts[:, sw.USES].sum()) == 0 or int(cb.counts[:, sw.WAITED].sum()):
        raise RuntimeError("stage probe: the handshake read no staged expert, or waited")
    return out


def _kernel_probe(probe: Callable[[int], Stats], repeats: int, what: str, notes: list[str]) -> Stats | None:
    """`probe(repeats)`, or None with a note where it cannot run (no Triton, or its compiler failed here): the
    profile then keeps the estimate."""
    try:
        return probe(repeats)
    except Exception as e:
        notes.append(f"{what} probe skipped: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return None


def added_us(token: Callable[[bool], None], repeats: int, layers: int) -> Stats:
    """Microseconds a layer that `token(True)` adds over `token(False)` (`layers` layers a token): GRAPH_LAUNCHES / 8
    tokens of each captured in a graph, the two replays timed with CUDA events and interleaved, `repeats` pairs after
    two warm-up pairs, the difference over the graph's layers."""
    tokens = GRAPH_LAUNCHES // 8
    graphs = [captured(lambda on=on: [token(on) for _ in range(tokens)]) for on in (True, False)]
    out = []
    for i in range(repeats + 2):
        a, b = replay_us(graphs[0]), replay_us(graphs[1])
        if i >= 2:
            out.append(max(0.0, a - b) / (tokens * layers))
    return Stats(tuple(out))


# ---------------------------------------------------------------- pinning


GRAPH_LAUNCHES = 256      # kernels in the launch probe's graph


def graph_launch_us(repeats: int) -> Stats:
    """Microseconds one small kernel takes inside a CUDA graph, back to back (the floor of every launch at batch 1):
    a graph of GRAPH_LAUNCHES in-place adds on a one-element tensor (`add_chain`), each replay timed with CUDA events
    over the launches, `repeats` replays after a warm-up; checked by the tensor's final value."""
    g, x = add_chain(GRAPH_LAUNCHES)
    out = [replay_us(g) / GRAPH_LAUNCHES for _ in range(repeats + 2)][2:]
    want = GRAPH_LAUNCHES * (repeats + 3)           # the warm-up run and the replays (capture runs nothing)
    if float(x.item()) != want:
        raise RuntimeError(f"launch probe: the graph's adds left {float(x.item())}, expected {want}")
    return Stats(tuple(out))


def add_chain(n: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A CUDA graph of n in-place adds of 1 on a one-element float32 tensor (run once before the capture), and it."""
    x = torch.zeros(1, dtype=torch.float32, device="cuda")

    def adds() -> None:
        for _ in range(n):
            x.add_(1.0)
    return captured(adds), x


def pin_chunk(nbytes: int) -> Callable[[], None]:
    """Page-lock `nbytes` of fresh anonymous memory with cudaHostRegister; returns the release function."""
    buf = mmap.mmap(-1, nbytes)
    view = (ctypes.c_char * nbytes).from_buffer(buf)
    cudart = torch.cuda.cudart()
    try:
        torch.cuda.check_error(cudart.cudaHostRegister(ctypes.addressof(view), nbytes, 0))
    except BaseException:
        del view
        buf.close()
        raise

    def release() -> None:
        nonlocal view
        torch.cuda.check_error(cudart.cudaHostUnregister(ctypes.addressof(view)))
        del view
        buf.close()
    return release


# ---------------------------------------------------------------- packed-format kernels


def kernel_throughput(n: int, k: int, notes: list[str]) -> dict[str, Stats]:
    """Fused-GEMV GB/s of each packed tier format, if the kernels package provides its benchmark
    (`measure_gemv_gbps` takes its own median of repeats; one call per format here)."""
    try:
        from strata_plan.kernels.bench import measure_gemv_gbps
        from strata_plan.kernels.formats import TIER_FORMATS
    except Exception as e:  # noqa: BLE001 -- missing, or triton unusable here: skip with a note
        notes.append(f"packed-format GEMV throughput skipped: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return {}
    out: dict[str, Stats] = {}
    for fmt in TIER_FORMATS:
        try:
            out[fmt] = Stats((float(measure_gemv_gbps(fmt, n, k, device="cuda")),))
        except Exception as e:  # noqa: BLE001 -- a kernel failure must not lose the whole profile
            notes.append(f"GEMV throughput of {fmt} skipped: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    return out


def fused_moe_rates(settings, notes: list[str], tick: Callable[[], None] | None = None):
    """The fused MoE call's decode GB/s and prefill expansion rate (profiler/moe.py), or None with a note
    when the kernels cannot run here."""
    if settings is None:
        return None
    try:
        from . import moe
        return moe.measure(settings, "cuda", tick=tick)
    except Exception as e:  # noqa: BLE001 -- a kernel failure must not lose the whole profile
        notes.append(f"fused MoE rates skipped: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
        return None


PHASES = ("GPU identity and PCIe link under load", "host<->GPU copies and zero-copy reads",
          "H2D while a kernel runs on another stream", "HBM read and device copy", "bf16 matmul",
          "pinnable memory", "packed-format GEMV kernels", "fused MoE call: decode shapes, prefill expansion")


def phase_plan(s: GpuSettings, pin_cap_bytes: int) -> list[tuple[str, float, int]]:
    """(phase, estimated seconds on a fast machine, ticks) of `measure_gpu`, for the progress bar's ETA."""
    copies = (4 * len(s.sizes) + len(zero_copy_sizes(s))) * s.repeats
    n_moe = len(s.moe.decode_shapes) + 1 if s.moe is not None else 1
    return list(zip(PHASES, (1.0, 0.06 * copies + 2, 0.05 * len(s.during_sizes) * s.repeats + 1,
                             0.05 * 2 * s.repeats + 2, 0.05 * s.repeats + 1, pin_cap_bytes / (4 * GB) + 0.5, 6.0,
                             4.0 * n_moe if s.moe is not None else 0.1),
                    (1, copies, len(s.during_sizes) * s.repeats, 2 * s.repeats, s.repeats, 1, 1, n_moe)))


# ---------------------------------------------------------------- all of it


def measure_gpu(s: GpuSettings, pin_cap_bytes: int, step: Callable[[str], Callable[[], None]],
                index: int = 0) -> GpuResult:
    """Everything about GPU `index`; `step(description)` announces a phase and returns its tick."""
    notes: list[str] = []
    torch.cuda.set_device(index)
    pinned, pageable, dev = copy_buffers(max(s.sizes))

    step(PHASES[0])
    ident = identity(index, lambda sample: _copy_load(pinned, dev, sample))
    if ident.pcie_gen < ident.max_gen or ident.pcie_width < ident.max_width:
        notes.append(f"PCIe link ran at Gen{ident.pcie_gen} x{ident.pcie_width} under load, "
                     f"below its maximum Gen{ident.max_gen} x{ident.max_width}")

    tick = step(PHASES[1])
    probe = zero_copy_probe(s, notes)
    try:
        curves = copy_curves(s, pinned, pageable, dev, tick, probe)
    finally:
        if probe is not None:                       # unregistered before the pin probe counts what it can pin
            probe.close()
    dev.copy_(pinned)
    if not torch.equal(dev[:MiB].cpu(), pinned[:MiB]):
        raise RuntimeError("H2D check failed: device bytes differ from host bytes")
    work = torch.empty(s.hbm_bytes // 4, device="cuda")
    work.uniform_()
    curves["h2d_during_kernel"] = h2d_during_kernel(s, pinned, dev, work, curves["h2d_pinned"],
                                                    step(PHASES[2]))
    del work, dev
    hbm, dcopy = hbm_and_copy(s, step(PHASES[3]))
    tflops = bf16_tflops(s, step(PHASES[4]))
    try:
        launch = graph_launch_us(s.repeats)
    except RuntimeError as e:
        launch = None
        notes.append(f"graph launch probe skipped: {str(e).splitlines()[0][:160]}")
    slots, cache_us, stage_us = (_kernel_probe(probe, s.repeats, what, notes) for probe, what in (
        (lookahead_layer_us, "lookahead slot kernel"), (cache_layer_us, "device LRU kernel"),
        (stage_layer_us, "stager handshake")))
    torch.cuda.empty_cache()

    tick = step(PHASES[5])
    try:
        pin = probe_pinnable(pin_chunk, pin_cap_bytes, min(GiB, pin_cap_bytes)) if pin_cap_bytes > 0 else None
    except AttributeError as e:                     # a torch without cudaHostRegister bindings
        pin = None
        notes.append(f"pin probe skipped: {e}")
    tick()
    if pin and pin.error:
        notes.append(f"pinning stopped at {pin.pinned_gb:.1f} GB: {pin.error}")

    step(PHASES[6])
    kernels = kernel_throughput(*s.gemv_shape, notes=notes)
    moe_rates = fused_moe_rates(s.moe, notes, step(PHASES[7]))
    return GpuResult(ident, hbm, dcopy, tflops, curves, pin, kernels, tuple(notes), moe_rates, launch, slots,
                     cache_us, stage_us)
