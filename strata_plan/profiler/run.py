"""One profiling run: measure host RAM, the disk under --nvme-dir, the CPU and (if there is one) the GPU,
with a progress bar and an ETA, and assemble the hardware profile from the measurements.

Without a GPU the run still measures RAM and disk and returns a host-only profile (`gpus: []`), which
`plan --gpu-preset NAME` combines with a shipped GPU (`HardwareProfile.with_gpu`).
"""
from __future__ import annotations

import platform
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from strata_plan import __version__
from strata_plan.profiles.schema import (
    CPU, GPU, NVMe, SCHEMA_NAME, SCHEMA_VERSION, Calibration, Figure, HardwareProfile, Host, MoEDecodeRate,
    MoEPrefillRate, default_calibration,
)

from . import cpu as cpu_mod
from . import host as host_mod
from . import nvme as nvme_mod
from .timing import GB, GiB, KiB, MiB, Stats, measured, measured_curve, measured_surface, today


@dataclass(frozen=True)
class Preset:
    name: str
    ram_copy_bytes: int
    ram_repeats: int
    file_gib: float             # default --max-gib
    pin_cap_gib: float          # default --pin-cap-gib
    disk: nvme_mod.DiskSettings
    gpu_sizes: tuple[int, ...]
    during_sizes: tuple[int, ...]
    gpu_repeats: int
    target_bytes: int
    max_iters: int
    hbm_bytes: int
    moe_repeats: int = 10


QUICK = Preset("quick", 256 * MiB, 3, 1.0, 4.0,
               nvme_mod.DiskSettings((128 * KiB, MiB, 4 * MiB, 16 * MiB), (1, 8, 32), (16 * MiB,), (1, 8), 0.25, 2),
               (256 * KiB, MiB, 16 * MiB, 256 * MiB, GiB), (16 * MiB, 256 * MiB), 3, 256 * MiB, 100, GiB, 5)
FULL = Preset("full", GiB, 5, 4.0, 32.0,
              nvme_mod.DiskSettings((64 * KiB, 256 * KiB, MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB),
                                    (1, 4, 8, 16, 32),
                                    (MiB, 16 * MiB), (1, 8, 32), 0.4, 3),
              (256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, GiB), (MiB, 16 * MiB, 256 * MiB), 5, GiB, 400,
              2 * GiB)
MATMUL_N = 8192
GEMV_SHAPE = (16384, 7168)      # (n, k): large enough that the packed weights do not fit in the L2 of an H200
HEADLINE_SIZE = 16 * MiB        # the transfer size the summary and copy_overlap are read at
ZERO_COPY_METHOD = ("zero-copy: a Triton kernel (strata_plan.kernels.stream_read: 16-byte loads, a grid-stride "
                    "loop over every SM) reads cuMemHostRegister'd pinned RAM (strata_plan.pinned.HostRegion) in place "
                    "at an offset from a device arena, as fused_moe reads RAM experts; CUDA events, reads cycling "
                    "through the region, checksum checked against the CPU")
LINK_BYTES = 256 * MiB          # copies of the several-GPU link measurements (profiler.multi)


@dataclass(frozen=True)
class Options:
    quick: bool = False
    nvme_dir: Path = Path(".")
    max_gib: float | None = None
    pin_cap_gib: float | None = None
    name: str = ""

    @property
    def preset(self) -> Preset:
        return QUICK if self.quick else FULL

    @property
    def file_bytes(self) -> int:
        return int((self.max_gib if self.max_gib is not None else self.preset.file_gib) * GiB)

    @property
    def pin_cap_bytes(self) -> int:
        return int((self.pin_cap_gib if self.pin_cap_gib is not None else self.preset.pin_cap_gib) * GiB)


@dataclass(frozen=True)
class ProfileRun:
    profile: HardwareProfile
    stats: dict[str, Stats]          # every headline measurement with its repeats
    notes: tuple[str, ...]
    seconds: float
    gpu_found: bool
    extra: dict = field(default_factory=dict)


class _Steps:
    """A progress bar over phases weighted by their estimated seconds, so the ETA means seconds."""

    def __init__(self, progress: Progress | None, plan: list[tuple[str, float, int]],
                 report: Callable[[str, float], None] | None = None):
        self.progress, self.plan = progress, {n: (est, ticks) for n, est, ticks in plan}
        self.report = report        # report(phase, fraction done): the TUI's progress bar
        starts, t = {}, 0.0
        for n, est, _ in plan:
            starts[n], t = t, t + est
        self.starts = starts
        self.task = progress.add_task("starting", total=t) if progress else None

    def __call__(self, name: str) -> Callable[[], None]:
        if not self.progress:
            return lambda: None
        self.progress.update(self.task, completed=self.starts[name], description=name)
        self._report()
        est, ticks = self.plan[name]

        def tick() -> None:
            self.progress.advance(self.task, est / max(ticks, 1))
            self._report()
        return tick

    def _report(self) -> None:
        if self.report:
            t = self.progress.tasks[0]
            self.report(t.description, min(t.completed / t.total, 1.0) if t.total else 0.0)

    def finish(self) -> None:
        if self.progress:
            self.progress.update(self.task, completed=self.progress.tasks[0].total, description="done")
            self._report()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "machine"


def default_name(gpu_name: str | None = None) -> str:
    """The profile's name without --name: the GPU's (`h200`), or `host-<hostname>` without one. With
    `gpu_name` None, the first CUDA device's name as torch reports it (what `strata-plan profile` names its
    default output file by, before measuring)."""
    if gpu_name is None:
        gpu_name = ""
        if _gpu_available():
            import torch
            gpu_name = torch.cuda.get_device_name(0)
            n = torch.cuda.device_count()
            return _slug(gpu_name.replace("NVIDIA ", "")) + (f"-x{n}" if n > 1 else "")
    return _slug(gpu_name.replace("NVIDIA ", "")) if gpu_name else f"host-{_slug(platform.node() or 'host')}"


def _gpu_available() -> bool:
    try:
        from . import gpu as gpu_mod
    except ImportError:
        return False
    return gpu_mod.cuda_available()


def profile_machine(opts: Options, console: Console | None = None, show_progress: bool = True,
                    on_progress: Callable[[str, float], None] | None = None) -> ProfileRun:
    """Measure this machine; `console` (stderr) gets the progress bar and the warnings; `on_progress(phase,
    fraction)` is called as the run advances (the TUI runs this in a worker thread)."""
    console = console or Console(stderr=True)
    folder = nvme_mod.check_dir(opts.nvme_dir)
    p = opts.preset
    file_bytes, warning = nvme_mod.clamp_size(opts.file_bytes, folder, 2 * p.disk.largest_block)
    notes: list[str] = [warning] if warning else []
    ram = host_mod.ram_info()
    has_gpu = _gpu_available()
    if not has_gpu:
        notes.append("no GPU found (torch.cuda.is_available() is False): host-only profile (gpus: []); "
                     "combine it with a shipped GPU via `plan --gpu-preset NAME`")
    pin_cap = min(opts.pin_cap_bytes, int(0.8 * ram.available_bytes) - 4 * GiB)
    if has_gpu and pin_cap < opts.pin_cap_bytes:
        notes.append(f"pin probe capped at {max(pin_cap, 0) / GiB:.1f} GiB (80% of available RAM less 4 GiB of "
                     f"buffers), below the asked {opts.pin_cap_bytes / GiB:g} GiB")
    early = list(notes)
    for n in early:
        console.print(f"[yellow]note:[/] {n}")

    threads = host_mod.copy_threads()
    gpu_settings = None
    plan = [("host RAM copy", 0.4 * p.ram_repeats * p.ram_copy_bytes / GiB + 1, p.ram_repeats),
            *nvme_mod.phase_plan(p.disk, file_bytes)]
    n_gpus = 0
    if has_gpu:
        from . import gpu as gpu_mod
        from . import multi as multi_mod
        from .moe import MoESettings
        gpu_settings = gpu_mod.GpuSettings(p.gpu_sizes, p.during_sizes, p.gpu_repeats, p.target_bytes, p.max_iters,
                                           p.hbm_bytes, MATMUL_N, GEMV_SHAPE, MoESettings(repeats=p.moe_repeats))
        plan += gpu_mod.phase_plan(gpu_settings, max(pin_cap, 0))
        n_gpus = gpu_mod.device_count()
        for g in range(1, n_gpus):                 # every other GPU: the same phases, no pin probe (host RAM)
            plan += [(f"GPU {g}: {name}", est, ticks) for name, est, ticks in gpu_mod.phase_plan(gpu_settings, 0)]
        if n_gpus > 1:
            plan.append(multi_mod.phase_plan(n_gpus, p.gpu_repeats))

    t0 = time.perf_counter()
    columns = (TextColumn("{task.description:<44}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not show_progress, transient=False) as progress:
        steps = _Steps(progress, plan, on_progress)
        ram_copy = host_mod.memcpy_bandwidth(p.ram_copy_bytes, threads, p.ram_repeats, steps("host RAM copy"))
        disk = nvme_mod.measure_disk(folder, file_bytes, p.disk, steps)
        gpu, more, links = None, [], None
        if has_gpu:
            gpu = gpu_mod.measure_gpu(gpu_settings, max(pin_cap, 0), steps)
            for g in range(1, n_gpus):
                more.append(gpu_mod.measure_gpu(gpu_settings, 0, lambda name, g=g: steps(f"GPU {g}: {name}"), index=g))
            if n_gpus > 1:
                links = multi_mod.measure_links(n_gpus, LINK_BYTES, p.gpu_repeats, steps(multi_mod.PHASE))
        steps.finish()
    notes += disk.notes + (gpu.notes if gpu else ()) + tuple(f"GPU {g}: {n}" for g, r in enumerate(more, 1) for n in r.notes)
    cpu = cpu_mod.cpu_info()
    profile = build_profile(opts, ram, ram_copy, threads, disk, cpu, gpu, tuple(more), links)
    stats = collect_stats(ram_copy, disk, gpu, links)
    return ProfileRun(profile, stats, tuple(notes), time.perf_counter() - t0, has_gpu,
                      {"test_file_bytes": file_bytes, "pin_cap_bytes": max(pin_cap, 0) if has_gpu else 0,
                       "notes_shown": len(early)})


def collect_stats(ram_copy: Stats, disk: nvme_mod.DiskResult, gpu, links=None) -> dict[str, Stats]:
    def size(b: int) -> str:
        return f"{b // GiB}GiB" if b >= GiB else f"{b // MiB}MiB" if b >= MiB else f"{b // KiB}KiB"
    out = {"ram_copy_gbps": ram_copy}
    out.update({f"disk_rand_{size(b)}_qd{q}_gbps": st for (b, q), st in disk.rand.items()})
    out.update({f"disk_seq_{size(b)}_qd{q}_gbps": st for (b, q), st in disk.seq.items()})
    if gpu:
        out.update({"hbm_read_gbps": gpu.hbm_read, "device_copy_gbps": gpu.device_copy, "bf16_tflops": gpu.bf16_tflops})
        for mode, curve in gpu.curves.items():
            out.update({f"{mode}_{size(z)}_gbps": st for z, st in curve.items()})
        out.update({f"gemv_{f}_gbps": st for f, st in gpu.kernel_gbps.items()})
        if gpu.moe is not None:
            out.update({f"fused_moe_decode_{h}x{i}_gbps": Stats((v,)) for h, i, _, _, v in gpu.moe.decode})
            out.update({f"fused_moe_prefill_M{m}_gweights_s": Stats((v,)) for *_, m, v in gpu.moe.prefill})
    if links is not None:
        out.update({f"h2d_alone_gpu{g}_gbps": st for g, st in links.alone.items()})
        out["h2d_all_gpus_at_once_gbps"] = links.concurrent
        out.update({f"peer_copy_{a}_to_{b}_gbps": st for (a, b), st in links.peer.items()})
    return out


def build_profile(opts: Options, ram: host_mod.RamInfo, ram_copy: Stats, threads: int, disk: nvme_mod.DiskResult,
                  cpu: cpu_mod.CpuInfo, gpu, more_gpus: tuple = (), links=None) -> HardwareProfile:
    """The profile from the measurements: `gpu` the first GPU's (None: host-only), `more_gpus` every other
    GPU's, `links` (profiler.multi.LinkResult) the links between them and the host (several GPUs)."""
    mode = "quick" if opts.quick else "full"
    host = Host(
        ram_gb=measured(ram.total_gb, "psutil.virtual_memory().total"),
        ram_gbps=measured(ram_copy.median, f"{threads}-thread numpy copy of {ram_copy_label(opts)}, read + write counted",
                          ram_copy),
        pinnable_gb=_pinnable(gpu, ram),
        available_gb=measured(ram.available_gb, "psutil.virtual_memory().available at the start of the run"),
        pin_rate_gbps=(measured(gpu.pin.rate_gbps, "cudaHostRegister of fresh 1 GiB mmap chunks (page faults included)")
                       if gpu and gpu.pin and gpu.pin.pinned_bytes else None))
    how = "O_DIRECT" if disk.direct_io else "page cache + posix_fadvise(DONTNEED) between passes (O_DIRECT refused)"
    nvme = NVMe(
        name=disk.info.name,
        capacity_gb=measured(disk.info.capacity_bytes / GB, disk.info.source),
        rand_read=measured_surface(disk.rand, f"{how} random reads, queue depth = threads, "
                                              f"{disk.file_bytes / GiB:.2f} GiB test file"),
        seq_read=measured_surface(disk.seq, f"{how} sequential reads, queue depth = threads"),
        path=disk.folder, direct_io=disk.direct_io)
    cpu_fig = CPU(cpu.model, measured(cpu.cores, cpu.source), measured(cpu.threads, cpu.source))
    gpus: tuple[GPU, ...] = ()
    calibration = default_calibration()
    topology = None
    if gpu:
        gpus = tuple(_gpu_entry(g, opts.preset) for g in (gpu, *more_gpus))
        calibration = _calibration(gpu, calibration)
        if len(gpus) > 1 and links is not None:
            from .multi import topology_from
            topology = topology_from(links)
    host_name = platform.node() or "host"
    gpu_name = gpus[0].name if gpus else ""
    name = opts.name or default_name(gpu_name) + (f"-x{len(gpus)}" if len(gpus) > 1 else "")
    what = (f"{len(gpus)}x " if len(gpus) > 1 else "") + (f"{gpu_name} + " if gpu_name else "no GPU (host-only) + ")
    desc = (f"measured by `strata-plan profile{' --quick' if opts.quick else ''}` ({mode}) on {host_name}: {what}"
            f"{ram.total_gb:.0f} GB RAM + {disk.info.name}; {cpu.model}")
    return HardwareProfile(SCHEMA_NAME, SCHEMA_VERSION, name, gpus, host, (nvme,), cpu_fig, calibration, desc,
                           today(), __version__, topology)


def ram_copy_label(opts: Options) -> str:
    return f"{opts.preset.ram_copy_bytes / GiB:g} GiB"


def _pinnable(gpu, ram: host_mod.RamInfo) -> Figure:
    if gpu is None:
        return Figure(round(0.9 * ram.available_gb, 1), "estimate",
                      "no GPU to page-lock memory with: 90% of the RAM available at profiling time (estimate)")
    pin = gpu.pin
    if pin is None or (pin.pinned_bytes == 0 and not pin.error):
        return Figure(round(0.9 * ram.available_gb, 1), "estimate",
                      "pin probe not run: 90% of the RAM available at profiling time (estimate)")
    if pin.hit_cap:
        how = (f"pinned {pin.pinned_gb:.1f} GB with cudaHostRegister without a failure and stopped at the cap "
               "(--pin-cap-gib); more may be pinnable")
    else:
        how = f"pinned {pin.pinned_gb:.1f} GB with cudaHostRegister before it failed ({pin.error})"
    return measured(pin.pinned_gb, how)


def _gpu_entry(g, p: Preset) -> GPU:
    from .gpu import GRAPH_LAUNCHES, LOOKAHEAD_CACHE, LOOKAHEAD_SHAPE, STAGE_GUESSES
    i = g.identity
    c = g.curves
    link = f"{i.source} current link read under an H2D load (idle Gen{i.idle_gen}, max Gen{i.max_gen} x{i.max_width})"
    return GPU(
        name=i.name,
        vram_gb=measured(i.total_bytes / GB, f"{i.source} memory total (free at start {i.free_bytes / GB:.1f} GB)"),
        hbm_gbps=measured(g.hbm_read.median, f"torch sum of a {p.hbm_bytes / GiB:g} GiB fp32 tensor, bytes read, CUDA events", g.hbm_read),
        bf16_tflops=measured(g.bf16_tflops.median, f"torch {MATMUL_N}^3 bf16 matmul on random data, CUDA events", g.bf16_tflops),
        pcie_gen=measured(i.pcie_gen, link),
        pcie_width=measured(i.pcie_width, link),
        h2d_pinned=measured_curve(c["h2d_pinned"], "pinned H2D, torch copy_ (cudaMemcpyAsync), CUDA events"),
        h2d_pageable=measured_curve(c["h2d_pageable"], "pageable H2D, torch copy_, host clock between synchronizations"),
        d2h_pinned=measured_curve(c["d2h_pinned"], "pinned D2H, torch copy_ (cudaMemcpyAsync), CUDA events"),
        d2h_pageable=measured_curve(c["d2h_pageable"], "pageable D2H, torch copy_, host clock between synchronizations"),
        h2d_during_kernel=measured_curve(c["h2d_during_kernel"],
                                         "pinned H2D while an HBM-bound elementwise kernel runs on another stream"),
        zero_copy=measured_curve(c["zero_copy"], ZERO_COPY_METHOD) if "zero_copy" in c else None,
        device_copy_gbps=measured(g.device_copy.median, f"torch copy_ of a {p.hbm_bytes / GiB:g} GiB fp32 tensor on the "
                                                        "device, read + write counted, CUDA events", g.device_copy),
        kernel_gbps={f: measured(st.median, f"strata_plan.kernels.bench.measure_gemv_gbps({f!r}, n={GEMV_SHAPE[0]}, "
                                            f"k={GEMV_SHAPE[1]}), its own median of repeats")
                     for f, st in g.kernel_gbps.items()},
        **fused_moe_entries(g.moe),
        graph_launch_us=_measured_or_none(getattr(g, "graph_launch", None), f"{GRAPH_LAUNCHES} in-place adds on a "
                                          "one-element tensor in one CUDA graph, replay time over the launches, CUDA "
                                          "events"),
        lookahead_layer_us=_measured_or_none(getattr(g, "lookahead_layer", None), f"kernels.prefetch resolve_step "
                                             f"(slots, top-k, experts {LOOKAHEAD_SHAPE}) between small kernels, the "
                                             "side stream forked a layer (release, note, claim, copy) as in the decode "
                                             "graph, against the graph with the LRU step alone, CUDA events"),
        cache_layer_us=_measured_or_none(getattr(g, "cache_layer", None), f"kernels.lru lru_step and fill_slots "
                                         f"(top-k, experts {LOOKAHEAD_SHAPE[1:]}, {LOOKAHEAD_CACHE} slots, the ids "
                                         "repeated: hits) between small kernels in a CUDA graph, against the graph "
                                         "without them, CUDA events"),
        stage_layer_us=_measured_or_none(getattr(g, "stage_layer", None), f"kernels.stage_wait stage_wait and "
                                         f"stage_done (top-k, experts {LOOKAHEAD_SHAPE[1:]}, every expert staged "
                                         f"already: no wait, {STAGE_GUESSES} depths of guesses) between small kernels "
                                         "in a CUDA graph, against the graph without them, CUDA events"),
        driver=i.driver)


def _measured_or_none(st: Stats | None, method: str):
    """The Figure of a probe's repeats (`measured`, at their median), or None where the probe did not run."""
    return measured(st.median, method, st) if st is not None else None


def fused_moe_entries(m) -> dict:
    """The profile's fused_moe_decode / fused_moe_prefill from a profiler.moe.MoEResult (none: {})."""
    if m is None:
        return {}
    day = today()
    ver = f"strata-plan {__version__} profile"
    dec = ", ".join(f"{h}x{i} {m.decode_us[(h, i)]:.1f} us" for h, i, *_ in m.decode)
    pre = ", ".join(f"M={t} {m.prefill_ms[t]:.2f} ms" for t in sorted(m.prefill_ms))
    return {"fused_moe_decode": MoEDecodeRate(
                m.decode, "measured", f"{ver}: strata_plan.kernels.ops.fused_moe at batch 1, top-k experts in the tier "
                                      f"mix, both launches, CUDA graph over layers of distinct experts (> 4x L2), median "
                                      f"of repeats; a layer: {dec}", day),
            "fused_moe_prefill": MoEPrefillRate(
                m.prefill, "measured", f"{ver}: strata_plan.kernels.ops.fused_moe on a chunk through a whole layer in "
                                       f"the tier mix, top-k of random logits, CUDA events, median of repeats; {pre}",
                day)}


def _calibration(g, base: Calibration) -> Calibration:
    during, alone = g.curves["h2d_during_kernel"], g.curves["h2d_pinned"]
    size = min(during, key=lambda z: abs(z - HEADLINE_SIZE))
    ratio = min(1.0, during[size].median / alone[size].median)
    return replace(base, copy_overlap=measured(
        round(ratio, 3), f"pinned H2D at {size // MiB} MiB while a kernel runs / without one", during[size]))
