"""The tiered expert store on the CPU: tier 1 a CPU tensor, tier 2 ordinary memory (one buffer with the arena), tier 3
real files read with O_DIRECT where the filesystem allows it. Every tier returns the packed bytes, read in place or
through prefill's waves; tier splits never change an MoE output. (The device LRU against the planner's: test_kernels_lru
and test_engine_run.)"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from strata_plan.engine.store import ExpertStore, StoreOptions
from strata_plan.engine.transfer import FetchError
from strata_plan.errors import UserError
from strata_plan.kernels import ops
from strata_plan.engine.synthetic import pack_synthetic
from strata_plan.core.spec import load_spec
from strata_plan.core.plan import CachePlan, load_plan

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


def resident(store, j: int, ids: list[int]) -> torch.Tensor:
    """Layer j's offsets row with `ids` readable: the in-place table when none is on NVMe (static experts in the arena,
    RAM experts in place), else prefill's one wave of them (fetched into slots)."""
    if all(store.tier[j][e] != "nvme" for e in ids):
        return store.inplace_offsets[j]
    waves = list(store.waves(j, ids))
    assert len(waves) == 1 and sorted(waves[0].experts) == sorted(set(ids))
    return waves[0].offsets


@pytest.mark.parametrize("split", [(32, 0, 0), (0, 32, 0), (0, 0, 2), (3, 9, 4)])
def test_every_tier_returns_the_packed_bytes(packed, plan_path, split):
    plan = tiers(load_plan(plan_path), *split)
    ids = routes(12, len(plan.layers), plan.n_experts, plan.top_k)
    with open_store(packed, plan) as store:
        for t in range(len(ids)):
            for j in range(len(plan.layers)):
                offs = resident(store, j, ids[t, j].tolist())
                for e in ids[t, j].tolist():
                    o, want = int(offs[e]), packed[1][j][e]
                    assert np.array_equal(store.arena[o:o + want.size].numpy(), want), (t, j, e)


def test_tier_splits_never_change_the_moe_output(packed, plan_path):
    base = load_plan(plan_path)
    L, E, k = len(base.layers), base.n_experts, base.top_k
    ids = routes(6, L, E, k, seed=5)
    x = torch.randn(len(ids), H)
    w = torch.rand(len(ids), k)
    results = []
    for split in [(32, 0, 0), (3, 9, 4), (0, 32, 0), (0, 0, 0)]:
        with open_store(packed, tiers(base, *split, depth=2)) as store:
            outs = [ops.fused_moe(x[t:t + 1], torch.from_numpy(ids[t, j][None]).long(), w[t:t + 1], store.arena,
                                  resident(store, j, ids[t, j].tolist()), store.formats[j], H, I, backend="torch")
                    for t in range(len(ids)) for j in range(L)]
        results.append(torch.cat(outs))
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
        ref = ops.fused_moe(x, ids, w, store.arena, store.inplace_offsets[0], store.formats[0], H, I, backend="torch")
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
def test_on_the_gpu_prefills_bytes_arrive(packed, plan_path):
    """On a GPU: prefill's waves copy RAM experts (from the registered RAM tier) and NVMe experts (O_DIRECT reads into
    pinned bounce buffers) into their slots on the copy stream, the compute stream waiting on their events."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    plan = tiers(load_plan(plan_path), 3, 9, 4, depth=2)
    ids = routes(30, len(plan.layers), plan.n_experts, plan.top_k, seed=11)
    with ExpertStore.open(packed[0], plan, "cuda", StoreOptions(), plan_path="plan.yaml") as store:
        for t in range(30):
            for j in range(len(plan.layers)):
                for wave in store.waves(j, ids[t, j].tolist()):
                    torch.cuda.current_stream().synchronize()
                    for e in wave.experts:
                        o, want = int(wave.offsets[e]), packed[1][j][e]
                        assert np.array_equal(store.arena[o:o + want.size].cpu().numpy(), want), (t, j, e)


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
        list(store.waves(0, [last]))
    store.close()
    assert threading.active_count() == before


def test_a_plan_needing_more_ram_than_the_machine_has_is_refused_before_loading(packed, plan_path, monkeypatch):
    import psutil
    plan = tiers(load_plan(plan_path), 0, 32, 0)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": 1000})())
    with pytest.raises(UserError, match="memory.budgets.ram_bytes.*--ram-gb"):
        open_store(packed, plan)
