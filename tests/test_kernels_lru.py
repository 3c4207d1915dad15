"""`kernels.lru`: the planner's LRU decided on the device. The plain reference matches the routing package's
brute-force simulation hit for hit, the Triton kernel (interpreted on CPU) matches the reference state for state,
and the fill copies exactly the admitted experts into their slots."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from strata_plan.core.routing.reference import simulate_cache
from strata_plan.core.routing.sample import sample_experts
from strata_plan.kernels.lru import (HIT, MISS, MISS_BYTES, STATIC, LruState, fill_slots, lru_step, reference_fill,
                                     reference_step)

SLOT = 4096
DEV = "cuda" if torch.cuda.is_available() else "cpu"     # the kernels: compiled on a GPU, interpreted on a CPU


def make_state(L: int, E: int, k: int, slots: list[int], static: list[set[int]], device="cpu") -> LruState:
    """Arena: [slots of every layer | every expert's RAM copy], each expert `SLOT` bytes at most."""
    C = max(max(slots), 1)
    base = [sum(slots[:j]) for j in range(L)]
    slot_offset = torch.tensor([[(base[j] + s) * SLOT for s in range(C)] for j in range(L)], dtype=torch.int64)
    ram0 = sum(slots) * SLOT
    ram_offset = torch.tensor([[ram0 + (j * E + e) * SLOT for e in range(E)] for j in range(L)], dtype=torch.int64)
    st = torch.zeros(L, E, dtype=torch.int8)
    for j, s in enumerate(static):
        st[j, list(s)] = 1
    g = torch.Generator().manual_seed(0)
    nbytes = (torch.randint(1, SLOT // 512 + 1, (L, E), generator=g) * 512).to(torch.int64)   # 512 .. 4096
    t = dict(slot_expert=torch.full((L, C), -1), slot_stamp=torch.full((L, C), -1), slot_offset=slot_offset,
             n_slots=torch.tensor(slots), static=st, ram_offset=ram_offset, nbytes=nbytes,
             table=ram_offset.clone(), admit=torch.full((L, k), -1), tick=torch.zeros(L, dtype=torch.int64),
             counts=torch.zeros(L, 4, dtype=torch.int64))
    return LruState(**{n: v.to(device=device, dtype=torch.int8 if n == "static" else torch.int64) for n, v in t.items()})


def routing(L: int, E: int, k: int, T: int, seed: int) -> np.ndarray:
    experts, _, _ = sample_experts(1.1, 0.4, L, E, k, T, seed=seed, permute=False)
    return experts                                  # [T, L, k]


@pytest.mark.parametrize("slots", [[0, 3], [5, 12], [1, 40]])
def test_the_reference_is_the_planners_lru_hit_for_hit(slots):
    L, E, k, T = 2, 48, 6, 300
    ex = routing(L, E, k, T, seed=len(slots) + sum(slots))
    static = [set(range(4)), set()]
    st = make_state(L, E, k, slots, static)
    for t in range(T):
        for j in range(L):
            reference_step(torch.from_numpy(ex[t, j].astype(np.int64)), j, st)
    for j in range(L):
        want = simulate_cache(ex[:, j], static[j], slots[j])
        c = st.counts[j]
        assert (c[STATIC] + c[HIT]) / (T * k) == pytest.approx(want, abs=0)
        assert c[STATIC] + c[HIT] + c[MISS] == T * k
        # the table points every cached expert at its slot and every other non-static one at its RAM copy
        cached = {int(e): s for s, e in enumerate(st.slot_expert[j, :slots[j]].tolist()) if e >= 0}
        for e in range(E):
            want_off = st.slot_offset[j, cached[e]] if e in cached else st.ram_offset[j, e]
            assert int(st.table[j, e]) == int(want_off)


def test_more_misses_than_slots_keeps_the_latest_and_fills_only_what_stays():
    st = make_state(1, 16, 4, [2], [set()])
    reference_step(torch.tensor([1, 2, 3, 4]), 0, st)
    assert sorted(st.slot_expert[0].tolist()) == [3, 4]            # the two touched last stay
    assert st.admit[0].tolist()[:2] == [-1, -1] and min(st.admit[0].tolist()[2:]) >= 0
    assert int(st.table[0, 1]) == int(st.ram_offset[0, 1])          # admitted then evicted: read in place
    reference_step(torch.tensor([3, 5, 1, 6]), 0, st)               # 3 hits; 5, 1, 6 miss into two slots
    assert sorted(st.slot_expert[0].tolist()) == [1, 6] and int(st.table[0, 3]) == int(st.ram_offset[0, 3])
    assert st.counts[0].tolist()[:3] == [0, 1, 7]


@pytest.mark.parametrize("slots", [[0, 2, 7], [3, 1, 16]])
def test_the_kernel_is_the_reference_state_for_state(slots):
    L, E, k, T = 3, 40, 5, 60
    ex = routing(L, E, k, T, seed=7)
    static = [set(range(3)), {5, 9}, set()]
    a, b = make_state(L, E, k, slots, static), make_state(L, E, k, slots, static, device=DEV)
    for t in range(T):
        for j in range(L):
            ids = torch.from_numpy(ex[t, j].astype(np.int64))
            reference_step(ids, j, a)
            lru_step(ids.reshape(1, -1).to(DEV), j, b)
            for name in ("slot_expert", "slot_stamp", "table", "admit", "tick", "counts"):
                assert torch.equal(getattr(a, name), getattr(b, name).cpu()), (t, j, name)


def test_fill_copies_the_admitted_experts_into_their_slots():
    L, E, k = 1, 12, 4
    st = make_state(L, E, k, [3], [{0}])
    arena_size = int(st.ram_offset.max()) + SLOT
    g = torch.Generator().manual_seed(1)
    arena = torch.randint(0, 256, (arena_size,), dtype=torch.uint8, generator=g)
    ref = arena.clone()
    dev, arena_dev = make_state(L, E, k, [3], [{0}], device=DEV), arena.to(DEV)
    for ids in ([0, 4, 7, 2], [7, 9, 0, 11]):
        t = torch.tensor(ids)
        reference_step(t, 0, st)
        reference_fill(ref, t, 0, st)
        lru_step(t.to(DEV), 0, dev)                     # the kernels on the kernels' device, the reference on the CPU
        fill_slots(arena_dev, t.to(DEV), 0, dev, SLOT)
        reference_fill(arena, t, 0, st)
        assert torch.equal(arena_dev.cpu(), ref) and torch.equal(dev.admit.cpu(), st.admit)
        for i, e in enumerate(ids):
            dst = int(st.admit[0, i])
            if dst >= 0:
                n = int(st.nbytes[0, e])
                src = int(st.ram_offset[0, e])
                assert torch.equal(arena[dst:dst + n], arena[src:src + n])
    assert st.counts[0, MISS_BYTES] == sum(int(st.nbytes[0, e]) for e in (4, 7, 2, 9, 11))


def _partly_landed(st: LruState, e: int, slot_at: int) -> LruState:
    """Expert e of layer 0 as the lookahead's `resolve` leaves one whose first half landed in a staging slot at
    `slot_at`: the fill's source there (split bytes of it), the rest at its RAM copy (tail)."""
    tail = torch.full_like(st.ram_offset, -1)
    tail[0, e] = st.ram_offset[0, e]
    split = torch.zeros_like(st.nbytes)
    split[0, e] = st.nbytes[0, e] // 2 // 256 * 256
    st.ram_offset[0, e] = slot_at
    return dataclasses.replace(st, tail=tail, split=split)


@pytest.mark.parametrize("ids", [[0, 4, 7, 2], [1, 4, 7, 9]])
def test_a_partly_landed_expert_fills_from_its_slot_and_ram(ids):
    """The fill takes the landed part from the staging slot and the rest from RAM (the slot past it holds junk), kernel
    and reference alike; with more misses than slots the expert is admitted then evicted within the token and read in
    place from RAM (its table entry, which the lookahead leaves there), never from the slot that holds only a part."""
    L, E, k, e = 1, 12, 4, 4
    slots = [3] if 0 in ids else [1]
    states = []
    for device in ("cpu", DEV):
        st = make_state(L, E, k, slots, [{0}], device=device)
        ram_end = int(st.ram_offset.max()) + SLOT
        arena = torch.randint(0, 256, (ram_end + SLOT,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
        n, ram = int(st.nbytes[0, e]), int(st.ram_offset[0, e])
        st = _partly_landed(st, e, ram_end)
        h = int(st.split[0, e])
        arena[ram_end:ram_end + h] = arena[ram:ram + h]          # the landed part; junk after it
        states.append((st, arena.to(device), n, ram, h))
    (a, ra, n, ram, h), (b, rb, *_) = states
    t = torch.tensor(ids)
    reference_step(t, 0, a)
    reference_fill(ra, t, 0, a)
    lru_step(t.to(DEV), 0, b)
    fill_slots(rb, t.to(DEV), 0, b, SLOT)
    assert torch.equal(ra, rb.cpu()) and torch.equal(a.table, b.table.cpu())
    dst = int(a.admit[0, ids.index(e)])
    if slots[0] >= 3:                                           # admitted: its slot holds the whole RAM blob
        assert dst >= 0 and int(a.table[0, e]) == dst and torch.equal(ra[dst:dst + n], ra[ram:ram + n])
    else:                                                       # admitted, then evicted by a later miss
        assert dst < 0 and int(a.table[0, e]) == ram
    assert not torch.equal(ra[a.ram_offset[0, e]:a.ram_offset[0, e] + n], ra[ram:ram + n])   # the slot: a part only


def test_the_profilers_cache_probe_fills_its_slots_from_its_ram_rows_then_hits():
    """What `profiler.gpu.cache_layer_us` runs: `probe_cache` over a `probe_state` whose RAM rows start past the LRU's
    slots, an arena just holding both; the first token admits every id and copies its row into its slot (nothing
    outside the arena: a GPU would fault), the next one hits every id and copies nothing."""
    from strata_plan.kernels import prefetch as pk
    from strata_plan.profiler.gpu import LOOKAHEAD_CACHE, LOOKAHEAD_SHAPE
    S, K, E = LOOKAHEAD_SHAPE
    C, L = LOOKAHEAD_CACHE, 4
    base = L * C * 4096
    _, cache = pk.probe_cache(pk.probe_state(S, L, E, K, DEV, ram_base=base), C)
    arena = torch.zeros(base + L * E * 4096, dtype=torch.uint8, device=DEV)
    arena[base:] = torch.randint(1, 256, (L * E * 4096,), dtype=torch.uint8, device=DEV)
    ram = arena[base:].clone()
    ids = torch.arange(K, dtype=torch.int64, device=DEV)
    for token in range(2):
        for j in range(L):
            lru_step(ids, j, cache)
            fill_slots(arena, ids, j, cache, 4096)
        if token == 0:
            assert cache.counts[:, MISS].tolist() == [K] * L and cache.counts[:, HIT].sum() == 0
            slots = arena[:base].clone()
    assert cache.counts[:, HIT].tolist() == [K] * L and cache.counts[:, MISS].tolist() == [K] * L
    assert torch.equal(arena[:base], slots) and torch.equal(arena[base:], ram)
    for j in range(L):
        for s in range(C):
            e = int(cache.slot_expert[j, s])
            got = arena[int(cache.slot_offset[j, s]):int(cache.slot_offset[j, s]) + 4096]
            assert torch.equal(got, ram[(j * E + e) * 4096:(j * E + e + 1) * 4096])


@pytest.mark.gpu
def test_the_kernels_on_a_gpu_are_the_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    L, E, k, T = 3, 64, 8, 80
    ex = routing(L, E, k, T, seed=3)
    static = [set(range(5)), set(), {1}]
    a, b = make_state(L, E, k, [4, 9, 0], static), make_state(L, E, k, [4, 9, 0], static, device="cuda")
    arena_size = int(a.ram_offset.max()) + SLOT
    ra = torch.randint(0, 256, (arena_size,), dtype=torch.uint8)
    rb = ra.cuda()
    for t in range(T):
        for j in range(L):
            ids = torch.from_numpy(ex[t, j].astype(np.int64))
            reference_step(ids, j, a)
            reference_fill(ra, ids, j, a)
            lru_step(ids.cuda(), j, b)
            fill_slots(rb, ids.cuda(), j, b, SLOT)
    for name in ("slot_expert", "slot_stamp", "table", "admit", "tick", "counts"):
        assert torch.equal(getattr(a, name), getattr(b, name).cpu()), name
    assert torch.equal(ra, rb.cpu())
