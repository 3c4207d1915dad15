"""The hardware profile: a versioned, documented schema with a strict loader.

Every measured or quoted number is a `Figure` (or a `Curve` / `Surface` of them) that says where it came
from: `measured` (with the date), `datasheet` or `estimate`, and a source. GB = 1e9 bytes throughout.
The planner reads bandwidths at the transfer size it moves (`Curve.at`), so profiles carry curves over
transfer size rather than one headline number. SCHEMA.md beside this file documents every field.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from strata_plan.errors import UserError
from strata_plan.schema import bounded, check_schema, parse, to_data
from strata_plan.yamlio import atomic_write_yaml, read_yaml

SCHEMA_NAME = "strata-plan/hardware-profile"
SCHEMA_VERSION = 1
PROFILES_DIR = Path(__file__).parent
Provenance = Literal["measured", "datasheet", "estimate"]


def _check_provenance(obj, what: str) -> None:
    if obj.provenance == "measured" and not obj.date:
        raise ValueError(f"{what} is marked measured but has no date (add `date: YYYY-MM-DD`)")
    if not obj.source:
        raise ValueError(f"{what} has an empty source (say where the figure comes from)")


@dataclass(frozen=True)
class Figure:
    """One number with its provenance."""

    value: float = bounded(0.0, 1e7)
    provenance: Provenance = "estimate"
    source: str = ""
    date: str = ""

    def __post_init__(self) -> None:
        _check_provenance(self, "figure")


@dataclass(frozen=True)
class Curve:
    """GB/s over transfer size in bytes; read with `at(size)`: log-size interpolation between points, the last
    point's rate above them, and below the first a transfer's time t(size) = latency + size / bandwidth through the
    first two points (each a measured time; the latency kept between 0 and the first point's whole time)."""

    points: tuple[tuple[int, float], ...]
    provenance: Provenance = "estimate"
    source: str = ""
    date: str = ""

    def __post_init__(self) -> None:
        _check_provenance(self, "curve")
        if not self.points:
            raise ValueError("curve has no points (give [[bytes, GB/s], ...])")
        sizes = [p[0] for p in self.points]
        if sizes != sorted(set(sizes)):
            raise ValueError("curve sizes must be strictly increasing")
        for s, v in self.points:
            if s <= 0 or s > 2**40 or not (0 < v < 1e6):
                raise ValueError(f"curve point [{s}, {v}] out of range (size 1 B..1 TiB, 0 < GB/s < 1e6)")

    def at(self, size: int | float) -> float:
        sizes = [p[0] for p in self.points]
        vals = [p[1] for p in self.points]
        if size <= sizes[0]:
            return self._below(size)
        if size >= sizes[-1]:
            return vals[-1]
        i = bisect.bisect_right(sizes, size)
        x0, x1 = math.log(sizes[i - 1]), math.log(sizes[i])
        t = (math.log(size) - x0) / (x1 - x0)
        return vals[i - 1] + t * (vals[i] - vals[i - 1])

    def _below(self, size: float) -> float:
        """GB/s at a size at or below the first point: t(size) = latency + size x per_byte, the line through the first
        two points' times, with per_byte between 0 (all latency: the first point's time for any smaller transfer)
        and the first point's own seconds per byte (all bandwidth: its rate); one point: all latency."""
        if size <= 0:
            return 0.0
        (s0, r0) = self.points[0]
        t0 = s0 / r0                                         # ns (bytes / GB/s)
        per_byte = 0.0
        if len(self.points) > 1:
            s1, r1 = self.points[1]
            per_byte = min(max(0.0, (s1 / r1 - t0) / (s1 - s0)), t0 / s0)
        return size / (t0 - per_byte * (s0 - size))

    def scaled(self, factor: float) -> "Curve":
        return dataclasses.replace(self, points=tuple((s, v * factor) for s, v in self.points))


@dataclass(frozen=True)
class Surface:
    """GB/s over (block size in bytes, queue depth): NVMe reads. `at` picks the nearest measured queue
    depth not above the one asked for and interpolates over block size."""

    points: tuple[tuple[int, int, float], ...]
    provenance: Provenance = "estimate"
    source: str = ""
    date: str = ""

    def __post_init__(self) -> None:
        _check_provenance(self, "surface")
        if not self.points:
            raise ValueError("surface has no points (give [[block_bytes, queue_depth, GB/s], ...])")
        for b, q, v in self.points:
            if b <= 0 or b > 2**34 or q < 1 or q > 4096 or not (0 < v < 1e5):
                raise ValueError(f"surface point [{b}, {q}, {v}] out of range")

    @property
    def queue_depths(self) -> tuple[int, ...]:
        return tuple(sorted({q for _, q, _ in self.points}))

    def curve(self, queue_depth: int) -> Curve:
        qds = self.queue_depths
        below = [q for q in qds if q <= queue_depth]
        q = below[-1] if below else qds[0]
        pts = sorted((b, v) for b, qq, v in self.points if qq == q)
        return Curve(tuple(pts), self.provenance, self.source, self.date)

    def at(self, block: int, queue_depth: int) -> float:
        return self.curve(queue_depth).at(block)

    def best(self, block: int) -> tuple[float, int]:
        """(GB/s, queue depth) of the best measured queue depth at this block size."""
        return max((self.at(block, q), q) for q in self.queue_depths)

    def scaled(self, factor: float) -> "Surface":
        return dataclasses.replace(self, points=tuple((b, q, v * factor) for b, q, v in self.points))


@dataclass(frozen=True)
class MoEDecodeRate:
    """The fused MoE decode call (batch 1, one layer's top-k experts in the tier mix, both launches) at a
    few expert shapes: points [hidden, intermediate, top_k, layer_bytes, GB/s], where layer_bytes are the
    packed bytes of the k experts and GB/s = layer_bytes / seconds a layer. `at(layer_bytes)` reads it over
    layer bytes as a `Curve` (log interpolation; below the smallest layer measured latency + bytes / bandwidth
    through the two smallest layers' times, above the largest the rate stays its rate)."""

    points: tuple[tuple[int, int, int, int, float], ...]
    provenance: Provenance = "estimate"
    source: str = ""
    date: str = ""

    def __post_init__(self) -> None:
        _check_provenance(self, "fused_moe_decode")
        if not self.points:
            raise ValueError("fused_moe_decode has no points (give [[hidden, intermediate, top_k, layer_bytes, GB/s], ...])")
        for h, i, k, b, v in self.points:
            if min(h, i, k, b) <= 0 or b > 2**40 or not (0 < v < 1e6):
                raise ValueError(f"fused_moe_decode point [{h}, {i}, {k}, {b}, {v}] out of range")

    def curve(self) -> Curve:
        best: dict[int, float] = {}
        for *_, b, v in self.points:          # one value a size (two shapes of equal bytes: their mean)
            best[b] = (best[b] + v) / 2 if b in best else v
        return Curve(tuple(sorted(best.items())), self.provenance, self.source, self.date)

    def at(self, layer_bytes: int | float) -> float:
        return self.curve().at(layer_bytes)


@dataclass(frozen=True)
class MoEPrefillRate:
    """The fused MoE prefill call (a chunk of `tokens` tokens through a whole layer of `n_experts` experts
    in the tier mix, top-k routing): weights expanded a second, counting each touched expert's
    3 x hidden x intermediate weights once. Points [hidden, intermediate, top_k, n_experts, tokens,
    Gweights/s]."""

    points: tuple[tuple[int, int, int, int, int, float], ...]
    provenance: Provenance = "estimate"
    source: str = ""
    date: str = ""

    def __post_init__(self) -> None:
        _check_provenance(self, "fused_moe_prefill")
        if not self.points:
            raise ValueError("fused_moe_prefill has no points "
                             "(give [[hidden, intermediate, top_k, n_experts, tokens, Gweights/s], ...])")
        for h, i, k, e, m, v in self.points:
            if min(h, i, k, e, m) <= 0 or not (0 < v < 1e7):
                raise ValueError(f"fused_moe_prefill point [{h}, {i}, {k}, {e}, {m}, {v}] out of range")

    def at(self, expert_params: int, tokens: int) -> float:
        """Gweights/s at a chunk of `tokens`, from the measured shape nearest `expert_params` (log distance),
        interpolated over log tokens and clamped at the measured ends (expansion is paid per touched expert,
        not per token)."""
        shapes = {(h, i) for h, i, *_ in self.points}
        h, i = min(shapes, key=lambda s: (abs(math.log(3 * s[0] * s[1] / expert_params)), s))
        pts = sorted((m, v) for hh, ii, _, _, m, v in self.points if (hh, ii) == (h, i))
        xs = [math.log(m) for m, _ in pts]
        x = math.log(max(tokens, 1))
        if x <= xs[0]:
            return pts[0][1]
        if x >= xs[-1]:
            return pts[-1][1]
        j = bisect.bisect_right(xs, x)
        t = (x - xs[j - 1]) / (xs[j] - xs[j - 1])
        return pts[j - 1][1] + t * (pts[j][1] - pts[j - 1][1])


@dataclass(frozen=True)
class LayerTime:
    """GPU microseconds of one model geometry's batch-1 decode step pieces in a CUDA graph, measured by
    `engine.layer_times` (the engine's own layers on random weights): `head_us` the embedding row, final norm, lm_head
    and argmax; `dense_layer_us` a dense decoder layer (0: the model has none); `moe_layer_us` a MoE decoder layer
    without its routed experts (attention over `context` cached positions, norms, router, shared expert); `pick_us`
    what drawing the token by temperature and top-p (`engine.picks.GumbelPick`, its sort included) takes beyond the
    argmax (0: not measured). `geometry` is `core.spec.ModelSpec.layer_geometry` of the specs it serves."""

    geometry: str
    model: str
    context: int = bounded(1, 1 << 24)
    head_us: float = bounded(0.0, 1e6)
    dense_layer_us: float = bounded(0.0, 1e6)
    moe_layer_us: float = bounded(0.0, 1e6)
    provenance: Provenance = "estimate"
    source: str = ""
    date: str = ""
    pick_us: float = bounded(0.0, 1e6, default=0.0)

    def __post_init__(self) -> None:
        _check_provenance(self, "layer_times entry")


@dataclass(frozen=True)
class GPU:
    name: str
    vram_gb: Figure
    hbm_gbps: Figure
    bf16_tflops: Figure
    pcie_gen: Figure
    pcie_width: Figure
    h2d_pinned: Curve
    h2d_pageable: Curve
    d2h_pinned: Curve
    d2h_pageable: Curve | None = None
    h2d_during_kernel: Curve | None = None     # pinned H2D while a kernel runs on another stream
    zero_copy: Curve | None = None             # kernel reads of registered pinned host memory (zero-copy), GB/s by read size
    device_copy_gbps: Figure | None = None     # device-to-device copy, read + write counted
    p2p_gbps: Figure | None = None             # to a peer GPU, if any
    kernel_gbps: dict[str, Figure] = field(default_factory=dict)  # fused-GEMV bytes/s per packed format
    fused_moe_decode: MoEDecodeRate | None = None      # the fused MoE decode call, GB/s at a few expert shapes
    fused_moe_prefill: MoEPrefillRate | None = None    # the fused MoE prefill call, weights expanded a second
    graph_launch_us: Figure | None = None      # one small kernel inside a CUDA graph, back to back (the launch floor)
    lookahead_layer_us: Figure | None = None   # the VRAM lookahead's main-stream slot kernel (resolve) in a MoE layer
    cache_layer_us: Figure | None = None       # the device LRU's step and fill (their fixed part) in a MoE layer
    stage_layer_us: Figure | None = None       # the NVMe stager's handshake (stage_wait + stage_done) in a MoE layer
    layer_times: tuple[LayerTime, ...] | None = None   # decoder layers' GPU time by model geometry (engine.layer_times)
    driver: str = ""

    def layer_time(self, geometry: str) -> LayerTime | None:
        """The measured `layer_times` entry of this geometry (`ModelSpec.layer_geometry`), or None."""
        return next((t for t in self.layer_times or () if t.geometry == geometry), None)

    def launch_us(self) -> Figure:
        """`graph_launch_us`, or the default estimate (`DEFAULT_GRAPH_LAUNCH`) where the profile has none."""
        return self.graph_launch_us if self.graph_launch_us is not None else DEFAULT_GRAPH_LAUNCH

    def lookahead_layer(self) -> Figure:
        """`lookahead_layer_us`, or the default estimate (`DEFAULT_LOOKAHEAD_LAYER`) where the profile has none."""
        return self.lookahead_layer_us if self.lookahead_layer_us is not None else DEFAULT_LOOKAHEAD_LAYER

    def cache_layer(self) -> Figure:
        """`cache_layer_us`, or the default estimate (`DEFAULT_CACHE_LAYER`) where the profile has none."""
        return self.cache_layer_us if self.cache_layer_us is not None else DEFAULT_CACHE_LAYER

    def stage_layer(self) -> Figure:
        """`stage_layer_us`, or the default estimate (`DEFAULT_STAGE_LAYER`) where the profile has none."""
        return self.stage_layer_us if self.stage_layer_us is not None else DEFAULT_STAGE_LAYER

    def __post_init__(self) -> None:
        if not (0 < self.vram_gb.value <= 4096):
            raise ValueError("vram_gb must be between 0 and 4096 GB")
        if self.pcie_gen.value not in (1, 2, 3, 4, 5, 6, 7):
            raise ValueError("pcie_gen must be a PCIe generation 1..7")
        if self.pcie_width.value not in (1, 2, 4, 8, 16, 32):
            raise ValueError("pcie_width must be 1, 2, 4, 8, 16 or 32 lanes")

    @property
    def vram_bytes(self) -> int:
        return int(self.vram_gb.value * 1e9)


@dataclass(frozen=True)
class Host:
    ram_gb: Figure
    ram_gbps: Figure                      # multi-threaded memcpy, read + write counted
    pinnable_gb: Figure                   # how much can be page-locked
    available_gb: Figure | None = None
    pin_rate_gbps: Figure | None = None   # how fast memory can be pinned

    def __post_init__(self) -> None:
        if not (0 < self.ram_gb.value <= 65536):
            raise ValueError("ram_gb must be between 0 and 65536 GB")
        if self.pinnable_gb.value > self.ram_gb.value:
            raise ValueError("pinnable_gb exceeds ram_gb")


@dataclass(frozen=True)
class NVMe:
    name: str
    capacity_gb: Figure
    rand_read: Surface                    # O_DIRECT random reads: the planner's cold-miss path
    seq_read: Surface | None = None
    path: str = ""                        # where it was measured
    direct_io: bool = True                # False: filesystem refused O_DIRECT (posix_fadvise fallback)


@dataclass(frozen=True)
class CPU:
    model: str
    cores: Figure
    threads: Figure | None = None


@dataclass(frozen=True)
class Calibration:
    """Constants of the cost model that measured runs refine (FlexGen's lesson: fit, don't guess).
    Until the engine measures them they are estimates, and say so."""

    hbm_efficiency: Figure        # fraction of hbm_gbps that fused expert kernels reach
    compute_efficiency: Figure    # fraction of bf16_tflops that prefill GEMMs reach
    layer_overhead_us: Figure     # fixed cost per decoder layer per token (launches, sync)
    copy_overlap: Figure          # fraction of H2D bandwidth kept while kernels run
    dense_stream_efficiency: Figure   # fraction of pinned H2D reached when streaming dense weights
    moe_round_trip_us: Figure | None = None   # host round trip of one MoE layer per token; None: the default
    host_fetch_us: Figure | None = None       # host time the store spends issuing one expert fetch; None: the default
    prefetch_overlap: Figure | None = None    # share of the lookahead's link time hidden behind other work; None: 1
    stager_wake_us: Figure | None = None      # device loop: a layer's NVMe request to its first read; None: the default
    stager_read_us: Figure | None = None      # device loop: the stager's host time between a request's reads
    stager_publish_us: Figure | None = None   # device loop: a batch's last read in to its ready words

    @property
    def round_trip(self) -> Figure:
        """`moe_round_trip_us`, or the default estimate (`DEFAULT_MOE_ROUND_TRIP`) where the profile has none
        (absent, the field changes neither the profile's YAML nor its sha256 that plans record)."""
        return self.moe_round_trip_us if self.moe_round_trip_us is not None else DEFAULT_MOE_ROUND_TRIP


    @property
    def host_fetch(self) -> Figure:
        """`host_fetch_us`, or the default estimate (`DEFAULT_HOST_FETCH`) where the profile has none."""
        return self.host_fetch_us if self.host_fetch_us is not None else DEFAULT_HOST_FETCH

    @property
    def stager_wake(self) -> Figure:
        """`stager_wake_us`, or the default estimate (`DEFAULT_STAGER_WAKE`) where the profile has none."""
        return self.stager_wake_us if self.stager_wake_us is not None else DEFAULT_STAGER_WAKE

    @property
    def stager_read(self) -> Figure:
        """`stager_read_us`, or the default estimate (`DEFAULT_STAGER_READ`) where the profile has none."""
        return self.stager_read_us if self.stager_read_us is not None else DEFAULT_STAGER_READ

    @property
    def stager_publish(self) -> Figure:
        """`stager_publish_us`, or the default estimate (`DEFAULT_STAGER_PUBLISH`) where the profile has none."""
        return self.stager_publish_us if self.stager_publish_us is not None else DEFAULT_STAGER_PUBLISH

    @property
    def overlap(self) -> Figure:
        """`prefetch_overlap`, or the default (`DEFAULT_PREFETCH_OVERLAP`, the ideal) where the profile has none."""
        return self.prefetch_overlap if self.prefetch_overlap is not None else DEFAULT_PREFETCH_OVERLAP


DEFAULT_GRAPH_LAUNCH = Figure(4.3, "estimate", "H200: the tiny fused MoE call (2 kernels) replayed in a CUDA graph "
                              "took 8.67 us (kernels-20261203T182906Z.json); the profiler's floor, one add a kernel, "
                              "measured 1.13 us there (benchmarks/data/run-20261205). `strata-plan profile` measures "
                              "it (graph_launch_us)")
DEFAULT_LOOKAHEAD_LAYER = Figure(4.3, "estimate", "H100: resolve 4.3 us a MoE layer in the decode graph of "
                                 "bench-moe's geometry, random weights (benchmarks/tools/step_kernels.py, 2026-12-05; "
                                 "release runs on the side stream). "
                                 "`strata-plan profile` measures it (lookahead_layer_us)")
DEFAULT_CACHE_LAYER = Figure(7.0, "estimate", "H100: lru_step 3.5 us and fill_kernel 3.6 us a MoE layer in the trained "
                             "bench-moe's decode graph (benchmarks/tools/step_kernels.py through run_trained_gpu.sh "
                             "STEP_KERNELS=1, 2026-12-06). `strata-plan profile` measures it (cache_layer_us)")
DEFAULT_STAGE_LAYER = Figure(5.0, "estimate", "not measured: two one-program launches at the H200's floor (about 1.1 us "
                             "each) and a PCIe round trip or two (the system-scope fence, the ready words' acquire "
                             "loads from pinned RAM, about 1-2 us each). `strata-plan profile` measures it "
                             "(stage_layer_us)")
DEFAULT_MOE_ROUND_TRIP = Figure(75.0, "estimate", "H200, plain PyTorch: router GEMV, top-8 and .cpu() of the ids "
                                "(engine/ENGINE.md); the copy path's (several GPUs) and prefill's, not measured by "
                                "`strata-plan calibrate`")
"""The host round trip of one MoE layer per decode token: the router's ids to the host, the store's `ensure`
and the launch of the MoE call, serial with the layer's demand copies (planner/PLANNER.md)."""

DEFAULT_HOST_FETCH = Figure(90.0, "estimate", "H200 host, the engine's store (Python): 84 and 109 us of host time per "
                            "fetched expert in LRU runs of two models (engine-20261203T145904Z.json, "
                            "engine-trained-20261203T150649Z.json); the copy path's (several GPUs), not measured by "
                            "`strata-plan calibrate`")
"""Host time of one expert fetch issued by the store (bookkeeping, the copy's enqueue, its events): the demand
fetches of a MoE layer are issued one after another after its round trip, the hinted ones by the hint thread
under the same interpreter lock (planner/PLANNER.md, "Host time per fetch")."""


DEFAULT_STAGER_WAKE = Figure(56.0, "estimate", "the H100 machine, the trained model's seed plan read through AIO "
                             "(the engine's default; benchmarks/results/engine-trained-20261206T080500Z.json, 3 runs, "
                             "4510 demand reads): a request's first demand read started 0.022 ms after the poller "
                             "queued it, plus half the poller's 0.067 ms gap; `strata-plan calibrate` measures it from "
                             "device-loop runs")
"""Host seconds from a MoE layer's NVMe request (the routed ids in the pinned ring) to the stager's first read of it
starting: the poller seeing the row, a reader waking and taking a slot (planner/PLANNER.md, "Cost model")."""

DEFAULT_STAGER_READ = Figure(19.0, "estimate", "the same runs: each further demand read of a request started 0.019 ms "
                             "after the one before (reader threads: 0.081 ms in the same call); `strata-plan "
                             "calibrate` measures it")
"""Host seconds between the starts of one request's demand reads: each reader's turn at the stager's lock and the
interpreter lock (its slot, the read's issue, the publish), so a layer's reads start one after another."""

DEFAULT_STAGER_PUBLISH = Figure(31.0, "estimate", "the H100 machine, the trained model's seed plan read through AIO "
                                "(benchmarks/results/engine-trained-20261206T113306Z.json, 26191 demand reads): a "
                                "demand read's 0.031 ms from its last part in to its ready word; `strata-plan "
                                "calibrate` measures it from device-loop runs (the stager's demand_read_ms_mean less "
                                "demand_land_ms_mean)")
"""Host seconds from the stager seeing a batch's last read in (the reaper, or a reader, running again after the
drive's completion: its wake counts with the drive's time) to the batch's ready words in pinned RAM: the stager's
lock, the checksum at a blob's first read, the publish; the GPU's wait ends with it."""


DEFAULT_PREFETCH_OVERLAP = Figure(1.0, "estimate", "the ideal: every prefetch copy runs while the GPU computes or the "
                                  "host works; the copy path's (several GPUs), not measured by `strata-plan calibrate` "
                                  "(planner/PLANNER.md, \"Lookahead overlap\")")
"""The share of a lookahead prefetch's link time that overlaps the rest of the token (the GPU's kernels, the host's
work); the rest is serial with the layer it is for (planner/PLANNER.md, "Lookahead overlap")."""


def default_calibration() -> Calibration:
    src = "strata-plan default; refine with measured runs"
    e = lambda v: Figure(v, "estimate", src)  # noqa: E731
    return Calibration(hbm_efficiency=e(0.7), compute_efficiency=e(0.5), layer_overhead_us=e(30.0),
                       copy_overlap=e(0.9), dense_stream_efficiency=e(0.9))


PeerKind = Literal["none", "pcie", "nvlink"]


@dataclass(frozen=True)
class PeerLink:
    """How the GPUs of a several-GPU profile reach each other: `none` (every GPU-to-GPU byte goes through
    host memory: D2H on one, H2D on the other), `pcie` (PCIe peer-to-peer through the root complex or a
    switch) or `nvlink`; `gbps` is one direction between one pair (required unless `none`)."""

    kind: PeerKind
    gbps: Figure | None = None
    latency_us: Figure | None = None      # one small transfer; absent: DEFAULT_PEER_LATENCY (an estimate)

    def __post_init__(self) -> None:
        if self.kind != "none" and (self.gbps is None or self.gbps.value <= 0):
            raise ValueError(f"peer kind {self.kind!r} needs `gbps` (one direction, one pair)")
        if self.kind == "none" and self.gbps is not None:
            raise ValueError("peer kind 'none' has no `gbps` (remove it, or say pcie / nvlink)")

    @property
    def latency(self) -> Figure:
        return self.latency_us if self.latency_us is not None else DEFAULT_PEER_LATENCY


DEFAULT_PEER_LATENCY = Figure(10.0, "estimate", "one small peer copy (cudaMemcpyPeerAsync launch and completion), "
                              "~10 us assumed; unmeasured")


@dataclass(frozen=True)
class HostLinks:
    """The host side of the GPUs' PCIe links: whether they share a root complex (a CPU's x16 lanes split x8/x8,
    or a switch with one uplink), and the pinned H2D the host delivers to all GPUs at once (the limit of
    concurrent copies). Stated with provenance: `estimate` with the assumption in `source` when unknown."""

    shared_root_complex: bool
    concurrent_h2d_gbps: Figure           # total pinned H2D to all GPUs at once
    provenance: Provenance = "estimate"   # of `shared_root_complex`
    source: str = ""
    date: str = ""

    def __post_init__(self) -> None:
        _check_provenance(self, "host_links")


@dataclass(frozen=True)
class Topology:
    """How the GPUs of a profile with several GPUs connect (absent in one-GPU profiles). Each GPU's own link
    (generation, lanes: x16, or x8 on a consumer board's x8/x8) and H2D curves stay in its `GPU` entry."""

    peer: PeerLink
    host_links: HostLinks


@dataclass(frozen=True)
class HardwareProfile:
    schema: str
    version: int
    name: str
    gpus: tuple[GPU, ...]
    host: Host
    nvme: tuple[NVMe, ...]
    cpu: CPU
    calibration: Calibration = field(default_factory=default_calibration)
    description: str = ""
    created: str = ""
    strata_plan_version: str = ""
    topology: Topology | None = None      # several GPUs only: peer links and the host side of their links

    def __post_init__(self) -> None:
        check_schema(self, SCHEMA_NAME, SCHEMA_VERSION)
        if self.topology is not None and len(self.gpus) < 2:
            raise ValueError("`topology` describes several GPUs; this profile has "
                             f"{len(self.gpus)} (remove `topology`, or list every GPU)")

    @property
    def gpu(self) -> GPU | None:
        """The GPU plans use (the first); None for a host-only profile."""
        return self.gpus[0] if self.gpus else None

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)

    @property
    def peer(self) -> PeerLink:
        """The GPUs' peer link: the topology's, else none (every GPU-to-GPU byte through host memory)."""
        return self.topology.peer if self.topology is not None else PeerLink("none")

    def concurrent_h2d(self) -> Figure:
        """Total pinned H2D to all GPUs at once: the topology's, else (stated as an assumption) the sum of the
        GPUs' own plateaus, as if no two GPUs shared a root complex."""
        if self.topology is not None:
            return self.topology.host_links.concurrent_h2d_gbps
        total = sum(max(v for _, v in g.h2d_pinned.points) for g in self.gpus)
        return Figure(total, "estimate", "no topology in the profile: the GPUs' H2D plateaus added, assuming "
                      "separate root complexes (an assumption)")

    def with_gpu(self, gpu: GPU, name: str | None = None) -> "HardwareProfile":
        """This host with another GPU (e.g. a measured laptop host plus a shipped card)."""
        return dataclasses.replace(self, gpus=(gpu,), name=name or f"{self.name}+{gpu.name}", topology=None)

    def first_gpus(self, n: int) -> "HardwareProfile":
        """This machine using only its first `n` GPUs (one: the topology goes)."""
        if n >= len(self.gpus):
            return self
        return dataclasses.replace(self, gpus=self.gpus[:n], topology=self.topology if n > 1 else None)


def load_profile(name_or_path: str) -> HardwareProfile:
    """A shipped profile by name (`rtx-4090`) or a path to a profile YAML."""
    p = Path(name_or_path)
    if not p.exists():
        shipped = PROFILES_DIR / f"{name_or_path}.yaml"
        if shipped.exists():
            p = shipped
        elif p.suffix in (".yaml", ".yml") or "/" in name_or_path:
            raise UserError(name_or_path, "", "file not found", "check the path, or use a shipped profile name")
        else:
            raise UserError("--profile", name_or_path, "unknown profile name",
                            f"use one of {', '.join(shipped_profiles())} or a path to a profile YAML")
    data = read_yaml(p)
    if not isinstance(data, dict):
        raise UserError(str(p), "", "is not a mapping of profile fields", "start from a shipped profile in profiles/")
    if data.get("schema") != SCHEMA_NAME:
        raise UserError(str(p), "schema", f"got {data.get('schema')!r}", f"a hardware profile starts with `schema: {SCHEMA_NAME}`")
    return parse(HardwareProfile, data, str(p))


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def profile_summary(p: HardwareProfile) -> dict:
    """One row of `strata-plan profiles`: GPU, VRAM, pinned H2D and NVMe reads at 16 MiB, RAM."""
    g = p.gpu
    return {"name": p.name, "gpu": (f"{p.n_gpus}x " if p.n_gpus > 1 else "") + g.name if g else "(none)",
            "vram_gb": g.vram_gb.value if g else 0,
            "h2d_16MiB_gbps": round(g.h2d_pinned.at(16 << 20), 1) if g else 0, "ram_gb": p.host.ram_gb.value,
            "nvme_16MiB_gbps": round(p.nvme[0].rand_read.best(16 << 20)[0], 2) if p.nvme else 0}


def save_profile(profile: HardwareProfile, path: str | Path) -> Path:
    header = f"strata-plan hardware profile ({SCHEMA_NAME} v{SCHEMA_VERSION}); GB = 1e9 bytes. See profiles/SCHEMA.md."
    return atomic_write_yaml(path, to_data(profile), header)
