"""Router-lookahead prefetch inside the device loop's graph: VRAM staging slots with a protocol that cannot race.

    claim(gids, jj, st)            # side stream: a FREE slot for each guessed RAM expert of layer jj (CAS FREE -> FILLING)
    copy(arena, gids, jj, st)      # side stream: the claimed experts copied from pinned RAM into their slots, each
                                   # published by its last chunk: FILLING -> READY (release), or TAKEN -> TAKEN_DONE
    resolve(ids, j, st)            # main stream, before layer j's MoE: READY slots are read, layer j's FILLING ones TAKEN
    resolve_step(ids, j, st, lru)  # ... and then the device LRU's step (kernels.lru), in one launch
    release(j, st)                 # after layer j's MoE (the side stream's next fork, or the token's end): slots of
                                   # layers <= j whose copy is over back to FREE

Each staging slot has a state word, `(tag << 3) | state` with tag = layer * E + expert, changed only by atomic
compare-and-swap or exchange at GPU scope:

    FREE -> FILLING (claim)  -> READY (the copy's last chunk of the slot: a release)  -> CONSUMED (resolve: used)
                             -> TAKEN (resolve found it still filling: the layer reads the expert in place from RAM,
                                       or nobody routed it: abandoned)
                                      -> TAKEN_DONE (the copy's last chunk of the slot, skipped or not)
    READY / CONSUMED / TAKEN_DONE -> FREE (release, after the layer's down projection)

Partial landing (`landed` given; layers with a device LRU, `partial`): the copy marks each 64 KiB chunk of a slot
landed (`landed [S, NCH]`, a release after the chunk's stores; `claim` clears a slot's marks), and `resolve`, finding a
routed guess still FILLING in such a layer, takes it with the prefix of its blob that landed: the device LRU's fill
reads those bytes from the staging slot (`LruState.src`, `split`) and the rest from pinned RAM (`LruState.tail`), and
the layer's MoE reads the whole expert from its cache slot. A kimi expert (27 MB, 0.54 ms at 50 GB/s) does not fit the
link's idle time in one layer (attention, router: about 0.19 ms on the H200), a part of it does.

`resolve` loads a slot's word with acquire semantics once per routed id; an expert it finds READY is read from its slot
(the table, and the device LRU's fill source, point there until `release`), one it finds FILLING is TAKEN and read in
place from pinned RAM; every other guess of layer j still FILLING (nobody routed it) is TAKEN too, and the copy skips
the chunks of a TAKEN slot not yet moved (it reads the slot's word before each 64 KiB chunk): a wrong or late guess
costs the link bytes copied before its layer ran (counted as wasted), never a wait or a wrong result. `where [L, E]`
names the slot a claim gave an expert (-1 none); a stale entry is caught by the tag. A slot is written only by the copy
of the claim that holds it, and freed only by a `release` issued after its consumer ran (on the side stream after the
layer's MoE kernels, or at the token's end after the streams joined) once its copy is over. Counters `counts [L,
N_COUNTS]`: uses served from a slot, uses TAKEN (late), slots freed unused (wasted), bytes copied, bytes of the uses
served from a slot, bytes copied into slots and not read from them (`filled [S]`, `used [S]` hold each slot's), and the
lookahead's precision and recall terms (`guessed [L, G]`, the guesses for each layer written on the side stream when
issued: guesses, right guesses, routed ids where a guess existed; `resolve` counts and clears them), and late uses
served their landed part (partial). `reference_*` are the same in plain Python (the CPU engine's path: there the side
stream is the main one, so a claimed guess is READY when its layer runs); the kernels are held to them under the
interpreter.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .copy_units import COPY_CHUNK, COPY_PROGRAMS
from .lru import lru_step_body, reference_step
from .ops import _sm_count
from .triton_common import tl, triton

FREE, FILLING, READY, TAKEN, TAKEN_DONE, CONSUMED = range(6)
USED, LATE, WASTED, COPIED, USED_BYTES, WASTED_BYTES, GUESSES, RIGHT, HINTED_USED, PART_USED = range(10)
N_COUNTS = 10
COPY_BLOCK = tl.constexpr(1024)  # int64 words a program moves per step of its loop (8 KiB: no register spills)
# the states as the kernels see them (a jitted function reads only constexpr globals)
_FREE, _FILLING, _READY, _TAKEN, _TAKEN_DONE, _CONSUMED = (tl.constexpr(v) for v in range(6))
_NC = tl.constexpr(N_COUNTS)
_CB = tl.constexpr(128)        # chunk marks a step of claim's and resolve's loops over a slot's chunks


@dataclass(frozen=True)
class PrefetchState:
    state: torch.Tensor        # int64 [S] slot words
    slot_offset: torch.Tensor  # int64 [S] arena offsets of the staging slots
    where: torch.Tensor        # int64 [L, E] the slot claimed for (layer, expert), -1 none
    assign: torch.Tensor       # int64 [G] the slot each guess of the current claim got, -1 none
    ram_rows: torch.Tensor     # int64 [L, E] each RAM expert's in-place offset (pinned RAM), never changed
    tier: torch.Tensor         # int8 [L, E] 0 VRAM, 1 RAM, 2 NVMe
    nbytes: torch.Tensor       # int64 [L, E]
    table: torch.Tensor        # int64 [L, E] the offsets fused_moe reads
    src: torch.Tensor | None   # int64 [L, E] the device LRU's fill source (None without a cache)
    counts: torch.Tensor       # int64 [L, N_COUNTS]
    guessed: torch.Tensor      # int64 [L, G] the guesses issued for each layer this token, -1 none
    cached_hi: int             # table entries in [0, cached_hi) are VRAM
    filled: torch.Tensor | None = None    # int64 [S] bytes copied into each slot since its claim (None: made here)
    done: torch.Tensor | None = None      # int64 [S] the copy's items of each slot counted so far (None: made here)
    used: torch.Tensor | None = None      # int64 [S] bytes of each slot's expert a layer read from it (None: made here)
    # partial landing (all four, or none: whole experts only)
    landed: torch.Tensor | None = None    # int32 [S, NCH] 1: the slot's chunk landed since its claim (NCH x COPY_CHUNK
    #                                       >= a slot)
    partial: torch.Tensor | None = None   # int8 [L] 1: the layer takes a guess's landed prefix (it has a device LRU)
    tail: torch.Tensor | None = None      # int64 [L, E] the device LRU's tail source (`LruState.tail`)
    split: torch.Tensor | None = None     # int64 [L, E] the device LRU's bytes at src (`LruState.split`)

    def __post_init__(self):
        for name in ("filled", "done", "used"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, torch.zeros_like(self.state))
        given = [getattr(self, n) is not None for n in ("landed", "partial", "tail", "split")]
        if any(given) and not (all(given) and self.src is not None):
            raise ValueError("partial landing needs landed, partial, the device LRU's src, tail and split")

    @property
    def partial_landing(self) -> bool:
        return self.landed is not None


def _word(tag, st):
    return tag * 8 + st


@triton.jit
def claim_kernel(gids_p, jj, E, state_p, where_p, assign_p, table_p, tier_p, landed_p, S, NCH, cached_hi,
                 G: tl.constexpr, GB: tl.constexpr, SB: tl.constexpr, PARTIAL: tl.constexpr):
    # gids_p: int64 [G] guessed ids of layer jj, best first (-1 padded); one program, every guess and slot at once:
    # the i-th eligible guess takes the i-th FREE slot (as one CAS after another from slot 0 would: only a claim takes
    # a FREE slot, and claims run one after another on the side stream), each by one CAS FREE -> FILLING
    gg = tl.arange(0, GB)
    mg = gg < G
    e = tl.load(gids_p + gg, mask=mg, other=-1)                                   # [GB]
    at = jj * E + tl.maximum(e, 0)
    cur = tl.load(table_p + at, mask=mg, other=0)
    dup = tl.sum(((e[None, :] == e[:, None]) & (gg[None, :] < gg[:, None])).to(tl.int32), 1) > 0   # an earlier twin
    ok = mg & (e >= 0) & (tl.load(tier_p + at, mask=mg, other=0) == 1) & ((cur < 0) | (cur >= cached_hi)) \
        & (tl.load(where_p + at, mask=mg, other=0) < 0) & (dup == 0)
    rank = tl.cumsum(ok.to(tl.int32), 0) - ok.to(tl.int32)                       # [GB] eligible guesses before it
    ss, live, w = _slot_words(state_p, S, SB)
    free = live & (w == _FREE)
    frank = tl.cumsum(free.to(tl.int32), 0) - free.to(tl.int32)                  # [SB] FREE slots before it
    match = ok[:, None] & free[None, :] & (frank[None, :] == rank[:, None])      # [GB, SB]
    got = tl.where(tl.sum(match.to(tl.int32), 1) > 0, tl.sum(tl.where(match, ss[None, :], 0), 1), -1)
    take = got >= 0
    if PARTIAL:                                   # a FREE slot: no copy writes its marks; cleared before it is FILLING
        for c0 in range(0, NCH, _CB):
            c = c0 + tl.arange(0, _CB)
            tl.store(landed_p + tl.maximum(got, 0)[:, None] * NCH + c[None, :], tl.zeros([GB, _CB], tl.int32),
                     mask=take[:, None] & (c[None, :] < NCH))
        tl.debug_barrier()
    old = tl.atomic_cas(state_p + tl.where(take, got, 0), tl.where(take, 0, -1).to(tl.int64),
                        tl.where(take, at * 8 + _FILLING, -1).to(tl.int64), sem="acq_rel")
    got = tl.where(take & (old == _FREE), got, -1)
    tl.store(assign_p + gg, got.to(tl.int64), mask=mg)
    tl.store(where_p + at, got.to(tl.int64), mask=got >= 0)


@triton.jit
def copy_kernel(arena_p, gids_p, jj, E, assign_p, slot_offset_p, ram_rows_p, nbytes_p, counts_p, state_p, filled_p,
                done_p, landed_p, n_chunks, total, P, CHUNK: tl.constexpr, PARTIAL: tl.constexpr):
    # grid (P,), persistent: program p copies the items p, p + P, ... of the G x n_chunks items, item (i, b) being bytes
    # [b CHUNK, (b + 1) CHUNK) of guess i's expert into its slot, guesses in order (best first). A few programs a SM
    # reach the link's rate and leave the SMs to the main stream's kernels running beside it (a grid of every chunk
    # would hold them all). An item whose slot is no longer FILLING (resolve TAKEN it: its layer reads the expert in
    # place) is skipped: a late guess stops costing link bytes at the next chunk. Each item, copied or skipped, counts
    # itself in its slot's `done` (acq_rel: its stores before); the slot's last item publishes it at once: FILLING ->
    # READY (release), or TAKEN -> TAKEN_DONE, so the best guess is READY while the others still copy. PARTIAL: each
    # item copied marks its chunk landed (landed [S, n_chunks], a release after its stores)
    pid = tl.program_id(0)
    for t in range(pid, total, P):                                               # total = G x n_chunks
        i = t // n_chunks
        b = t % n_chunks
        s = tl.load(assign_p + i)
        e = tl.maximum(tl.load(gids_p + i), 0)
        tag = (jj * E + e).to(tl.int64)
        filling = tag * 8 + _FILLING
        live = s >= 0
        if live:
            word = tl.atomic_add(state_p + s, 0, sem="relaxed")                  # the slot's word, not a cached copy
            live = word == filling
        n = tl.where(live, tl.load(nbytes_p + jj * E + e), 0)
        src = (arena_p + tl.load(ram_rows_p + jj * E + e)).to(tl.pointer_type(tl.int64))
        dst = (arena_p + tl.load(slot_offset_p + tl.maximum(s, 0))).to(tl.pointer_type(tl.int64))
        for k in range(0, CHUNK // 8, COPY_BLOCK):                               # COPY_BLOCK words at a time
            w = tl.cast(b, tl.int64) * (CHUNK // 8) + k + tl.arange(0, COPY_BLOCK)   # [COPY_BLOCK] int64 words
            ok = w < n // 8
            tl.store(dst + w, tl.load(src + w, mask=ok), mask=ok)
        moved = tl.minimum(tl.maximum(n - tl.cast(b, tl.int64) * CHUNK, 0), CHUNK)   # this item's bytes
        if moved > 0:
            tl.atomic_add(filled_p + s, moved, sem="relaxed")
            tl.atomic_add(counts_p + jj * _NC + 3, moved, sem="relaxed")
        tl.debug_barrier()                                    # every lane's stores of the item before its count
        if PARTIAL:
            if moved > 0:
                tl.atomic_xchg(landed_p + s * n_chunks + b, 1, sem="release")
        if s >= 0:
            if tl.atomic_add(done_p + s, 1, sem="acq_rel") == n_chunks - 1:     # the slot's last item: publish
                tl.atomic_xchg(done_p + s, 0, sem="relaxed")
                old = tl.atomic_cas(state_p + s, filling, tag * 8 + _READY, sem="release")
                if old != filling:                                                # resolve took it: read in place
                    tl.atomic_xchg(state_p + s, tag * 8 + _TAKEN_DONE, sem="release")


@triton.jit
def _slot_words(state_p, S, SB: tl.constexpr):
    # every slot's word at once, each loaded with acquire semantics: lanes [SB], live [SB] (lane < S), words [SB]
    ss = tl.arange(0, SB)
    live = ss < S
    w = tl.atomic_add(state_p + tl.where(live, ss, 0), tl.zeros([SB], tl.int64), mask=live, sem="acquire")
    return ss, live, w


@triton.jit
def resolve_kernel(ids_p, j, E, state_p, where_p, slot_offset_p, table_p, src_p, tier_p, nbytes_p, counts_p,
                   guessed_p, ram_rows_p, landed_p, partial_p, tail_p, split_p, used_p, cached_hi, S, NCH,
                   K: tl.constexpr, KB: tl.constexpr, G: tl.constexpr, GB: tl.constexpr, SB: tl.constexpr,
                   HAS_SRC: tl.constexpr, PARTIAL: tl.constexpr, CHUNK: tl.constexpr):
    resolve_body(ids_p, j, E, state_p, where_p, slot_offset_p, table_p, src_p, tier_p, nbytes_p, counts_p, guessed_p,
                 ram_rows_p, landed_p, partial_p, tail_p, split_p, used_p, cached_hi, S, NCH, K, KB, G, GB, SB,
                 HAS_SRC, PARTIAL, CHUNK)


@triton.jit
def resolve_step_kernel(ids_p, j, E, state_p, where_p, slot_offset_p, table_p, src_p, tier_p, nbytes_p, counts_p,
                        guessed_p, ram_rows_p, landed_p, partial_p, tail_p, split_p, used_p, cached_hi, S, NCH,
                        C, static_p, slot_expert_p, slot_stamp_p, lru_slot_p, n_slots_p, admit_p, tick_p, lru_counts_p,
                        K: tl.constexpr, KB: tl.constexpr, G: tl.constexpr, GB: tl.constexpr, SB: tl.constexpr,
                        CB: tl.constexpr, PARTIAL: tl.constexpr, CHUNK: tl.constexpr):
    # layer j's resolve, then its device LRU step (kernels.lru), in one launch: the lookahead adds no kernel to the
    # main chain of a layer with a cache. The step reads none of what resolve wrote (the table entries it loads are
    # the evicted experts', cached before this token; resolve's are this token's misses) and its stores come after
    # resolve's loads of the same entries (the barrier)
    resolve_body(ids_p, j, E, state_p, where_p, slot_offset_p, table_p, src_p, tier_p, nbytes_p, counts_p, guessed_p,
                 ram_rows_p, landed_p, partial_p, tail_p, split_p, used_p, cached_hi, S, NCH, K, KB, G, GB, SB,
                 True, PARTIAL, CHUNK)
    tl.debug_barrier()
    lru_step_body(ids_p, j, E, C, static_p, slot_expert_p, slot_stamp_p, lru_slot_p, n_slots_p, src_p, nbytes_p,
                  table_p, admit_p, tick_p, lru_counts_p, K, KB, CB)


@triton.jit
def resolve_body(ids_p, j, E, state_p, where_p, slot_offset_p, table_p, src_p, tier_p, nbytes_p, counts_p,
                 guessed_p, ram_rows_p, landed_p, partial_p, tail_p, split_p, used_p, cached_hi, S, NCH,
                 K: tl.constexpr, KB: tl.constexpr, G: tl.constexpr, GB: tl.constexpr, SB: tl.constexpr,
                 HAS_SRC: tl.constexpr, PARTIAL: tl.constexpr, CHUNK: tl.constexpr):
    # ids_p: int64 [K] layer j's routed ids (distinct); one program; before the LRU step and the MoE kernels of layer j.
    # Every routed id at once ([KB] lanes): each step is one vector load or CAS (a lane with nothing to change
    # compares against -1, never a word), not K round trips one after another
    kk = tl.arange(0, KB)
    mk = kk < K
    gg = tl.arange(0, GB)
    guess = tl.load(guessed_p + j * G + gg, mask=gg < G, other=-1)               # [GB] this layer's guesses
    e = tl.load(ids_p + kk, mask=mk, other=0)                                   # [KB]
    n_right = tl.sum((mk & (tl.sum((guess[None, :] == e[:, None]).to(tl.int32), 1) > 0)).to(tl.int64), 0)
    at = j * E + e
    cur = tl.load(table_p + at, mask=mk, other=-1)
    s = tl.load(where_p + at, mask=mk, other=-1)
    ok = mk & (tl.load(tier_p + at, mask=mk, other=0) == 1) & ((cur < 0) | (cur >= cached_hi)) & (s >= 0)
    sp = state_p + tl.where(ok, s, 0)
    ready, filling = (at * 8 + _READY).to(tl.int64), (at * 8 + _FILLING).to(tl.int64)
    consumed, taken = (at * 8 + _CONSUMED).to(tl.int64), (at * 8 + _TAKEN).to(tl.int64)
    old = tl.atomic_cas(sp, tl.where(ok, ready, -1), tl.where(ok, consumed, -1), sem="acquire")
    took = ok & (old == filling)                                  # still being copied: take it, read in place
    old2 = tl.atomic_cas(sp, tl.where(took, filling, -1), tl.where(took, taken, -1), sem="acq_rel")
    again = took & (old2 == ready)                                # published meanwhile: use it after all
    old3 = tl.atomic_cas(sp, tl.where(again, ready, -1), tl.where(again, consumed, -1), sem="acquire")
    old = tl.where(again, old3, tl.where(took, old2, old))
    use = ok & (old == ready)
    late = ok & (old == filling)
    nb = tl.load(nbytes_p + at, mask=use, other=0)
    b_used = tl.sum(tl.where(use, nb, 0), 0)
    off = tl.load(slot_offset_p + tl.where(ok, s, 0), mask=ok, other=0)
    tl.store(table_p + at, off, mask=use)
    tl.store(used_p + tl.where(use, s, 0), nb, mask=use)
    if HAS_SRC:
        tl.store(src_p + at, off, mask=use)
    n_used = tl.sum(use.to(tl.int64), 0)
    n_part = n_used * 0
    if PARTIAL:   # a late guess's landed prefix (chunks marked, acquire) serves the cache's fill; the rest from RAM
        part = late & ((kk * 0 + tl.load(partial_p + j).to(tl.int32)) != 0)   # (a vector: the interpreter's masks)
        first = tl.full([KB], 0, tl.int32) + NCH                  # the first chunk not landed
        for c0 in range(0, NCH, _CB):
            c = c0 + tl.arange(0, _CB)
            m = part[:, None] & (c[None, :] < NCH)
            row = landed_p + tl.where(part, s, 0)[:, None] * NCH
            f = tl.atomic_add(row + c[None, :], tl.zeros([KB, _CB], tl.int32), mask=m, sem="acquire")   # [KB, _CB]
            first = tl.minimum(first, tl.min(tl.where(m & (f == 0), c[None, :], NCH), 1))
        pb = tl.minimum(first.to(tl.int64) * CHUNK, tl.load(nbytes_p + at, mask=part, other=0))
        part = part & (pb > 0)
        tl.store(src_p + at, off, mask=part)
        tl.store(tail_p + at, tl.load(ram_rows_p + at, mask=part, other=0), mask=part)
        tl.store(split_p + at, pb, mask=part)
        tl.store(used_p + tl.where(part, s, 0), pb, mask=part)
        b_used += tl.sum(tl.where(part, pb, 0), 0)
        n_part = tl.sum(part.to(tl.int64), 0)
        late = late & (part == 0)
    n_late = tl.sum(late.to(tl.int64), 0)
    # the guesses of layer j still being copied that nobody routed are abandoned too: the copy stops at their next chunk
    # instead of spending the link on bytes no layer reads (the copy then marks them TAKEN_DONE, release frees them).
    # Every slot at once: one load and one CAS a lane (-1, never a word, where a lane has nothing to change)
    ss, live, w = _slot_words(state_p, S, SB)
    hit = live & (w % 8 == _FILLING) & (w // 8 // E == j)
    at = tl.where(live, ss, 0)
    tl.atomic_cas(state_p + at, tl.where(hit, w, -1), tl.where(hit, w - _FILLING + _TAKEN, -1), sem="acq_rel")
    n_guess = tl.sum((guess >= 0).to(tl.int64), 0)
    c = counts_p + j * _NC
    tl.store(c + 0, tl.load(c + 0) + n_used)
    tl.store(c + 1, tl.load(c + 1) + n_late)
    tl.store(c + 4, tl.load(c + 4) + b_used)
    tl.store(c + 6, tl.load(c + 6) + n_guess)
    tl.store(c + 7, tl.load(c + 7) + n_right)
    tl.store(c + 8, tl.load(c + 8) + tl.where(n_guess > 0, K, 0))
    tl.store(c + 9, tl.load(c + 9) + n_part)
    tl.store(guessed_p + j * G + gg, tl.full([GB], -1, tl.int64), mask=gg < G)


@triton.jit
def release_kernel(j, E, state_p, where_p, slot_offset_p, ram_rows_p, table_p, src_p, tail_p, filled_p, used_p,
                   counts_p, S, SB: tl.constexpr, HAS_SRC: tl.constexpr, PARTIAL: tl.constexpr):
    # after layer j's MoE (side stream): slots of layers <= j whose copy is over back to FREE; one program, every slot
    # at once ([SB] lanes): a serial scan of S acquire loads took S round trips to L2 a layer. A slot no layer read
    # from (`used` 0) is wasted; the bytes copied into a slot beyond those read from it are wasted bytes
    ss, live, w = _slot_words(state_p, S, SB)
    st = w % 8
    at = tl.maximum(w // 8, 0)
    layer = at // E
    done = live & ((st == _READY) | (st == _CONSUMED) | (st == _TAKEN_DONE)) & (layer <= j)
    off = tl.load(slot_offset_p + ss, mask=done, other=-1)
    back = tl.load(ram_rows_p + at, mask=done, other=0)
    tl.store(table_p + at, back, mask=done & (tl.load(table_p + at, mask=done, other=-1) == off))   # not the LRU's
    if HAS_SRC:
        here = done & (tl.load(src_p + at, mask=done, other=-1) == off)
        tl.store(src_p + at, back, mask=here)
        if PARTIAL:
            tl.store(tail_p + at, tl.full([SB], -1, tl.int64), mask=here)
    tl.store(where_p + at, tl.full([SB], -1, tl.int64), mask=done & (tl.load(where_p + at, mask=done, other=-1) == ss))
    used = tl.load(used_p + ss, mask=done, other=0)
    filled = tl.load(filled_p + ss, mask=done, other=0)
    tl.atomic_add(counts_p + layer * _NC + 2, (used == 0).to(tl.int64), mask=done, sem="relaxed")
    tl.atomic_add(counts_p + layer * _NC + 5, tl.maximum(filled - used, 0), mask=done, sem="relaxed")
    tl.store(filled_p + ss, tl.zeros([SB], tl.int64), mask=done)
    tl.store(used_p + ss, tl.zeros([SB], tl.int64), mask=done)
    tl.debug_barrier()                                        # every lane's stores before any slot turns FREE
    tl.atomic_xchg(state_p + ss, tl.full([SB], _FREE, tl.int64), mask=done, sem="release")


def probe_state(S: int, L: int, E: int, K: int, device, ram_base: int = 1 << 30) -> PrefetchState:
    """A state of S slots over L layers of E experts (top-K), every expert in RAM, 4 KiB each at `ram_base` + 4 KiB x
    (layer x E + expert) from the arena (the slots at 0 .. S x 4 KiB), each slot READY for an expert of layer 0 nobody
    routes: what the profiler and benchmarks/tools time the slot kernels on."""
    rows = torch.arange(L * E, dtype=torch.int64, device=device).reshape(L, E) * 4096 + ram_base
    return PrefetchState(state=torch.tensor([_word(E - 1 - s % E, READY) for s in range(S)], dtype=torch.int64,
                                            device=device),
                         slot_offset=torch.arange(S, dtype=torch.int64, device=device) * 4096,
                         where=torch.full((L, E), -1, dtype=torch.int64, device=device),
                         assign=torch.full((K,), -1, dtype=torch.int64, device=device), ram_rows=rows,
                         tier=torch.ones((L, E), dtype=torch.int8, device=device),
                         nbytes=torch.full((L, E), 4096, dtype=torch.int64, device=device), table=rows.clone(),
                         src=None, counts=torch.zeros((L, N_COUNTS), dtype=torch.int64, device=device),
                         guessed=torch.full((L, K), -1, dtype=torch.int64, device=device), cached_hi=0)


def probe_cache(st: PrefetchState, C: int):
    """`st` with a device LRU of C slots a layer over the same table (its fill source the state's `src`), every
    expert non-static, the slots at arena offsets nobody reads (the probes run no fill): (state, LruState), for
    timing `resolve_step` against `lru.lru_step` alone."""
    from .lru import LruState
    L, E = st.table.shape
    K, dev = st.assign.numel(), st.table.device
    src = st.ram_rows.clone()
    i64 = dict(dtype=torch.int64, device=dev)
    cache = LruState(slot_expert=torch.full((L, C), -1, **i64), slot_stamp=torch.full((L, C), -1, **i64),
                     slot_offset=torch.arange(L * C, **i64).reshape(L, C) * 4096,
                     n_slots=torch.full((L,), C, **i64), static=torch.zeros((L, E), dtype=torch.int8, device=dev),
                     ram_offset=src, nbytes=st.nbytes, table=st.table, admit=torch.full((L, K), -1, **i64),
                     tick=torch.zeros(L, **i64), counts=torch.zeros((L, 4), **i64))
    return dataclasses.replace(st, src=src), cache


def note_guesses(gids: torch.Tensor, jj: int, st: PrefetchState) -> None:
    """(side stream, when the guesses for layer jj are issued) Keep them for `resolve`'s precision and recall."""
    st.guessed[jj, :gids.numel()].copy_(gids.reshape(-1))


def claim(gids: torch.Tensor, jj: int, st: PrefetchState) -> None:
    E = st.table.shape[1]
    part = st.partial_landing
    claim_kernel[(1,)](gids, jj, E, st.state, st.where, st.assign, st.table, st.tier,
                       st.landed if part else st.state, st.state.numel(), st.landed.shape[1] if part else 0,
                       st.cached_hi, G=gids.numel(), GB=triton.next_power_of_2(gids.numel()),
                       SB=triton.next_power_of_2(st.state.numel()), PARTIAL=part, num_warps=1)


def copy_programs(device) -> int:
    """Programs of the copy kernel on `device`: COPY_PROGRAMS, at most one a streaming multiprocessor."""
    return max(1, min(COPY_PROGRAMS, _sm_count(torch.device(device))))


def copy(arena: torch.Tensor, gids: torch.Tensor, jj: int, st: PrefetchState, max_bytes: int,
         programs: int | None = None) -> None:
    """The claimed guesses' experts (at most `max_bytes` each) from pinned RAM into their slots, each slot published
    (READY, or TAKEN_DONE) by its last chunk: `programs` persistent programs (default `copy_programs`) over the
    guesses' 64 KiB chunks."""
    E = st.table.shape[1]
    n_chunks = triton.cdiv(max_bytes, COPY_CHUNK)
    total = gids.numel() * n_chunks
    P = min(total, programs or copy_programs(arena.device))
    part = st.partial_landing
    if part and st.landed.shape[1] != n_chunks:
        raise ValueError(f"landed has {st.landed.shape[1]} chunk marks a slot, the copy {n_chunks}")
    copy_kernel[(P,)](arena, gids, jj, E, st.assign, st.slot_offset, st.ram_rows, st.nbytes, st.counts, st.state,
                      st.filled, st.done, st.landed if part else st.done, n_chunks, total, P, CHUNK=COPY_CHUNK,
                      PARTIAL=part)


def _resolve_args(ids: torch.Tensor, j: int, st: PrefetchState, K: int) -> tuple[tuple, dict]:
    """`resolve_body`'s arguments (its kernels' first ones, then their shared constexprs) for K routed ids."""
    src = st.src if st.src is not None else st.table
    part = st.partial_landing
    G = st.guessed.shape[1]
    args = (ids.reshape(-1), j, st.table.shape[1], st.state, st.where, st.slot_offset, st.table, src, st.tier,
            st.nbytes, st.counts, st.guessed, st.ram_rows, st.landed if part else st.state,
            st.partial if part else st.tier, st.tail if part else src, st.split if part else src, st.used,
            st.cached_hi, st.state.numel(), st.landed.shape[1] if part else 0)
    consts = dict(K=K, KB=triton.next_power_of_2(K), G=G, GB=triton.next_power_of_2(G),
                  SB=triton.next_power_of_2(st.state.numel()), PARTIAL=part, CHUNK=COPY_CHUNK)
    return args, consts


def resolve(ids: torch.Tensor, j: int, st: PrefetchState) -> None:
    args, consts = _resolve_args(ids, j, st, ids.numel())
    resolve_kernel[(1,)](*args, **consts, HAS_SRC=st.src is not None, num_warps=1)


def resolve_step(ids: torch.Tensor, j: int, st: PrefetchState, lru_st) -> None:
    """`resolve`, then the device LRU's step (`kernels.lru.lru_step` on `lru_st`, whose fill source is `st.src`), in
    one launch."""
    if lru_st.ram_offset is not st.src or lru_st.table is not st.table:
        raise ValueError("resolve_step: the LRU's table and fill source must be the lookahead's")
    K, C = lru_st.admit.shape[1], lru_st.slot_expert.shape[1]
    if ids.numel() != K:
        raise ValueError(f"resolve_step: {ids.numel()} routed ids, the LRU steps {K}")
    args, consts = _resolve_args(ids, j, st, K)
    resolve_step_kernel[(1,)](*args, C, lru_st.static, lru_st.slot_expert, lru_st.slot_stamp, lru_st.slot_offset,
                              lru_st.n_slots, lru_st.admit, lru_st.tick, lru_st.counts, **consts,
                              CB=triton.next_power_of_2(max(C, 2)), num_warps=1)


def release(j: int, st: PrefetchState) -> None:
    src = st.src if st.src is not None else st.table
    part = st.partial_landing
    release_kernel[(1,)](j, st.table.shape[1], st.state, st.where, st.slot_offset, st.ram_rows, st.table, src,
                         st.tail if part else src, st.filled, st.used, st.counts, st.state.numel(),
                         SB=triton.next_power_of_2(st.state.numel()), HAS_SRC=st.src is not None, PARTIAL=part,
                         num_warps=1)


# ---- the plain reference (the CPU engine's path; the kernels are held to it) -----------------------------------
def _ram_and_off_vram(st: PrefetchState, at: tuple[int, int]) -> bool:
    cur = int(st.table[at])
    return int(st.tier[at]) == 1 and not 0 <= cur < st.cached_hi


def reference_claim(gids: torch.Tensor, jj: int, st: PrefetchState) -> None:
    E = st.table.shape[1]
    for i, e in enumerate(int(x) for x in gids.reshape(-1).tolist()):
        got = -1
        if e >= 0 and _ram_and_off_vram(st, (jj, e)) and int(st.where[jj, e]) < 0:
            free = (st.state == FREE).nonzero().flatten().tolist()
            if free:
                got = free[0]
                if st.partial_landing:
                    st.landed[got] = 0
                st.state[got] = _word(jj * E + e, FILLING)
                st.where[jj, e] = got
        st.assign[i] = got


def reference_copy(arena: torch.Tensor, gids: torch.Tensor, jj: int, st: PrefetchState) -> None:
    E = st.table.shape[1]
    for i, e in enumerate(int(x) for x in gids.reshape(-1).tolist()):
        s = int(st.assign[i])
        if s < 0:
            continue
        tag = jj * E + e
        if int(st.state[s]) == _word(tag, FILLING):                         # not TAKEN meanwhile
            n, a, b = int(st.nbytes[jj, e]), int(st.ram_rows[jj, e]), int(st.slot_offset[s])
            arena[b:b + n] = arena[a:a + n]
            if st.partial_landing:
                st.landed[s, :-(-n // COPY_CHUNK)] = 1
            st.filled[s] += n
            st.counts[jj, COPIED] += n
            st.state[s] = _word(tag, READY)
        else:
            st.state[s] = _word(tag, TAKEN_DONE)


def reference_resolve_step(ids: torch.Tensor, j: int, st: PrefetchState, lru_st) -> None:
    reference_resolve(ids, j, st)
    reference_step(ids, j, lru_st)


def _landed_prefix(st: PrefetchState, s: int, j: int, e: int) -> int:
    """Bytes of slot s's expert (j, e) landed from its start (0 without partial landing in layer j)."""
    if not st.partial_landing or not int(st.partial[j]):
        return 0
    marks = st.landed[s].tolist()
    first = marks.index(0) if 0 in marks else len(marks)
    return min(first * COPY_CHUNK, int(st.nbytes[j, e]))


def reference_resolve(ids: torch.Tensor, j: int, st: PrefetchState) -> None:
    E = st.table.shape[1]
    routed = [int(x) for x in ids.reshape(-1).tolist()]
    guess = {int(g) for g in st.guessed[j].tolist() if g >= 0}
    st.counts[j, GUESSES] += len(guess)
    st.counts[j, RIGHT] += len(guess & set(routed))
    st.counts[j, HINTED_USED] += len(routed) if guess else 0
    st.guessed[j] = -1
    for e in routed:
        s = int(st.where[j, e])
        if not (_ram_and_off_vram(st, (j, e)) and s >= 0):
            continue
        tag, w = j * E + e, int(st.state[s])
        off = int(st.slot_offset[s])
        if w == _word(tag, READY):
            st.state[s] = _word(tag, CONSUMED)
            st.table[j, e] = off
            if st.src is not None:
                st.src[j, e] = off
            st.used[s] = st.nbytes[j, e]
            st.counts[j, USED] += 1
            st.counts[j, USED_BYTES] += int(st.nbytes[j, e])
        elif w == _word(tag, FILLING):
            st.state[s] = _word(tag, TAKEN)
            pb = _landed_prefix(st, s, j, e)
            if pb:                               # its landed prefix fills the cache's slot, the rest comes from RAM
                st.src[j, e], st.tail[j, e], st.split[j, e], st.used[s] = off, st.ram_rows[j, e], pb, pb
                st.counts[j, PART_USED] += 1
                st.counts[j, USED_BYTES] += pb
            else:
                st.counts[j, LATE] += 1
    for s in range(st.state.numel()):          # unrouted guesses of layer j still copying: abandoned
        w = int(st.state[s])
        if w % 8 == FILLING and w // 8 // E == j:
            st.state[s] = w - FILLING + TAKEN


def reference_release(j: int, st: PrefetchState) -> None:
    E = st.table.shape[1]
    for s in range(st.state.numel()):
        w = int(st.state[s])
        stt, at = w % 8, w // 8
        layer, e = divmod(at, E)
        if stt not in (READY, CONSUMED, TAKEN_DONE) or layer > j:
            continue
        off, back = int(st.slot_offset[s]), int(st.ram_rows[layer, e])
        if int(st.table[layer, e]) == off:
            st.table[layer, e] = back
        if st.src is not None and int(st.src[layer, e]) == off:
            st.src[layer, e] = back
            if st.tail is not None:
                st.tail[layer, e] = -1
        if int(st.where[layer, e]) == s:
            st.where[layer, e] = -1
        used, filled = int(st.used[s]), int(st.filled[s])
        st.counts[layer, WASTED] += int(used == 0)
        st.counts[layer, WASTED_BYTES] += max(filled - used, 0)
        st.filled[s] = st.used[s] = 0
        st.state[s] = FREE
