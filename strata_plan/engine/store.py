"""The tiered expert store (the Strata loader): every routed expert where the plan puts it, read by the kernels
where it lies, and counters that say how well that went.

    store = ExpertStore.open(packed_dir, plan, device, plan_path="plan.yaml")
    fused_moe(x, topk_ids, topk_w, store.arena, store.inplace_offsets[j], store.formats[j], H, I)   # one token
    for wave in store.waves(j, ids): ...   # prefill: a chunk's experts in waves through the free slots
    store.counter_data(); store.close()

Tiers (the plan's `layers[j].vram / ram / nvme`):
1. VRAM: one device arena `[static experts | dynamic slots | poison slot]`. Static experts are laid out
   back to back (4 KiB-aligned blobs) and loaded at start; the dynamic slots (the plan's cache slots plus
   its staging slots) receive fetched experts. `offsets[j]` (int64 [L, E] on the device, one row per MoE layer)
   is prefill's residency map: a resident expert's byte offset in the arena, else the poison slot (0xFF bytes:
   NaN scales, so a kernel that read a non-resident expert would produce NaN).
2. Pinned RAM: the plan's RAM experts in one page-locked region of their size (`pinned.HostRegion`, registered
   with the driver), filled at start. Decode's table `inplace_offsets[j]` points each RAM expert at its pinned
   address (offset = its device address - the arena's), so `fused_moe` reads it there over PCIe with no copy, and
   `count_uses` counts routed uses on the device (`fold_device_counts` turns them into the counters). With cache
   slots the plan's LRU is decided on the device too (`kernels.lru`, state in `lru`): the last `cache.total_slots`
   dynamic slots are its (each layer its own `cache_slots` of them), admitted experts are copied into them from
   pinned RAM before the MoE kernel and `inplace_offsets` follows; `residency.Residency` keeps the other slots for
   prefill's waves, so a prefill never touches the decode cache. On a CPU device (the tests' stand-in) arena and RAM
   tier are one buffer, so the reference kernel follows the same offsets.
3. NVMe: the packed files. Decode: staged into a pinned staging cache by the stager and read there in place
   (`engine.staging`). Prefill: read with O_DIRECT by the reader threads (`transfer.Transfers`) in the plan's
   `staging.nvme_reads_prefill` split into pinned bounce buffers, then copied into the wave's slots.
Integrity, always on: every static and RAM blob is checked against the sha256 of its parts in index.json at
start (on hashing threads, while the next blob is read), and every NVMe blob the first time it is read in
this store (prefill: its parts hashed as their reads land, before the copy; decode: by the stager before it
publishes the blob; `verified[j, e]` records it); a mismatch
is a one-line `UserError` naming the file, layer, expert and offset, and the bad bytes never reach the arena.
Everything is allocated at start; per token the store allocates no tensors (prefill's `offsets` rows go through a
ring of preallocated pinned rows). Correctness never depends on prefetch: a guess that did not land is read in place.
On a CPU device (CI) tier 1 is a CPU tensor, tier 2 ordinary memory (one buffer with the arena), tier 3 real files.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import psutil
import torch

from strata_plan.core.lookahead import staging_slots
from strata_plan.errors import UserError
from strata_plan.kernels import lru
from strata_plan.kernels.formats import EXPERT_ALIGN
from strata_plan.kernels.triton_common import INTERPRETER_OK
from strata_plan.pinned import HostRegion

from .packed import check_plan_matches, hash_threads, load_index, verify_part
from .counters import StoreCounters
from .directio import BlobFile, aligned_empty, aligned_view
from .residency import CACHED, IN_PLACE, STATIC, Residency
from .prefetch import DevicePrefetch
from .staging import Staging, staging_bytes
from .transfer import CHUNK_BYTES, CHUNKS_IN_FLIGHT, Fetch, Transfers

POISON_BYTE = 0xFF          # fp16 0xFFFF is NaN: every scale of a poisoned blob is NaN
TIER_CODES = {"vram": 0, "ram": 1, "nvme": 2}   # `tier_codes`, as the device loop's kernels read them
RING = 64                   # pinned offsets rows in flight


@cache
def default_stager_io() -> str:
    """How the NVMe stager reads unless told: "aio" (a layer's reads in one system call; engine/aio.py) where this
    kernel gives a native AIO context, else "threads" (a reader thread a read: the reference). On the H100 machine
    (2026-12-06, trained seed plan, 3 interleaved runs each) aio ran 1.26x the threads' median tok/s."""
    from .aio import available
    return "aio" if available() else "threads"


def plan_readers(plan) -> int:
    """NVMe reads the store keeps in flight (its reader threads): the plan's largest queue depth, at least 4."""
    return max([4] + [r.queue_depth for r in (plan.staging.nvme_reads or {}).values()])


@dataclass(frozen=True)
class StoreOptions:
    prefetch: bool = True          # the device lookahead's VRAM prefetch (off: the LRU-only and on-demand baselines)
    partial_landing: bool = True   # a lookahead guess still copying serves the cache's fill the part of it that landed,
    #                                the rest from RAM (kernels.prefetch; layers with a device LRU); False: whole only
    readers: int = 0               # reader threads; 0: the plan's largest queue depth (at least 4)
    chunk_bytes: int = CHUNK_BYTES             # copy chunk
    chunks_in_flight: int = CHUNKS_IN_FLIGHT   # the copy thread's chunks on the copy stream at once
    allow_buffered: bool = True    # a filesystem without O_DIRECT: warn and read buffered (benchmarks pass False)
    kernels: bool = False          # the device loop's Triton kernels on a CPU too (TRITON_INTERPRET=1): tests of their glue
    stage_depths: str = "all"      # NVMe lookahead: the stager reads the guesses of every depth 1..d ("all"), or of d
    #                                alone ("deepest", as the cost model counts them): an A/B
    stager_io: str = field(default_factory=default_stager_io)   # Linux native AIO, or reader threads
    lookahead_point: str = "output"   # the NVMe guesses taken when a layer ends ("output"), or at its router
    #                                   ("attention": sent with its request, a whole MoE layer sooner): an A/B


@dataclass(frozen=True)
class Wave:
    """One prefill wave of a layer: these experts are resident now (offsets), the MoE runs for them."""

    offsets: torch.Tensor          # int64 [E] on the device
    experts: tuple[int, ...]
    mask: torch.Tensor             # bool [E] on the device: expert in this wave


def _pread(fd: int, buf: memoryview, offset: int, nbytes: int) -> None:
    done = 0
    while done < nbytes:
        n = os.preadv(fd, [buf[done:nbytes]], offset + done)
        if n <= 0:
            raise OSError(f"short read at offset {offset + done}")
        done += n


class ExpertStore:
    def __init__(self, folder: Path, index, plan, device: torch.device, options: StoreOptions = StoreOptions(),
                 plan_path: str = "plan"):
        self.folder, self.index, self.plan, self.device, self.opt = Path(folder), index, plan, device, options
        # the device loop's kernels (LRU, lookahead, staging) run on a GPU; on a CPU their plain references, or with
        # `options.kernels` the kernels in Triton's interpreter
        self.kernels = device.type == "cuda" or options.kernels
        if self.kernels and device.type != "cuda" and not INTERPRETER_OK:
            raise ValueError("StoreOptions(kernels=True) on a CPU needs Triton's interpreter: set TRITON_INTERPRET=1 "
                             "before anything imports triton")
        check_plan_matches(index, plan, plan_path)
        self.n_layers, self.E = len(plan.layers), plan.n_experts
        self.top_k = plan.top_k
        ent = {(e.layer, e.expert): e for e in index.entries}
        self.entries = [[ent[(l.layer, x)] for x in range(self.E)] for l in plan.layers]   # [j][e]
        self.nbytes = np.array([[e.nbytes for e in row] for row in self.entries], dtype=np.int64)
        self.tier = [dict([(e, "vram") for e in l.vram] + [(e, "ram") for e in l.ram] + [(e, "nvme") for e in l.nvme])
                     for l in plan.layers]
        # ---- sizes ---------------------------------------------------------------------------------
        static_bytes = int(sum(self.nbytes[j, e] for j, l in enumerate(plan.layers) for e in l.vram))
        dyn = [self.nbytes[j, e] for j, l in enumerate(plan.layers) for e in l.ram + l.nvme]
        self.slot_bytes = int(max(dyn, default=EXPERT_ALIGN))
        self.n_slots = plan.cache.total_slots + max(plan.staging.vram_slots, staging_slots(self.top_k, plan.prefetch_depth))
        self.dyn_base = static_bytes
        self.poison_offset = self.dyn_base + self.n_slots * self.slot_bytes
        arena_bytes = self.poison_offset + self.slot_bytes
        ram_bytes = int(sum(self.nbytes[j, e] for j, l in enumerate(plan.layers) for e in l.ram))
        has_nvme = any(l.nvme for l in plan.layers)
        in_flight = max(getattr(plan.staging, "nvme_in_flight_prefill", 0) or 0, 2 * self.top_k)
        stage = staging_bytes(plan, self.slot_bytes, self.n_layers) if has_nvme else 0
        bounce = in_flight if has_nvme else 0      # prefill's NVMe reads (decode's go to the staging cache)
        self._check_capacity(arena_bytes, ram_bytes + bounce * self.slot_bytes + stage, plan_path)
        # ---- files ---------------------------------------------------------------------------------
        self.files: dict[str, BlobFile] = {}
        try:
            for row in self.entries:
                for e in row:
                    self._file(e)
        except BaseException:
            self._close_files()
            raise
        # ---- allocate once ---------------------------------------------------------------------------
        ram_size = max(ram_bytes, EXPERT_ALIGN)
        if device.type == "cuda":
            self.arena = torch.empty(arena_bytes, dtype=torch.uint8, device=device)
            self._ram_region = HostRegion(ram_size, device)
            self.ram = self._ram_region.tensor
            self.ram_base = self._ram_region.device_ptr - self.arena.data_ptr()    # RAM byte 0 seen from the arena
            self._stage_region = HostRegion(stage, device) if stage else None
            stage_mem = self._stage_region.tensor if stage else None
            stage_base = self._stage_region.device_ptr - self.arena.data_ptr() if stage else 0
        else:       # the CPU stand-in: one buffer, so arena[offset:] reaches the RAM tier (kernels/reference.py)
            self._ram_region = self._stage_region = None
            self.ram_base = -(-arena_bytes // EXPERT_ALIGN) * EXPERT_ALIGN
            stage_base = self.ram_base + -(-ram_size // EXPERT_ALIGN) * EXPERT_ALIGN
            self._arena_backing, self.arena = aligned_empty(stage_base + stage, pin=False)   # 4 KiB-aligned: O_DIRECT
            self.ram = self.arena[self.ram_base:self.ram_base + ram_size]
            stage_mem = self.arena[stage_base:] if stage else None
        self.arena[self.poison_offset:self.poison_offset + self.slot_bytes].fill_(POISON_BYTE)
        self.ram_offset: dict[tuple[int, int], int] = {}
        self.offsets_host = np.full((self.n_layers, self.E), self.poison_offset, dtype=np.int64)
        self.verified = np.zeros((self.n_layers, self.E), dtype=np.bool_)   # NVMe blobs checked by a read so far
        self.offsets = torch.full((self.n_layers, self.E), self.poison_offset, dtype=torch.int64, device=device)
        self.inplace_offsets = None         # [L, E] on the device: set by `_load`
        self.use_counts = torch.zeros((self.n_layers, self.E), dtype=torch.int64, device=device)
        self._ones = torch.ones(8 * self.top_k, dtype=torch.int64, device=device)
        self._ring = torch.empty((RING, self.E), dtype=torch.int64, pin_memory=device.type == "cuda")
        self._ring_events: list = [None] * RING
        self._ring_i = 0
        self.formats = [torch.tensor([self._fmt_code(e.format) for e in row], dtype=torch.int32, device=device)
                        for row in self.entries]
        readers = options.readers or plan_readers(plan)
        # per (layer, expert), on the device, for the device loop's kernels (LRU, lookahead, staging): tier, bytes
        self.tier_codes = torch.tensor([[TIER_CODES[self.tier[j][e]] for e in range(self.E)]
                                        for j in range(self.n_layers)], dtype=torch.int8, device=device)
        self.nbytes_dev = torch.from_numpy(self.nbytes.copy()).to(device)
        self.transfers = Transfers(self.arena, bounce, self.slot_bytes, readers=readers,
                                   chunk_bytes=options.chunk_bytes, chunks_in_flight=options.chunks_in_flight)
        # PLANNER.md "What the engine must do": every prefill read split nvme_reads_prefill[f].split ways
        self.split_prefill = {f: r.split for f, r in (plan.staging.nvme_reads_prefill or {}).items()}
        self.compute_stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self.lru = None                 # kernels.lru.LruState: the device loop's cache (set by `_load`)
        self.staging = None             # engine.staging.Staging: the device loop's NVMe tier (set below)
        self.prefetch = None            # engine.prefetch.DevicePrefetch: the device loop's lookahead (set below)
        # prefill's slots: all but the last cache.total_slots (the device LRU's)
        self.residency = Residency([l.vram for l in plan.layers], self.n_slots - plan.cache.total_slots)
        self.counters = StoreCounters(self.n_layers)
        self._old_switch = sys.getswitchinterval()
        sys.setswitchinterval(2e-4)     # wake the copy and reader threads promptly (restored on close)
        try:
            self.load_s = self._load()
            if stage:
                self.staging = Staging(self, stage_mem, stage_base, plan.prefetch_depth if options.prefetch else 0,
                                       self.lru.ram_offset if self.lru is not None else None, options.stage_depths,
                                       options.stager_io, early=options.lookahead_point == "attention")
            if options.prefetch and plan.prefetch_depth:
                self.prefetch = DevicePrefetch(self, plan.prefetch_depth,
                                               self._enable_partial_landing() if options.partial_landing else None)
        except BaseException:           # Ctrl-C or a bad blob during start-up: no thread or file left behind
            self.close()
            raise

    # ---- start-up ---------------------------------------------------------------------------------------
    @classmethod
    def open(cls, folder, plan, device, options: StoreOptions = StoreOptions(), plan_path: str = "plan"):
        return cls(Path(folder), load_index(folder), plan, torch.device(device), options, plan_path)

    @staticmethod
    def _fmt_code(name: str) -> int:
        from strata_plan.kernels.formats import FORMAT_CODES
        return FORMAT_CODES.index(name)

    def _check_capacity(self, vram: int, ram: int, plan_path: str) -> None:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            if vram > free:
                raise UserError(plan_path, "memory.budgets.vram_bytes", f"needs {vram / 1e9:.2f} GB of VRAM for experts "
                                f"and slots, {free / 1e9:.2f} GB is free on {torch.cuda.get_device_name(self.device)}",
                                "plan again with a smaller --vram-gb")
        avail = psutil.virtual_memory().available
        if ram > avail:
            raise UserError(plan_path, "memory.budgets.ram_bytes", f"needs {ram / 1e9:.2f} GB of pinned RAM, "
                            f"{avail / 1e9:.2f} GB is available", "plan again with a smaller --ram-gb")

    def _file(self, e) -> BlobFile:
        """The open blob file of an entry (load_index checked that it exists and is long enough)."""
        f = self.files.get(e.file)
        if f is None:
            path = self.folder / e.file
            f = BlobFile.open(path, warn=True)
            if not f.direct and not self.opt.allow_buffered:
                f.close()
                raise UserError(str(path), "", "is on a filesystem without O_DIRECT: the NVMe tier would be served "
                                "by the page cache", "put the packed model on a local disk (ext4, xfs)")
            self.files[e.file] = f
        return f

    def _load(self) -> float:
        """Read the static experts into the arena and the RAM experts into pinned RAM; each part of every blob is
        checked against its sha256 in the index on the hashing threads (one task a part, so the parts of a large
        blob hash at once) while the next blob is read. Start-up reads go through
        the page cache (a second start of the same model is faster); when the plan has an NVMe tier the
        files' cached pages are dropped afterwards, so that tier is read cold."""
        t0 = time.perf_counter()
        pin = self.device.type == "cuda"
        fds = {name: os.open(self.folder / name, os.O_RDONLY) for name in self.files}   # buffered: start-up only
        backings = [aligned_empty(int(self.nbytes.max()), pin=pin) for _ in range(4)]   # alive until the end
        bounces = [view for _, view in backings]
        checks = []
        off, ram_off, i = 0, 0, 0
        with ThreadPoolExecutor(hash_threads()) as pool:
            for j, l in enumerate(self.plan.layers):
                for e in l.vram:
                    ent = self.entries[j][e]
                    bounce = bounces[i % len(bounces)]
                    if i >= len(bounces):
                        for c in checks[i - len(bounces)]:      # its bounce buffer is free again
                            c.result()
                    i += 1
                    if pin:
                        torch.cuda.current_stream(self.device).synchronize()
                    _pread(fds[ent.file], aligned_view(bounce), ent.offset, ent.nbytes)
                    checks.append(self._check_parts(pool, ent, bounce[:ent.nbytes]))
                    self.arena[off:off + ent.nbytes].copy_(bounce[:ent.nbytes], non_blocking=pin)
                    self.offsets_host[j, e] = off
                    off += ent.nbytes
            for j, l in enumerate(self.plan.layers):
                for e in l.ram:
                    ent = self.entries[j][e]
                    dst = self.ram[ram_off:ram_off + ent.nbytes]
                    _pread(fds[ent.file], aligned_view(dst), ent.offset, ent.nbytes)
                    checks.append(self._check_parts(pool, ent, dst))
                    self.ram_offset[(j, e)] = ram_off
                    ram_off += ent.nbytes
            for group in checks:
                for c in group:
                    c.result()
        for fd in fds.values():
            if any(l.nvme for l in self.plan.layers):      # the cold tier stays cold: drop what start-up cached
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        if pin:
            torch.cuda.synchronize(self.device)
        self._static_rows = self.offsets_host.copy()     # static offsets, poison elsewhere: each row's base
        self.offsets.copy_(torch.from_numpy(self.offsets_host))
        rows = self._static_rows.copy()
        for (j, e), o in self.ram_offset.items():
            rows[j, e] = self.ram_base + o
        self.inplace_offsets = torch.from_numpy(rows.copy()).to(self.device)
        if self.plan.cache.total_slots:
            self.lru = self._device_lru(rows)
        return time.perf_counter() - t0

    def _device_lru(self, rows: np.ndarray):
        """The device LRU's state (`kernels.lru.LruState`) over the last `cache.total_slots` dynamic slots, its
        table the in-place rows (`inplace_offsets`, which it rewrites as experts come and go)."""
        slots = [l.cache_slots for l in self.plan.layers]
        C = max(slots)
        first = self.n_slots - sum(slots)
        offs = np.zeros((self.n_layers, C), dtype=np.int64)
        for j, c in enumerate(slots):
            base = first + sum(slots[:j])
            offs[j, :c] = [self.dyn_base + (base + i) * self.slot_bytes for i in range(c)]
        static = np.zeros((self.n_layers, self.E), dtype=np.int8)
        for j, l in enumerate(self.plan.layers):
            static[j, list(l.vram)] = 1
        dev = lambda a: torch.from_numpy(np.array(a)).to(self.device)    # noqa: E731  (a copy: on a CPU no alias)
        L, k = self.n_layers, self.top_k
        return lru.LruState(slot_expert=dev(np.full((L, C), -1, np.int64)), slot_stamp=dev(np.full((L, C), -1, np.int64)),
                        slot_offset=dev(offs), n_slots=dev(np.array(slots, np.int64)), static=dev(static),
                        ram_offset=dev(rows), nbytes=self.nbytes_dev, table=self.inplace_offsets,
                        admit=dev(np.full((L, k), -1, np.int64)), tick=dev(np.zeros(L, np.int64)),
                        counts=dev(np.zeros((L, 4), np.int64)))

    def _enable_partial_landing(self) -> torch.Tensor | None:
        """Give the device LRU its tail and split (`LruState`: where its fill takes a partly landed guess from) and
        return int8 [L]: 1 where a layer has cache slots, so a lookahead guess still copying serves the LRU's fill the
        part of it that landed (kernels.prefetch, partial landing). None: no device LRU."""
        if self.lru is None:
            return None
        L, E = self.n_layers, self.E
        self.lru = dataclasses.replace(self.lru, tail=torch.full((L, E), -1, dtype=torch.int64, device=self.device),
                                       split=torch.zeros((L, E), dtype=torch.int64, device=self.device))
        return torch.tensor([int(l.cache_slots > 0) for l in self.plan.layers], dtype=torch.int8, device=self.device)

    def cache_decide(self, j: int, ids: torch.Tensor) -> None:
        """The device loop with a cache, MoE layer j, one token: the LRU step (hits, admissions, evictions, counts;
        graph-safe on a GPU: one launch; the plain reference on a CPU)."""
        (lru.lru_step if self.kernels else lru.reference_step)(ids, j, self.lru)

    def cache_fill(self, j: int, ids: torch.Tensor) -> None:
        """After `cache_decide` (and the NVMe staging's wait, which the admissions need): the admitted experts copied
        into their slots (one launch on a GPU)."""
        if self.kernels:
            lru.fill_slots(self.arena, ids, j, self.lru, self.slot_bytes)
        else:
            lru.reference_fill(self.arena, ids, j, self.lru)

    def _check_parts(self, pool, ent, data: torch.Tensor) -> list:
        """Futures checking each part of one blob as read (a CPU uint8 tensor) on the hashing threads."""
        view = data.numpy()
        return [pool.submit(verify_part, self.index, ent, view, k) for k in range(len(ent.parts))]

    # ---- decode (one token) --------------------------------------------------------------------
    def count_uses(self, j: int, ids: torch.Tensor) -> None:
        """Count MoE layer j's routed ids [M, k] on the device (graph-safe: no sync, no allocation)."""
        flat = ids.reshape(-1)
        self.use_counts[j].index_add_(0, flat, self._ones[:flat.numel()])

    def fold_device_counts(self) -> None:
        """Add the device's use counts to the counters (static: in the VRAM set; in_place: read from pinned RAM,
        its bytes counted as crossing PCIe; NVMe experts read from the staging cache: `engine.staging`) and zero
        them. Waits for the device."""
        staged = self.staging.fold(self.counters) if self.staging is not None else None
        if self.prefetch is not None:          # (additive) served uses, counted in place below, move to prefetched
            self.prefetch.fold(self.counters)
        if self.lru is not None:               # the device LRU counted: static, hits, misses, miss bytes
            got = self.lru.counts.cpu().numpy().copy()
            self.lru.counts.zero_()
            for j, row in enumerate(got):
                c = self.counters.layers[j]
                su, sb = (int(staged["uses"][j]), int(staged["bytes"][j])) if staged else (0, 0)
                c.uses[STATIC] += int(row[lru.STATIC])
                c.uses[CACHED] += int(row[lru.HIT])
                c.uses[IN_PLACE] += int(row[lru.MISS]) - su          # the misses not from staging: pinned RAM
                c.bytes_from["ram"] += int(row[lru.MISS_BYTES]) - sb
            return
        counts = self.use_counts.cpu().numpy().copy()     # on a CPU device .cpu() is the tensor itself
        self.use_counts.zero_()
        for j, row in enumerate(counts):
            c = self.counters.layers[j]
            for e in np.flatnonzero(row):
                n = int(row[e])
                if self.tier[j][e] == "vram":
                    c.uses[STATIC] += n
                elif self.tier[j][e] == "ram":
                    c.uses[IN_PLACE] += n
                    c.bytes_from["ram"] += n * int(self.nbytes[j, e])      # (NVMe: counted by the staging)

    def pinned_info(self) -> dict:
        """The RAM tier's bytes against the page-locked bytes it holds (a `HostRegion`: its size, rounded up to
        2 MiB), the seconds registering it took and the share of it on huge pages; None figures on a CPU device
        (nothing pinned), and the NUMA node its pages were asked of (None: one node, or the machine's default); the
        NVMe tier's staging cache's share on huge pages too (None: no such region)."""
        tier = int(sum(self.nbytes[j, e] for (j, e) in self.ram_offset))
        r, st = self._ram_region, self._stage_region
        return {"tier_bytes": tier, "pinned_bytes": r.mapped if r is not None else None,
                "register_s": r.register_s if r is not None else None,
                "huge_page_share": r.huge_share() if r is not None else None,
                "numa_node": r.node if r is not None else None,
                "staging_huge_page_share": st.huge_share() if st is not None else None}

    def reset_counters(self) -> None:
        """Start counting afresh (the host's counters and the device's)."""
        if self.use_counts is not None:
            self.use_counts.zero_()
        if self.lru is not None:
            self.lru.counts.zero_()
        if self.staging is not None:
            self.staging.reset()
        if self.prefetch is not None:
            self.prefetch.reset()
        self.counters = StoreCounters(self.n_layers)

    def counter_data(self) -> dict:
        """The counters as JSON-able data (`StoreCounters.to_data`), the device's counts folded in first."""
        self.fold_device_counts()
        return self.counters.to_data()

    # ---- prefill ----------------------------------------------------------------------------------------
    def _publish(self, j: int) -> torch.Tensor:
        """Write layer j's residency into its offsets row on the device (stream-ordered, no allocation)."""
        row = self.offsets_host[j]
        row[:] = self._static_rows[j]
        for e, i in self.residency.where[j].items():
            row[e] = self.dyn_base + i * self.slot_bytes
        if self.device.type != "cuda":
            self.offsets[j].copy_(torch.from_numpy(row))
            return self.offsets[j]
        k = self._ring_i
        self._ring_i = (k + 1) % RING
        if self._ring_events[k] is not None:
            self._ring_events[k].synchronize()
        self._ring[k].numpy()[:] = row
        self.offsets[j].copy_(self._ring[k], non_blocking=True)
        ev = self._ring_events[k] or torch.cuda.Event()
        ev.record(self.compute_stream)
        self._ring_events[k] = ev
        return self.offsets[j]

    def waves(self, j: int, ids: Sequence[int]) -> Iterator[Wave]:
        """A chunk's experts of layer j (unique ids) in waves: first the static ones plus as many fetched as half
        the free slots hold, then the next half-slot batches, each fetched while the previous wave computes. The
        caller runs the MoE for each wave's experts (ids outside the wave skipped) before asking for the next
        wave; the slots a wave read are reused only after it ran. The device LRU's slots are not touched, and
        prefill uses are not counted as decode uses."""
        res = self.residency
        ids = [int(e) for e in dict.fromkeys(int(e) for e in ids)]
        static = [e for e in ids if res.is_resident(j, e)]
        missing = [e for e in ids if not res.is_resident(j, e)]
        width = max(1, res.n_free() // 2)
        batches = [missing[a:a + width] for a in range(0, len(missing), width)]
        pending = self._fetch_batch(j, batches[0]) if batches else []
        for b in range(max(1, len(batches))):
            current = pending
            pending = self._fetch_batch(j, batches[b + 1]) if b + 1 < len(batches) else []
            for slot in current:
                slot.fetch.wait_enqueued()
                if slot.fetch.event is not None:
                    self.compute_stream.wait_event(slot.fetch.event)
            members = (static if b == 0 else []) + [s.expert for s in current]
            yield Wave(self._publish(j), tuple(members), self._mask(j, members))
            ev = None
            if self.device.type == "cuda":
                ev = torch.cuda.Event()
                ev.record(self.compute_stream)
            for slot in current:
                res.give_back(slot, ev)

    def _fetch_batch(self, j: int, experts: list[int]) -> list:
        """A slot for each of (layer j, experts) and its fetch issued: from pinned RAM a copy enqueued from this
        thread, from NVMe reads on the reader threads (the blob checked against its sha256 on its first read)."""
        out = []
        for e in experts:
            slot = self.residency.take(j, e)
            if slot is None:
                raise RuntimeError(f"no free slot for layer {j} expert {e}: {self.n_slots} slots")
            ent = self.entries[j][e]
            f = Fetch(ent.layer, e, self.dyn_base + slot.index * self.slot_bytes, ent.nbytes, True, after=slot.release)
            if self.tier[j][e] == "ram":
                o = self.ram_offset[(j, e)]
                f.ram = self.ram[o:o + ent.nbytes]
                slot.fetch = self.transfers.copy_now(f)
            else:
                f.file, f.file_offset = self.files[ent.file], ent.offset
                f.split = self.split_prefill.get(ent.format, 1)
                if not self.verified[j, e]:       # the first read of this blob: its parts are checked before the copy
                    f.parts, f.part_bytes = ent.parts, self.index.part_bytes
                    f.on_verified = lambda j=j, e=e: self.verified.__setitem__((j, e), True)
                slot.fetch = self.transfers.submit(f)
            out.append(slot)
        return out

    def _mask(self, j: int, members: list[int]) -> torch.Tensor:
        m = np.zeros(self.E, dtype=np.bool_)
        m[members] = True
        return torch.from_numpy(m).to(self.device, non_blocking=False)

    # ---- end ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the reader and copy threads, wait for queued copies, close the files. Idempotent."""
        if getattr(self, "staging", None) is not None:
            self.staging.close()
            self.staging = None
        self.prefetch = None                # (it refers back to the store: no cycle keeps the pinned tier alive)
        if getattr(self, "_stage_region", None) is not None:
            self._stage_region.close()
            self._stage_region = None
        if getattr(self, "transfers", None) is not None:
            self.transfers.close()
            self.transfers = None
        self._close_files()
        if getattr(self, "_ram_region", None) is not None:
            self.ram = None
            self._ram_region.close()
            self._ram_region = None
        sys.setswitchinterval(self._old_switch)

    def _close_files(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()

    def __enter__(self) -> "ExpertStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
