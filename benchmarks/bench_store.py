"""The expert store alone on a kimi-k3.1-pro-shaped packed model: does it move bytes as fast as the links?

    python3 benchmarks/bench_store.py --dir /root/strata-store --out-dir $OUT [--layers 5] [--tokens 40]

Builds (every run) a packed folder of `--layers` MoE layers x 384 experts in the seed's 1.92-bpw tier mix
(random blobs of the real formats' byte sizes, 18.5 MB mean; 7.1 GB a layer), written with large writes,
fsynced and dropped from the page cache. Routing is replayed from the skewed prior (`olmoe-like`, ids =
popularity ranks) and the store is driven as the decode loop drives it (ensure, release; no kernel), the
experts most used first in the plan's static VRAM set (8% of each layer's experts), side by side in one run
(the plan: `tests/data/plan-kimi-k3.1-pro-{N}moe-h200.yaml`, re-tiered):

- ram:  every other expert in pinned RAM. Store bytes/s (bytes fetched / wall time) against plain pinned
        copies of the same blob sequence into VRAM on one stream (the profiler's pinned H2D method).
- nvme: every other expert on NVMe (no cache, no prefetch). Store bytes/s against a plain O_DIRECT read
        of the same blobs in the same order with the same threads and split, without the copies;
        rounds interleaved (this virtual disk's figure spreads by up to 60%). Reader-pool and
        copy-stream busy times reported.
- cold: mincore() page-cache residency of the expert files before and after the nvme runs.
- ensure: host time of one `ensure` + `release` of 8 experts that are all resident (static).
- alloc: CUDA allocations made by 25 ensure/release calls with misses (must be 0).
Writes benchmarks/results/store-<time>.json (or --out-dir).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from _result import write_result  # noqa: E402

from strata_plan.engine.directio import BlobFile, aligned_empty, aligned_view, page_cache_residency  # noqa: E402
from strata_plan.engine.store import ExpertStore, StoreOptions  # noqa: E402
from strata_plan.engine.synthetic import pack_synthetic  # noqa: E402
from strata_plan.kernels.formats import tier_mix  # noqa: E402
from strata_plan.core.plan import CachePlan, load_plan  # noqa: E402
from strata_plan.core.routing.priors import load_prior  # noqa: E402
from strata_plan.core.routing.sample import sample_experts  # noqa: E402
from strata_plan.core.spec import load_spec  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"     # the plan the tests read too
# `strata-plan plan --model kimi-k3.1-pro --moe-layers N --profile h200 --prior olmoe-like --trials 10`: the
# runs re-tier them; they give the truncated spec's sources, staging and NVMe read shape.
BASE_PLAN = DATA / "plan-kimi-k3.1-pro-{n}moe-h200.yaml"


def build_packed(folder: Path, spec, plan) -> float:
    """The synthetic packed model of `spec` in `plan`'s formats (strata_plan/engine/synthetic.py), built on the GPU,
    dropped from the page cache; returns seconds."""
    t0 = time.perf_counter()
    pack_synthetic(spec, folder, [{e: l.format_of(e) for e in range(plan.n_experts)} for l in plan.layers],
                   device="cuda" if torch.cuda.is_available() else "cpu")
    for f in folder.glob("experts-*.bin"):
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    return time.perf_counter() - t0


def plan_for(base, vram: float, ram: float, cache: int = 0, depth: int = 0):
    """The base plan with, every layer, ids 0.. (most used: the replay numbers ids by popularity rank) the
    first `vram` share static, the next `ram` share in RAM, the rest on NVMe; formats by rank as the tier
    mix assigns them."""
    E = base.n_experts
    s, m = round(vram * E), round(ram * E)
    fmts: dict[str, list[int]] = {}
    for e, f in enumerate(tier_mix().names(E)):
        fmts.setdefault(f, []).append(e)
    layers = tuple(dataclasses.replace(l, vram=tuple(range(s)), ram=tuple(range(s, s + m)), nvme=tuple(range(s + m, E)),
                                       cache_slots=cache, formats={f: tuple(v) for f, v in fmts.items()})
                   for l in base.layers)
    return dataclasses.replace(base, layers=layers, prefetch_depth=depth,
                               cache=CachePlan("lru", base.cache.slot_bytes, cache * len(layers)))


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
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    base = load_plan(str(BASE_PLAN).format(n=a.layers))
    spec = load_spec(f"kimi-k3.1-pro@{a.layers}moe")
    folder = Path(a.dir)
    metrics, notes = {}, []
    try:
        metrics["build_s"] = build_packed(folder, spec, plan_for(base, 1.0, 0.0))
        metrics["packed_gb"] = sum(f.stat().st_size for f in folder.glob("experts-*.bin")) / 1e9
        print(f"built {metrics['packed_gb']:.1f} GB in {metrics['build_s']:.0f} s", flush=True)
        prior = load_prior("olmoe-like")
        E, k = spec.n_routed, spec.top_k
        ids_all, _, _ = sample_experts(prior.zipf_s, prior.locality, a.layers, E, k, 400, seed=7, permute=False)
        dev = torch.device("cuda")
        files = [folder / f"experts-layer{l:03d}.bin" for l in spec.moe_layers[:a.layers]]
        metrics["page_cache_before"] = max(page_cache_residency(f) for f in files)

        # ---- pinned RAM -> VRAM -----------------------------------------------------------------------
        plan = plan_for(base, 0.08, 0.92)
        with ExpertStore.open(folder, plan, dev, StoreOptions(prefetch=False), "bench") as store:
            metrics["ram_load_s"] = store.load_s
            ids = ids_all[:100]
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
            replay(store, ids[:5])
            metrics["cuda_allocations_per_25_ensure"] = torch.cuda.memory_stats()["allocation.all.allocated"] - n0
        # ---- NVMe -> VRAM ---------------------------------------------------------------------------
        plan = plan_for(base, 0.08, 0.0)
        rd = next(iter(plan.staging.nvme_reads.values()))
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
