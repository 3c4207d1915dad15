"""The tiered expert store on the CPU: tier 1 a CPU tensor, tier 2 ordinary memory, tier 3 real files read
with O_DIRECT where the filesystem allows it. Every tier returns the packed bytes; the cache policy is the
routing package's brute-force LRU; prefetch and tier splits never change an MoE output."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from strata_plan.engine.residency import CACHED, DEMAND, STATIC
from strata_plan.engine.store import ExpertStore, StoreOptions
from strata_plan.engine.transfer import FetchError
from strata_plan.errors import UserError
from strata_plan.kernels import ops
from strata_plan.engine.synthetic import pack_synthetic
from strata_plan.core.spec import load_spec
from strata_plan.core.plan import CachePlan, load_plan
from strata_plan.core.routing.reference import simulate_cache

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"
TRACE = ROOT / "tests" / "data" / "fixture-moe.trace.npz"
H, I = 256, 32          # the fixture's hidden and moe_intermediate sizes


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="module")
def plan_path():
    """The fixture's committed plan (`strata-plan plan --profile rtx-4090 --model tests/data/fixture-moe --stats
    tests/data/fixture-moe.trace.npz --trials 3`): the tests re-tier it, so its budgets do not matter."""
    return FIXTURE / "plan-rtx-4090.yaml"


@pytest.fixture(scope="module")
def packed(tmp_path_factory, plan_path):
    return write_packed(load_plan(plan_path), tmp_path_factory.mktemp("packed"))


def write_packed(plan, d: Path):
    """A synthetic packed fixture in the plan's formats (random, sane blobs), hashed in 4 KiB parts (several a
    blob, each checked by the store); returns (folder, blobs[j][e])."""
    spec = load_spec(str(FIXTURE))
    index = pack_synthetic(spec, d, [{e: l.format_of(e) for e in range(plan.n_experts)} for l in plan.layers],
                           part_bytes=4096)
    blobs = [[np.fromfile(d / index.entry(l.layer, e).file, dtype=np.uint8, count=index.entry(l.layer, e).nbytes,
                          offset=index.entry(l.layer, e).offset) for e in range(plan.n_experts)] for l in plan.layers]
    return d, blobs


def tiers(plan, vram: int, ram: int, cache: int, depth: int | None = None):
    """The plan with, per layer, `vram` static experts, `ram` in RAM, the rest on NVMe, `cache` LRU slots."""
    layers = []
    for l in plan.layers:
        order = l.vram + l.ram + l.nvme
        layers.append(dataclasses.replace(l, vram=order[:vram], ram=order[vram:vram + ram], nvme=order[vram + ram:],
                                          cache_slots=min(cache, plan.n_experts - vram)))
    total = sum(l.cache_slots for l in layers)
    out = dataclasses.replace(plan, layers=tuple(layers), cache=CachePlan("lru", plan.cache.slot_bytes, total))
    return out if depth is None else dataclasses.replace(out, prefetch_depth=depth)


def routes(n_tokens: int, n_layers: int, E: int, k: int, seed: int = 1) -> np.ndarray:
    """Skewed routing [T, L, k]: distinct ids per token and layer, most used first."""
    rng = np.random.default_rng(seed)
    p = np.arange(1, E + 1, dtype=float) ** -1.1
    p /= p.sum()
    return np.stack([[rng.choice(E, k, replace=False, p=p) for _ in range(n_layers)] for _ in range(n_tokens)])


def open_store(packed, plan, **kw):
    return ExpertStore.open(packed[0], plan, "cpu", StoreOptions(**kw), plan_path="plan.yaml")


@pytest.mark.parametrize("split", [(32, 0, 0), (0, 32, 0), (0, 0, 2), (3, 9, 4)])
def test_every_tier_returns_the_packed_bytes(packed, plan_path, split):
    plan = tiers(load_plan(plan_path), *split)
    ids = routes(12, len(plan.layers), plan.n_experts, plan.top_k)
    with open_store(packed, plan) as store:
        for t in range(len(ids)):
            for j in range(len(plan.layers)):
                offs = store.ensure(j, ids[t, j].tolist())
                for e in ids[t, j].tolist():
                    o, want = int(offs[e]), packed[1][j][e]
                    assert np.array_equal(store.arena[o:o + want.size].numpy(), want), (t, j, e)
                store.release(j)


@pytest.mark.parametrize("static,cache", [(0, 0), (4, 3), (8, 1), (2, 12)])
def test_cache_policy_is_the_planners_lru(packed, plan_path, static, cache):
    plan = tiers(load_plan(plan_path), static, 6, cache)
    ids = routes(60, len(plan.layers), plan.n_experts, plan.top_k, seed=3)
    with open_store(packed, plan, prefetch=False) as store:
        for t in range(len(ids)):
            for j in range(len(plan.layers)):
                store.ensure(j, ids[t, j].tolist())
                store.release(j)
        for j, l in enumerate(plan.layers):
            c = store.counters.layers[j]
            hits = (c.uses[STATIC] + c.uses[CACHED]) / c.n_uses
            assert hits == pytest.approx(simulate_cache(ids[:, j], set(l.vram), l.cache_slots), abs=1e-12)
            assert c.uses[DEMAND] == c.fetches_from["ram"] + c.fetches_from["nvme"]


def moe_run(store, plan, x, ids, weights, hints: bool):
    """Decode through the store with the torch reference MoE; hints = next layers' true ids (depth 1, 2)."""
    outs = []
    L = len(plan.layers)
    for t in range(len(ids)):
        for j in range(L):
            if hints:
                for d in (1, 2):
                    if j + d < L:
                        store.hint(j + d, ids[t, j + d].tolist(), None, depth=d)
            offs = store.ensure(j, ids[t, j].tolist())
            store.check_routed(j, torch.from_numpy(ids[t, j]))
            outs.append(ops.fused_moe(x[t:t + 1], torch.from_numpy(ids[t, j][None]).long(), weights[t:t + 1],
                                      store.arena, offs, store.formats[j], H, I, backend="torch"))
            store.release(j)
    return torch.cat(outs)


def test_prefetch_and_tier_splits_never_change_the_moe_output(packed, plan_path):
    base = load_plan(plan_path)
    L, E, k = len(base.layers), base.n_experts, base.top_k
    ids = routes(6, L, E, k, seed=5)
    x = torch.randn(len(ids), H)
    w = torch.rand(len(ids), k)
    results = []
    for split, hints in [((32, 0, 0), False), ((3, 9, 4), False), ((3, 9, 4), True), ((0, 0, 0), True)]:
        plan = tiers(base, *split, depth=2)
        with open_store(packed, plan, poison=True) as store:
            results.append(moe_run(store, plan, x, ids, w, hints))
            data = store.counters.to_data()
            assert data["uses"] == len(ids) * L * k
            assert sum(data["by_kind"].values()) == data["uses"]
            if hints and split[0] == 0:
                assert data["by_kind"]["prefetched"] > 0 and data["lookahead"]["1"]["precision"] == 1.0
    assert all(torch.isfinite(r).all() for r in results)
    for r in results[1:]:
        assert torch.equal(r, results[0])


def test_prefill_waves_cover_each_expert_once_and_match(packed, plan_path):
    plan = tiers(load_plan(plan_path), 4, 10, 2)
    E, k = plan.n_experts, plan.top_k
    ids = torch.from_numpy(routes(40, 1, E, k, seed=9)[:, 0]).long()       # 40 tokens of layer 0
    x = torch.randn(40, H)
    w = torch.rand(40, k)
    with open_store(packed, plan) as store:
        seen, out = [], torch.zeros(40, H)
        for wave in store.waves(0, ids.flatten().tolist()):
            seen += wave.experts
            masked = torch.where(wave.mask[ids], ids, torch.full_like(ids, -1))
            keep = masked >= 0
            out += ops.fused_moe(x, masked.clamp(min=0), w * keep, store.arena, wave.offsets, store.formats[0], H, I,
                                 backend="torch")
        assert sorted(seen) == sorted(set(ids.flatten().tolist()))
    full = tiers(load_plan(plan_path), 32, 0, 0)
    with open_store(packed, full) as store:
        ref = ops.fused_moe(x, ids, w, store.arena, store.ensure(0, range(E)), store.formats[0], H, I, backend="torch")
    # the waves add the same float32 terms in another order: rounding only, relative to the output's scale
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def test_bad_packed_folders_and_plans_are_one_line(packed, plan_path, tmp_path):
    plan = load_plan(plan_path)
    src = plan.sources
    other = dataclasses.replace(plan, sources=dataclasses.replace(src, model=dataclasses.replace(src.model, sha256="0" * 64)))
    with pytest.raises(UserError, match="sources.model"):
        open_store(packed, other)
    l0 = plan.layers[0]
    (a, ids_a), (b, ids_b) = list(l0.formats.items())[:2]
    swapped = {a: ids_b, b: ids_a, **{f: v for f, v in l0.formats.items() if f not in (a, b)}}
    wrong = dataclasses.replace(plan, layers=(dataclasses.replace(l0, formats=swapped),) + plan.layers[1:])
    with pytest.raises(UserError, match="formats"):
        open_store(packed, wrong)
    folder = tmp_path / "p"
    folder.mkdir()
    for f in packed[0].iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    victim = sorted(folder.glob("experts-*.bin"))[-1]
    data = bytearray(victim.read_bytes())
    data[-5000] ^= 0xFF                          # a damaged blob: refused at start-up, naming it
    victim.write_bytes(bytes(data))
    with pytest.raises(UserError, match=f"{victim.name}.*layer {plan.layers[-1].layer} expert .*checksum"):
        open_store((folder, None), tiers(plan, 32, 0, 0))
    victim.write_bytes(bytes(data[:-4096]))
    with pytest.raises(UserError, match="truncated"):
        open_store((folder, None), plan)
    victim.unlink()
    with pytest.raises(UserError, match="missing"):
        open_store((folder, None), plan)


@pytest.mark.gpu
def test_on_the_gpu_bytes_arrive_and_nothing_is_allocated_per_token(packed, plan_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    plan = tiers(load_plan(plan_path), 3, 9, 4, depth=2)
    ids = routes(30, len(plan.layers), plan.n_experts, plan.top_k, seed=11)
    with ExpertStore.open(packed[0], plan, "cuda", StoreOptions(), plan_path="plan.yaml") as store:
        def run(tokens):
            for t in tokens:
                for j in range(len(plan.layers)):
                    if j + 2 < len(plan.layers):
                        store.hint(j + 2, ids[t, j + 2].tolist(), None, depth=2)
                    offs = store.ensure(j, ids[t, j].tolist())
                    got = [store.arena[o:o + packed[1][j][e].size] for e in ids[t, j].tolist()
                           for o in [int(offs[e])]]
                    for e, g in zip(ids[t, j].tolist(), got):
                        assert np.array_equal(g.cpu().numpy(), packed[1][j][e])
                    store.release(j)
        run(range(5))
        torch.cuda.synchronize()
        n0 = torch.cuda.memory_stats()["allocation.all.allocated"]
        for t in range(5, 30):
            for j in range(len(plan.layers)):
                store.ensure(j, ids[t, j].tolist())
                store.release(j)
        torch.cuda.synchronize()
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == n0
        run(range(5, 10))


def test_a_read_error_during_a_run_is_raised_naming_the_expert(packed, plan_path, tmp_path):
    import threading
    folder = tmp_path / "p"
    folder.mkdir()
    for f in packed[0].iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    plan = tiers(load_plan(plan_path), 0, 0, 0)
    before = threading.active_count()
    store = open_store((folder, None), plan)
    last = plan.n_experts - 1
    victim = folder / store.entries[0][last].file
    store.files[victim.name].fd, old = os.open(os.devnull, os.O_RDONLY), store.files[victim.name].fd   # reads hit EOF
    os.close(old)
    with pytest.raises(FetchError, match=f"layer {plan.layers[0].layer}, expert {last} .*{victim.name}"):
        store.ensure(0, [last])
    store.close()
    assert threading.active_count() == before


def test_a_plan_needing_more_ram_than_the_machine_has_is_refused_before_loading(packed, plan_path, monkeypatch):
    import psutil
    plan = tiers(load_plan(plan_path), 0, 32, 0)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": 1000})())
    with pytest.raises(UserError, match="memory.budgets.ram_bytes.*--ram-gb"):
        open_store(packed, plan)


def test_a_prefetch_its_layer_needs_is_copied_before_other_prefetches():
    """`Transfers.promote`: a fetch of the copy thread's queue that `ensure` finds still in flight (LATE) is
    ordered as a demand: ahead of every prefetch queued before it, for its reads and for its copy (checked in
    the queues, with the copy and reader threads held off by the transfers' lock). The copy thread's queue
    holds NVMe fetches once read and streamed dense weights (`Fetch.dst`); these are the latter."""
    from strata_plan.engine.directio import aligned_empty
    from strata_plan.engine.transfer import Fetch, Transfers
    arena = torch.zeros(1 << 16, dtype=torch.uint8)
    t = Transfers(arena, bounce_slots=0, slot_bytes=4096, readers=0)
    try:
        _, ram = aligned_empty(4 * 4096, pin=False)
        fs = [Fetch(0, e, 0, 4096, demand=False, ram=ram[e * 4096:(e + 1) * 4096],
                    dst=arena[e * 4096:(e + 1) * 4096]) for e in range(4)]
        with t._lock:                       # the copy thread waits for the lock: nothing is copied yet
            for f in fs:
                t.submit(f)
            t.promote(fs[2])
            order = [heapq_item[2] for heapq_item in sorted(t._copies)]
        assert order[0] is fs[2] and fs[2].demand and not fs[0].demand
        for f in fs:
            f.wait_enqueued()
        t.promote(fs[1])                    # already copied: nothing to re-order
        assert not fs[1].demand
    finally:
        t.close()


def test_a_late_ram_prefetch_is_taken_back_and_copied_by_the_caller():
    """RAM prefetches wait in the pump's queue until the main thread pumps them (`Transfers.pump`);
    `Transfers.take_back` withdraws one not started (marked cancelled and done, never copied), so `ensure`
    copies it itself at once; one already copied is not taken back; one started (some chunks on the copy
    stream) is not taken back but finished whole by `promote`."""
    from strata_plan.engine.directio import aligned_empty
    from strata_plan.engine.transfer import Fetch, Transfers
    arena = torch.zeros(1 << 16, dtype=torch.uint8)
    t = Transfers(arena, bounce_slots=0, slot_bytes=4096, readers=0, chunk_bytes=1024)
    try:
        _, ram = aligned_empty(5 * 4096, pin=False)
        ram[:] = 7
        fs = [Fetch(0, e, e * 4096, 4096, demand=False, ram=ram[e * 4096:(e + 1) * 4096]) for e in range(5)]
        for f in fs[:4]:
            t.submit(f)
        assert t.pumping() and not t._copies and int(arena.sum()) == 0    # queued for the pump, not copied
        assert t.take_back(fs[2])
        assert fs[2].cancelled and fs[2].done()
        t.pump()
        assert not t.pumping() and all(f.done() for f in fs[:4])
        assert int(arena[2 * 4096:3 * 4096].sum()) == 0          # never copied
        assert all(int(arena[e * 4096:(e + 1) * 4096].min()) == 7 for e in (0, 1, 3))
        assert not t.take_back(fs[1])                             # already copied
        t.submit(fs[4])
        t._pump_chunk()                                           # its first 1024-byte chunk only
        assert not fs[4].done() and int(arena[4 * 4096:].sum()) == 7 * 1024
        assert not t.take_back(fs[4])
        t.promote(fs[4])
        assert fs[4].done() and int(arena[4 * 4096:5 * 4096].min()) == 7 and not t.pumping()
    finally:
        t.close()


def test_ensure_copies_a_late_ram_prefetch_itself(packed, plan_path):
    """A hinted RAM expert still in the pump's queue when `ensure` needs it (the pump held off) is served
    right: counted LATE, taken back, copied by the caller; its bytes arrive."""
    plan = tiers(load_plan(plan_path), 0, 32, 4, depth=1)
    with open_store(packed, plan) as store:
        store.transfers.pump = lambda: None          # the main thread never got to pump it
        store.hint(1, [5], depth=1)
        f = store.residency.slot_of(1, 5).fetch
        offs = store.ensure(1, [5, 6])
        assert f.cancelled and store.residency.slot_of(1, 5).fetch is not f
        store.release(1)
        o, want = int(offs[5]), packed[1][1][5]
        assert np.array_equal(store.arena[o:o + want.size].numpy(), want)
        c = store.counters.to_data()
        assert c["by_kind"]["late"] == 1 and c["uses"] == 2 and c["layers"][1]["fetches_from"]["ram"] == 2


def test_prefetch_chunks_share_one_window(monkeypatch):
    """The CUDA path of `Transfers.pump` with stand-in events on the CPU: at most `chunks_in_flight` chunks
    unfinished on the copy stream, the pump's and the copy thread's counted together (`_window`): the pump
    puts one chunk out and nothing more until it finishes, and a copy-thread chunk in the window holds it
    back too; every byte lands, in chunks of `chunk_bytes`."""
    import contextlib

    from strata_plan.engine.directio import aligned_empty
    from strata_plan.engine.transfer import Fetch, Transfers

    class Event:                              # a CUDA event that finishes when the test says so
        def __init__(self, enable_timing=False):
            self.finished = False

        def record(self, stream=None):
            pass

        def query(self):
            return self.finished

        def synchronize(self):
            self.finished = True

    class Stream:
        def wait_event(self, ev):
            pass

        def synchronize(self):
            pass

    monkeypatch.setattr(torch.cuda, "Event", Event)
    arena = torch.zeros(1 << 14, dtype=torch.uint8)
    t = Transfers(arena, bounce_slots=0, slot_bytes=4096, readers=0, chunk_bytes=1024, chunks_in_flight=1)
    t.cuda, t.copy_stream, t.stream = True, Stream(), contextlib.nullcontext
    try:
        _, ram = aligned_empty(2 * 4096, pin=False)
        ram[:] = 5
        fs = [Fetch(0, e, e * 4096, 4096, demand=False, ram=ram[e * 4096:(e + 1) * 4096]) for e in range(2)]
        for f in fs:
            t.submit(f)
        landed = lambda: int(arena.sum()) // 5          # noqa: E731
        t.pump()
        assert len(t._window) == 1 and landed() == 1024
        t.pump()
        assert len(t._window) == 1 and landed() == 1024  # the window is full until that chunk finishes
        t._window[0][0].finished = True
        t.pump()
        assert landed() == 2048
        t._window[0][0].finished = True
        copy_thread_chunk = Event()
        t._window.append((copy_thread_chunk, None))
        t.pump()
        assert landed() == 2048                         # held back by the copy thread's chunk
        copy_thread_chunk.finished = True
        while t.pumping():
            for ev, _ in t._window:
                ev.finished = True
            t.pump()
        assert landed() == 8192 and not fs[1].done()    # its last chunk is still on the copy stream
        t._window[-1][0].finished = True
        assert all(f.done() and len(f.spans) == 4 for f in fs)
        dense = Fetch(0, -1, 0, 4096, demand=False, ram=ram[:4096], dst=arena[8192:12288])   # the copy thread's
        t.submit(dense)
        dense.wait_enqueued()
        assert len(dense.spans) == 4 and int(arena[8192:12288].min()) == 5 and len(t._window) <= 1
    finally:
        t.close()
