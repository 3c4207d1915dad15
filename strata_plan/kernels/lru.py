"""The LRU cache of one MoE layer decided on the device (batch 1), and the copy that fills admitted slots.

    lru_step(ids, j, state)          # one launch after layer j's router: hits, admissions, evictions, counters
    fill_slots(arena, ids, j, state) # one launch: each admitted expert copied from pinned RAM into its slot

The policy is the planner's (`core/routing/lru.py`): a token's k routed experts are looked up against the cache as
it stood after the previous token, then touched in slot order (highest gate weight first), so after the token the
layer's c slots hold the c most recently touched non-static experts. Stamps order the touches: token t's i-th
expert is touched at t * k + i. Pass 1 gives every hit its new stamp; pass 2 inserts the misses in slot order,
each into the slot of the smallest stamp (an empty slot first, the lowest index among equals) unless every slot
holds a later touch (a hit further down the token), which leaves the top c stamps. An admitted expert gets its slot's offset in the residency table and in `admit[j, i]` (so
`fill_slots` copies it before the MoE kernel reads it: its bytes cross PCIe once); an evicted one gets its pinned
RAM offset back. A miss admitted and evicted within one token, and a hit evicted by a later miss of the same
token, are read in place (their table entries point at RAM when the MoE kernel runs).

State (int64 tensors on one device; `LruState`): slot_expert [L, C] (-1 empty), slot_stamp [L, C] (-1 empty),
slot_offset [L, C] (arena offset of each slot), n_slots [L] (c_j <= C), static [L, E] (int8, 1 = static),
ram_offset [L, E] (the in-place offset of each non-static expert), nbytes [L, E], table [L, E] (the offsets
fused_moe reads), admit [L, k] (-1 or the slot offset to fill for routed position i), tick [L] (tokens decided),
counts [L, 4] (static uses, cache hits, misses, miss bytes). `reference_step` / `reference_fill` are the same in
plain Python on the tensors: the CPU path and what the kernels are tested against.

Partial landing (`tail`, `split`: written by the lookahead's `resolve`, `kernels.prefetch`): an expert whose blob's
first split[j, e] bytes landed in a staging slot has ram_offset (the fill's source) pointing there and tail[j, e] at
its pinned RAM copy; the fill takes the rest of the blob from tail (-1: the whole blob at ram_offset). Such an expert
was not cached before the token, and the lookahead leaves its table entry at RAM: admitted and evicted within the
token, it is read in place from RAM.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .triton_common import tl, triton

STATIC, HIT, MISS, MISS_BYTES = range(4)
FILL_CHUNK = 64 << 10        # bytes one program of fill_slots copies (a multiple of 8 KiB)
FILL_BLOCK = tl.constexpr(1024)  # int64 words a program moves per step of its loop (8 KiB: no register spills)
BIG = tl.constexpr(1 << 62)    # the stamp of a slot a layer does not have: never a victim


@dataclass(frozen=True)
class LruState:
    slot_expert: torch.Tensor
    slot_stamp: torch.Tensor
    slot_offset: torch.Tensor
    n_slots: torch.Tensor
    static: torch.Tensor
    ram_offset: torch.Tensor
    nbytes: torch.Tensor
    table: torch.Tensor
    admit: torch.Tensor
    tick: torch.Tensor
    counts: torch.Tensor
    tail: torch.Tensor | None = None     # int64 [L, E] where the bytes past split come from (-1: ram_offset); None: none
    split: torch.Tensor | None = None    # int64 [L, E] bytes of the expert at ram_offset where tail >= 0 (with tail)


@triton.jit
def lru_step_kernel(ids_p, j, E, C, static_p, slot_expert_p, slot_stamp_p, slot_offset_p, n_slots_p, ram_offset_p,
                    nbytes_p, table_p, admit_p, tick_p, counts_p, K: tl.constexpr, KB: tl.constexpr,
                    CB: tl.constexpr):
    lru_step_body(ids_p, j, E, C, static_p, slot_expert_p, slot_stamp_p, slot_offset_p, n_slots_p, ram_offset_p,
                  nbytes_p, table_p, admit_p, tick_p, counts_p, K, KB, CB)


@triton.jit
def lru_step_body(ids_p, j, E, C, static_p, slot_expert_p, slot_stamp_p, slot_offset_p, n_slots_p, ram_offset_p,
                  nbytes_p, table_p, admit_p, tick_p, counts_p, K: tl.constexpr, KB: tl.constexpr, CB: tl.constexpr):
    # ids_p: int64 [K] layer j's routed experts, slot order; one program; CB >= C, KB >= K (powers of two). Its own
    # launch (`lru_step_kernel`), or after the lookahead's resolve in one (`kernels.prefetch.resolve_step_kernel`)
    s = tl.arange(0, CB)                                               # [CB] slots
    kk = tl.arange(0, KB)                                              # [KB] routed positions
    c = tl.load(n_slots_p + j)
    valid = s < c
    old = tl.load(slot_expert_p + j * C + s, mask=valid, other=-1)    # [CB] the cache after the previous token
    stamp = tl.load(slot_stamp_p + j * C + s, mask=valid, other=-1)
    stamp = tl.where(valid, stamp, BIG)
    tick = tl.load(tick_p + j)
    n_static = tick * 0
    n_hit = tick * 0
    for i in tl.static_range(K):                                       # pass 1: hits take their new stamps
        e = tl.load(ids_p + i)
        st = tl.load(static_p + j * E + e) != 0
        m = (old == e) & valid & (st == 0)
        stamp = tl.where(m, tick * K + i, stamp)
        n_static += st.to(tl.int64)
        n_hit += (tl.sum(m.to(tl.int32), 0) > 0).to(tl.int64)
    exp = old
    pos = tl.full([CB], -1, tl.int64)                                  # routed position that filled a slot now
    admit = tl.full([KB], -1, tl.int64)
    n_miss = tick * 0
    miss_bytes = tick * 0
    for i in tl.static_range(K):                                       # pass 2: misses in slot order
        e = tl.load(ids_p + i)
        st = tl.load(static_p + j * E + e) != 0
        hit = tl.sum(((old == e) & valid).to(tl.int32), 0) > 0
        miss = (st == 0) & (hit == 0)
        take = miss & (c > 0) & (tick * K + i > tl.min(stamp, 0))     # else every slot holds a later touch
        victim = tl.argmin(stamp, 0)
        vm = (s == victim) & take
        v_pos = tl.sum(tl.where(vm, pos, 0), 0)
        admit = tl.where((kk == v_pos) & (tl.sum(vm.to(tl.int32), 0) > 0) & (v_pos >= 0), -1, admit)
        v_off = tl.load(slot_offset_p + j * C + victim)
        admit = tl.where((kk == i) & take, v_off, admit)
        exp = tl.where(vm, e, exp)
        stamp = tl.where(vm, tick * K + i, stamp)
        pos = tl.where(vm, i, pos)
        n_miss += miss.to(tl.int64)
        miss_bytes += tl.where(miss, tl.load(nbytes_p + j * E + e), 0)
    changed = (exp != old) & valid
    back = tl.load(ram_offset_p + j * E + old, mask=changed & (old >= 0), other=0)
    tl.store(table_p + j * E + old, back, mask=changed & (old >= 0))          # evicted: read in place again
    offs = tl.load(slot_offset_p + j * C + s, mask=changed, other=0)
    tl.store(table_p + j * E + exp, offs, mask=changed)                       # admitted: its slot
    tl.store(slot_expert_p + j * C + s, exp, mask=valid)
    tl.store(slot_stamp_p + j * C + s, stamp, mask=valid)
    tl.store(admit_p + j * K + kk, admit, mask=kk < K)
    tl.store(tick_p + j, tick + 1)
    tl.store(counts_p + j * 4 + 0, tl.load(counts_p + j * 4 + 0) + n_static)
    tl.store(counts_p + j * 4 + 1, tl.load(counts_p + j * 4 + 1) + n_hit)
    tl.store(counts_p + j * 4 + 2, tl.load(counts_p + j * 4 + 2) + n_miss)
    tl.store(counts_p + j * 4 + 3, tl.load(counts_p + j * 4 + 3) + miss_bytes)


@triton.jit
def fill_kernel(arena_p, ids_p, j, E, admit_p, ram_offset_p, nbytes_p, tail_p, split_p, K: tl.constexpr,
                CHUNK: tl.constexpr, HAS_TAIL: tl.constexpr):
    # grid (K, chunks): program (i, b) copies bytes [b * CHUNK, (b + 1) * CHUNK) of routed position i's expert from
    # arena_p + ram_offset[j, e] (pinned RAM, in place) to arena_p + admit[j, i], when admit[j, i] >= 0; int64
    # words (every blob is a multiple of 4 KiB at 4 KiB-aligned offsets). HAS_TAIL: where tail[j, e] >= 0, the
    # words from split[j, e] on come from arena_p + tail[j, e] (a prefix landed in a staging slot, the rest in RAM)
    i = tl.program_id(0)
    b = tl.program_id(1)
    dst = tl.load(admit_p + j * K + i)
    e = tl.load(ids_p + i)
    n = tl.load(nbytes_p + j * E + e)
    src = (arena_p + tl.load(ram_offset_p + j * E + e)).to(tl.pointer_type(tl.int64))
    out = (arena_p + tl.maximum(dst, 0)).to(tl.pointer_type(tl.int64))
    split = n                                     # words before it from src, the rest from rest
    rest = src
    if HAS_TAIL:
        tail = tl.load(tail_p + j * E + e)
        split = tl.where(tail >= 0, tl.load(split_p + j * E + e), n)
        rest = (arena_p + tl.maximum(tail, 0)).to(tl.pointer_type(tl.int64))
    for k in range(0, CHUNK // 8, FILL_BLOCK):                                   # FILL_BLOCK words at a time
        w = tl.cast(b, tl.int64) * (CHUNK // 8) + k + tl.arange(0, FILL_BLOCK)   # [FILL_BLOCK] words
        ok = w < tl.where(dst >= 0, n // 8, 0)
        first = w < split // 8
        v = tl.load(src + w, mask=ok & first)
        if HAS_TAIL:
            v = tl.where(first, v, tl.load(rest + w, mask=ok & (w >= split // 8)))
        tl.store(out + w, v, mask=ok)


def lru_step(ids: torch.Tensor, j: int, st: LruState) -> None:
    """Layer j's cache step for one token's routed ids (int64 [1, k] or [k], slot order). Graph-safe."""
    K = st.admit.shape[1]
    L, C = st.slot_expert.shape
    E = st.table.shape[1]
    lru_step_kernel[(1,)](ids.reshape(-1), j, E, C, st.static, st.slot_expert, st.slot_stamp, st.slot_offset,
                          st.n_slots, st.ram_offset, st.nbytes, st.table, st.admit, st.tick, st.counts,
                          K=K, KB=triton.next_power_of_2(K), CB=triton.next_power_of_2(max(C, 2)))


def fill_slots(arena: torch.Tensor, ids: torch.Tensor, j: int, st: LruState, max_bytes: int) -> None:
    """Copy layer j's admitted experts (this token's `admit[j]`) from pinned RAM into their slots. Graph-safe."""
    K = st.admit.shape[1]
    split = st.tail is not None
    fill_kernel[(K, triton.cdiv(max_bytes, FILL_CHUNK))](arena, ids.reshape(-1), j, st.table.shape[1], st.admit,
                                                         st.ram_offset, st.nbytes, st.tail if split else st.nbytes,
                                                         st.split if split else st.nbytes, K=K, CHUNK=FILL_CHUNK,
                                                         HAS_TAIL=split)


# ---- the plain reference (the CPU path; the kernels are held to it) -------------------------------------
def reference_step(ids: torch.Tensor, j: int, st: LruState) -> None:
    ids = [int(e) for e in ids.reshape(-1).tolist()]
    K = len(ids)
    c = int(st.n_slots[j])
    tick = int(st.tick[j])
    old = st.slot_expert[j, :c].tolist()
    stamp = st.slot_stamp[j, :c].tolist()
    static = [bool(st.static[j, e]) for e in ids]
    counts = [0, 0, 0, 0]
    for i, e in enumerate(ids):                      # pass 1: hits
        if static[i]:
            counts[STATIC] += 1
        elif e in old:
            stamp[old.index(e)] = tick * K + i
            counts[HIT] += 1
    exp, pos, admit = list(old), [-1] * c, [-1] * K
    for i, e in enumerate(ids):                      # pass 2: misses
        if static[i] or e in old:
            continue
        counts[MISS] += 1
        counts[MISS_BYTES] += int(st.nbytes[j, e])
        if c == 0 or tick * K + i < min(stamp):        # every slot holds a later touch: read in place
            continue
        v = min(range(c), key=lambda s: (stamp[s], s))
        if pos[v] >= 0:
            admit[pos[v]] = -1
        exp[v], stamp[v], pos[v] = e, tick * K + i, i
        admit[i] = int(st.slot_offset[j, v])
    for s in range(c):
        if exp[s] != old[s]:
            if old[s] >= 0:
                st.table[j, old[s]] = st.ram_offset[j, old[s]]
            st.table[j, exp[s]] = st.slot_offset[j, s]
    st.slot_expert[j, :c] = torch.tensor(exp, dtype=torch.int64)
    st.slot_stamp[j, :c] = torch.tensor(stamp, dtype=torch.int64)
    st.admit[j] = torch.tensor(admit, dtype=torch.int64)
    st.tick[j] += 1
    st.counts[j] += torch.tensor(counts, dtype=torch.int64, device=st.counts.device)


def reference_fill(arena: torch.Tensor, ids: torch.Tensor, j: int, st: LruState) -> None:
    for i, e in enumerate(ids.reshape(-1).tolist()):
        dst = int(st.admit[j, i])
        if dst >= 0:
            src, n = int(st.ram_offset[j, e]), int(st.nbytes[j, e])
            tail = int(st.tail[j, e]) if st.tail is not None else -1
            h = int(st.split[j, e]) if tail >= 0 else n
            arena[dst:dst + h] = arena[src:src + h]
            if tail >= 0:
                arena[dst + h:dst + n] = arena[tail + h:tail + n]
