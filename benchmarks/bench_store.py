"""The expert store alone on a kimi-k3.1-pro-shaped packed model: does it move bytes as fast as the links?

    python3 benchmarks/bench_store.py --dir /root/strata-store --out-dir $OUT [--layers 5] [--tokens 40]

Builds (every run) a packed folder of `--layers` MoE layers x 384 experts in the seed's 1.92-bpw tier mix
(random blobs of the real formats' byte sizes, 18.5 MB mean; 7.1 GB a layer), written with large writes,
fsynced and dropped from the page cache. Routing is replayed from the skewed prior (`olmoe-like`, ids =
popularity ranks) and the store is driven as the decode loop drives it (ensure, release; no kernel), the
experts most used first in the plan's static VRAM set (8% of each layer's experts), side by side in one run:

- ram:  every other expert in pinned RAM. Store bytes/s (bytes fetched / wall time) against plain pinned
        copies of the same blob sequence into VRAM on one stream (the profiler's pinned H2D method).
- nvme: every other expert on NVMe (no cache, no prefetch). Store bytes/s against a plain O_DIRECT read
        of the same blobs in the same order with the same threads and split, without the copies;
        rounds interleaved (this virtual disk's figure spreads by up to 60%). Reader-pool and
        copy-stream busy times reported.
- cold: mincore() page-cache residency of the expert files before and after the nvme runs.
- ensure: host time of one `ensure` + `release` of 8 experts that are all resident (static).
- alloc: CUDA allocations made by 200 ensure/release calls with misses (must be 0).
Writes benchmarks/results/store-<time>.json (or --out-dir).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _result import write_result  # noqa: E402

from strata_plan.engine.directio import BlobFile, aligned_empty, aligned_view, page_cache_residency  # noqa: E402
from strata_plan.engine.store import ExpertStore, StoreOptions  # noqa: E402
from strata_plan.kernels.formats import expert_bytes, tier_mix  # noqa: E402
from strata_plan.kernels.pack import INDEX_FORMAT, INDEX_VERSION  # noqa: E402
from strata_plan.planner.plan import CachePlan, NvmeRead, load_plan  # noqa: E402
from strata_plan.planner.routing.priors import load_prior  # noqa: E402
from strata_plan.planner.routing.sample import sample_experts  # noqa: E402
from strata_plan.planner.spec import load_spec  # noqa: E402

BASE_PLAN = Path(__file__).resolve().parent / "data" / "plan-kimi-k3.1-pro-h200.yaml"


def build_packed(folder: Path, spec, n_layers: int) -> tuple[list[str], list[dict]]:
    """Random blobs of the tier mix's formats (most used ids first), one file a layer; returns (formats,
    index entries)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = tier_mix().names(spec.n_routed)
    sizes = [expert_bytes(f, spec.hidden, spec.moe_intermediate) for f in names]
    gen = torch.Generator(device="cuda" if torch.cuda.is_available() else "cpu").manual_seed(0)
    chunk = torch.empty(max(sizes) * 16, dtype=torch.uint8, device=gen.device)
    host = torch.empty_like(chunk, device="cpu", pin_memory=torch.cuda.is_available())
    entries = []
    for j, layer in enumerate(spec.moe_layers[:n_layers]):
        name = f"experts-layer{layer:03d}.bin"
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        off = 0
        for a in range(0, len(sizes), 16):
            n = sum(sizes[a:a + 16])
            chunk[:n].random_(0, 256, generator=gen)
            host[:n].copy_(chunk[:n])
            view = memoryview(host.numpy())[:n]
            while view:
                view = view[os.write(fd, view):]
            for e in range(a, min(a + 16, len(sizes))):
                entries.append({"layer": layer, "expert": e, "file": name, "offset": off, "nbytes": sizes[e],
                                "format": names[e]})
                off += sizes[e]
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    return names, entries


def write_index(folder: Path, spec, entries: list[dict], n_layers: int) -> None:
    """index.json for the first `n_layers` MoE layers of the packed files (the runs use 2 or all)."""
    keep = set(spec.moe_layers[:n_layers])
    index = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "model": spec.name, "hidden": spec.hidden,
             "moe_intermediate": spec.moe_intermediate, "n_experts": spec.n_routed, "source": "bench_store synthetic",
             "config_sha256": spec.config_sha256, "entries": [e for e in entries if e["layer"] in keep]}
    (folder / "index.json").write_text(json.dumps(index))


def plan_for(base, n_layers: int, names: list[str], vram: float, ram: float, cache: int = 0, depth: int = 0):
    """The base plan cut to `n_layers`, every layer with ids 0.. (most used) as the first `vram` share
    static, the next `ram` share in RAM, the rest on NVMe, in the packed formats."""
    E = base.n_experts
    s, m = round(vram * E), round(ram * E)
    fmts: dict[str, list[int]] = {}
    for e, f in enumerate(names):
        fmts.setdefault(f, []).append(e)
    layers = tuple(dataclasses.replace(l, vram=tuple(range(s)), ram=tuple(range(s, s + m)), nvme=tuple(range(s + m, E)),
                                       cache_slots=cache, formats={f: tuple(v) for f, v in fmts.items()})
                   for l in base.layers[:n_layers])
    return dataclasses.replace(base, layers=layers, prefetch_depth=depth,
                               cache=CachePlan("lru", base.cache.slot_bytes, cache * n_layers))


def replay(store, ids: np.ndarray) -> float:
    """Drive the store as the decode loop does (ensure, release; no kernel); wall seconds to the last copy."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for t in range(len(ids)):
        for j in range(ids.shape[1]):
            store.ensure(j, ids[t, j].tolist())
            store.release(j)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def misses(store, ids) -> list[tuple[int, int]]:
    """(layer, expert) of every use that is not static, in order (no cache: each is one fetch)."""
    return [(j, int(e)) for t in range(len(ids)) for j in range(ids.shape[1]) for e in ids[t, j]
            if int(e) not in store.residency.static[j]]


def plain_h2d(store, seq) -> float:
    """Plain pinned copies of the same blobs into one device buffer on one stream: bytes/s."""
    dev = torch.empty(store.slot_bytes * 4, dtype=torch.uint8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    total = 0
    start.record()
    for i, (j, e) in enumerate(seq):
        o, n = store.ram_offset[(j, e)], int(store.nbytes[j, e])
        k = (i % 4) * store.slot_bytes
        dev[k:k + n].copy_(store.ram[o:o + n], non_blocking=True)
        total += n
    end.record()
    end.synchronize()
    return total / (start.elapsed_time(end) / 1e3)


def plain_odirect(store, seq, threads: int, split: int) -> float:
    """The same blobs read with O_DIRECT, `threads` requests in flight, each blob in `split` requests."""
    bufs = [aligned_empty(store.slot_bytes, pin=False) for _ in range(threads)]
    views = [aligned_view(v) for _, v in bufs]
    files = {name: BlobFile.open(store.folder / name, warn=False) for name in store.files}
    total = sum(int(store.nbytes[j, e]) for j, e in seq)
    jobs = []
    for i, (j, e) in enumerate(seq):
        ent = store.entries[j][e]
        step = -(-ent.nbytes // split // 4096) * 4096
        jobs += [(files[ent.file], ent.offset + a, min(step, ent.nbytes - a), a) for a in range(0, ent.nbytes, step)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        def go(i):
            f, off, n, a = jobs[i]
            f.read_into(views[i % threads][a:], off, n)
        list(pool.map(go, range(len(jobs))))
    dt = time.perf_counter() - t0
    for f in files.values():
        f.close()
    return total / dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="folder for the packed model (removed at the end)")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=24, help="decode tokens replayed per nvme round")
    ap.add_argument("--ram-layers", type=int, default=2, help="layers in the pinned-RAM runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    spec = load_spec("kimi-k3.1-pro")
    base = load_plan(BASE_PLAN)
    folder = Path(a.dir)
    metrics, notes = {}, []
    try:
        t0 = time.perf_counter()
        names, entries = build_packed(folder, spec, a.layers)
        metrics["build_s"] = time.perf_counter() - t0
        metrics["packed_gb"] = sum(expert_bytes(f, spec.hidden, spec.moe_intermediate) for f in names) * a.layers / 1e9
        print(f"built {metrics['packed_gb']:.1f} GB in {metrics['build_s']:.0f} s", flush=True)
        prior = load_prior("olmoe-like")
        E, k = spec.n_routed, spec.top_k
        ids_all, _, _ = sample_experts(prior.zipf_s, prior.locality, a.layers, E, k, 400, seed=7, permute=False)
        dev = torch.device("cuda")
        files = [folder / f"experts-layer{l:03d}.bin" for l in spec.moe_layers[:a.layers]]
        metrics["page_cache_before"] = max(page_cache_residency(f) for f in files)

        # ---- pinned RAM -> VRAM -----------------------------------------------------------------------
        plan = plan_for(base, a.ram_layers, names, 0.08, 0.92)
        write_index(folder, spec, entries, a.ram_layers)
        with ExpertStore.open(folder, plan, dev, StoreOptions(prefetch=False), "bench") as store:
            metrics["ram_load_s"] = store.load_s
            ids = ids_all[:200, :a.ram_layers]
            seq = misses(store, ids)
            st, pl = [], []
            for r in range(a.rounds):
                before = sum(c.bytes_from["ram"] for c in store.counters.layers)
                dt = replay(store, ids)
                st.append((sum(c.bytes_from["ram"] for c in store.counters.layers) - before) / dt)
                pl.append(plain_h2d(store, seq))
            metrics["ram_store_gbps"] = statistics.median(st) / 1e9
            metrics["ram_plain_pinned_h2d_gbps"] = statistics.median(pl) / 1e9
            metrics["ram_ratio"] = metrics["ram_store_gbps"] / metrics["ram_plain_pinned_h2d_gbps"]
            metrics["mean_expert_mb"] = float(np.mean([store.nbytes[j, e] for j, e in seq])) / 1e6
            # host time of ensure when everything is resident (static ids 0..7)
            times = []
            for _ in range(2000):
                t1 = time.perf_counter()
                store.ensure(0, list(range(8)))
                store.release(0)
                times.append(time.perf_counter() - t1)
            metrics["ensure_resident_us"] = statistics.median(times[200:]) * 1e6
            torch.cuda.synchronize()
            n0 = torch.cuda.memory_stats()["allocation.all.allocated"]
            replay(store, ids[:25])
            metrics["cuda_allocations_per_200_calls"] = torch.cuda.memory_stats()["allocation.all.allocated"] - n0
        # ---- NVMe -> VRAM ---------------------------------------------------------------------------
        plan = plan_for(base, a.layers, names, 0.08, 0.0)
        write_index(folder, spec, entries, a.layers)
        rd = plan.staging.nvme_reads[names[0]]
        with ExpertStore.open(folder, plan, dev, StoreOptions(prefetch=False, allow_buffered=False), "bench") as store:
            threads = store.transfers._threads.__len__() - 1
            st, pl = [], []
            for r in range(a.rounds):
                ids = ids_all[r * a.tokens:(r + 1) * a.tokens]
                b0, rb0, cb0 = (sum(c.bytes_from["nvme"] for c in store.counters.layers), store.transfers.read_busy_s,
                                store.transfers.copy_busy_s())
                dt = replay(store, ids)
                st.append((sum(c.bytes_from["nvme"] for c in store.counters.layers) - b0) / dt)
                notes.append(f"nvme round {r}: {dt:.2f} s, reader busy {store.transfers.read_busy_s - rb0:.2f} "
                             f"thread-s, copy stream busy {store.transfers.copy_busy_s() - cb0:.3f} s")
                pl.append(plain_odirect(store, misses(store, ids), threads, rd.split))
            metrics["nvme_store_gbps"] = statistics.median(st) / 1e9
            metrics["nvme_plain_odirect_gbps"] = statistics.median(pl) / 1e9
            metrics["nvme_ratio"] = metrics["nvme_store_gbps"] / metrics["nvme_plain_odirect_gbps"]
            metrics["nvme_rounds_store_gbps"] = [x / 1e9 for x in st]
            metrics["nvme_rounds_plain_gbps"] = [x / 1e9 for x in pl]
            metrics["reader_threads"], metrics["split"] = threads, rd.split
            metrics["direct_io"] = all(f.direct for f in store.files.values())
        metrics["page_cache_after"] = max(page_cache_residency(f) for f in files)
    finally:
        if not a.keep:
            shutil.rmtree(folder, ignore_errors=True)
    path = write_result("store", metrics, notes="; ".join(notes), out_dir=a.out_dir)
    print(json.dumps(metrics, indent=1))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
