"""Router-lookahead prefetch inside the device loop's graph: VRAM staging slots with a protocol that cannot race.

    claim(gids, jj, st)            # side stream: a FREE slot for each guessed RAM expert of layer jj (CAS FREE -> FILLING)
    copy(arena, gids, jj, st)      # side stream: the claimed experts copied from pinned RAM into their slots, each
                                   # published by its last chunk: FILLING -> READY (release), or TAKEN -> TAKEN_DONE
    resolve(ids, j, st)            # main stream, before layer j's MoE: READY slots are read, layer j's FILLING ones TAKEN
    release(j, st)                 # main stream, after layer j's MoE: slots of layers <= j back to FREE

Each staging slot has a state word, `(tag << 3) | state` with tag = layer * E + expert, changed only by atomic
compare-and-swap or exchange at GPU scope:

    FREE -> FILLING (claim)  -> READY (the copy's last chunk of the slot: a release)  -> CONSUMED (resolve: used)
                             -> TAKEN (resolve found it still filling: the layer reads the expert in place from RAM,
                                       or nobody routed it: abandoned)
                                      -> TAKEN_DONE (the copy's last chunk of the slot, skipped or not)
            FILLING -> HEAD (head landing: the last chunk of the expert's gate and up)  -> READY, or
                       HEAD -> TAKEN (resolve: the layer's cache fill reads gate and up from the slot, down from RAM)
    READY / CONSUMED / TAKEN_DONE -> FREE (release, main stream, after the layer's down projection)

Head landing (`head` given: layers with a device LRU, whose fill copies an admitted expert into its cache slot before
the MoE kernels read it): a blob is laid out gate, up, down, so once the chunks of its first `head[l, e]` bytes have
landed the copy publishes HEAD, and a layer that routes the expert then fills its cache slot with gate and up from the
staging slot and only down from pinned RAM (`LruState.tail`). A kimi expert (27 MB) does not fit the link's idle
window of one layer (about 0.47 ms at 50 GB/s on an H100, 23 MB), its gate and up (18 MB) do.

`resolve` loads a slot's word with acquire semantics once per routed id; an expert it finds READY is read from its
slot (the table, and the device LRU's fill source, point there until `release`), one it finds FILLING is TAKEN and read
in place from pinned RAM; every other guess of layer j still FILLING (nobody routed it) is TAKEN too, and the copy
skips the chunks of a TAKEN slot not yet moved (it reads the slot's word before each 64 KiB chunk): a wrong or late
guess costs the link bytes copied before its layer ran (counted as wasted), never a wait or a wrong result. `where
[L, E]` names the slot a claim gave an expert (-1 none); a stale entry is caught by the tag. A slot is written only by the copy of the claim that holds it, and freed only from the main stream after its
consumer ran, or, for a guess nobody routed, by a later `release` once its copy is over (at the latest `release(L - 1)`
after the token's streams joined). Counters `counts [L, N_COUNTS]`: uses served from a slot, uses TAKEN (late), slots
freed unused (wasted), bytes copied, bytes of the uses served from a slot, bytes copied into the slots freed unused
(`filled [S]` holds each slot's), and the lookahead's precision
and recall terms (`guessed [L, G]`, the guesses for each layer written on the side stream when issued: guesses,
right guesses, routed ids where a guess existed; `resolve` counts and clears them). `reference_*` are the same in
plain Python (the CPU engine's path: there the side stream is the main one, so a claimed guess is READY when its layer
runs); the kernels are held to them under the interpreter.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .ops import _sm_count
from .triton_common import tl, triton

FREE, FILLING, READY, TAKEN, TAKEN_DONE, CONSUMED, HEAD = range(7)
USED, LATE, WASTED, COPIED, USED_BYTES, WASTED_BYTES, GUESSES, RIGHT, HINTED_USED, HEAD_USED = range(10)
N_COUNTS = 10
COPY_CHUNK = 64 << 10          # bytes of one item of the copy kernel's loop (a multiple of 8 KiB)
COPY_PROGRAMS = 16             # the copy kernel's programs: the link's rate is the link's, not the SMs'. On the H100, 16
#                                moved 50.1 GB/s alone and 49.5 beside a GEMV workload that they slowed by 6%; 165
#                                (1.25 a SM, the earlier default) no faster, the workload slowed by 35%; 8: 34.4 GB/s
#                                (benchmarks/results/prefetch-copy-20261205T155055Z.json)
COPY_BLOCK = tl.constexpr(1024)  # int64 words a program moves per step of its loop (8 KiB: no register spills)
# the states as the kernels see them (a jitted function reads only constexpr globals)
_FREE, _FILLING, _READY, _TAKEN, _TAKEN_DONE, _CONSUMED, _HEAD = (tl.constexpr(v) for v in range(7))
_NC = tl.constexpr(N_COUNTS)


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
    head: torch.Tensor | None = None      # int64 [L, E] head landing: bytes of each expert's gate and up (0: whole
    #                                       only, a layer without a cache); None: whole experts only
    tail: torch.Tensor | None = None      # int64 [L, E] the device LRU's tail source (`LruState.tail`; with head)
    used: torch.Tensor | None = None      # int64 [S] bytes of each slot's expert a layer read from it (None: made here)
    done_head: torch.Tensor | None = None  # int64 [S] the copy's head items of each slot counted (None: made here)

    def __post_init__(self):
        for name in ("filled", "done", "used", "done_head"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, torch.zeros_like(self.state))
        if self.head is not None and (self.src is None or self.tail is None):
            raise ValueError("head landing needs the device LRU's fill source and tail (src, tail)")


def _word(tag, st):
    return tag * 8 + st


@triton.jit
def claim_kernel(gids_p, jj, E, state_p, where_p, assign_p, table_p, tier_p, S, cached_hi, G: tl.constexpr,
                 GB: tl.constexpr, SB: tl.constexpr):
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
    old = tl.atomic_cas(state_p + tl.where(take, got, 0), tl.where(take, 0, -1).to(tl.int64),
                        tl.where(take, at * 8 + _FILLING, -1).to(tl.int64), sem="acq_rel")
    got = tl.where(take & (old == _FREE), got, -1)
    tl.store(assign_p + gg, got.to(tl.int64), mask=mg)
    tl.store(where_p + at, got.to(tl.int64), mask=got >= 0)


@triton.jit
def copy_kernel(arena_p, gids_p, jj, E, assign_p, slot_offset_p, ram_rows_p, nbytes_p, counts_p, state_p, filled_p,
                done_p, head_p, done_head_p, n_chunks, total, P, CHUNK: tl.constexpr, SPLIT: tl.constexpr):
    # grid (P,), persistent: program p copies the items p, p + P, ... of the G x n_chunks items, item (i, b) being bytes
    # [b CHUNK, (b + 1) CHUNK) of guess i's expert into its slot, guesses in order (best first). A few programs a SM
    # reach the link's rate and leave the SMs to the main stream's kernels running beside it (a grid of every chunk
    # would hold them all). An item whose slot is no longer FILLING (resolve TAKEN it: its layer reads the expert in
    # place) is skipped: a late guess stops costing link bytes at the next chunk. Each item, copied or skipped, counts
    # itself in its slot's `done` (acq_rel: its stores before); the slot's last item publishes it at once: FILLING ->
    # READY (release), or TAKEN -> TAKEN_DONE, so the best guess is READY while the others still copy. SPLIT (head
    # landing): the items of the first head[jj, e] bytes count themselves in `done_head` too, and the last of them
    # publishes FILLING -> HEAD (release) before its `done` count, so the slot's last item finds HEAD or TAKEN
    pid = tl.program_id(0)
    for t in range(pid, total, P):                                               # total = G x n_chunks
        i = t // n_chunks
        b = t % n_chunks
        s = tl.load(assign_p + i)
        e = tl.maximum(tl.load(gids_p + i), 0)
        tag = (jj * E + e).to(tl.int64)
        filling, head_w, ready = tag * 8 + _FILLING, tag * 8 + _HEAD, tag * 8 + _READY
        live = s >= 0
        if live:
            word = tl.atomic_add(state_p + s, 0, sem="relaxed")                  # the slot's word, not a cached copy
            live = (word == filling) | (word == head_w)
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
        if s >= 0:
            if SPLIT:
                n_head = tl.cdiv(tl.load(head_p + jj * E + e), CHUNK)               # 0: the expert lands whole
                if b < n_head:
                    if tl.atomic_add(done_head_p + s, 1, sem="acq_rel") == n_head - 1:   # gate and up landed
                        tl.atomic_xchg(done_head_p + s, 0, sem="relaxed")
                        tl.atomic_cas(state_p + s, filling, head_w, sem="release")
            if tl.atomic_add(done_p + s, 1, sem="acq_rel") == n_chunks - 1:     # the slot's last item: publish
                tl.atomic_xchg(done_p + s, 0, sem="relaxed")
                old = tl.atomic_cas(state_p + s, filling, ready, sem="release")
                if SPLIT:
                    if old == head_w:                                             # its head was published first
                        if tl.atomic_cas(state_p + s, head_w, ready, sem="release") == head_w:
                            old = filling
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
                   guessed_p, ram_rows_p, head_p, tail_p, used_p, cached_hi, S, K: tl.constexpr, KB: tl.constexpr,
                   G: tl.constexpr, GB: tl.constexpr, SB: tl.constexpr, HAS_SRC: tl.constexpr, SPLIT: tl.constexpr):
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
    head_w = (at * 8 + _HEAD).to(tl.int64)
    # the copy only moves a slot forward (FILLING -> HEAD -> READY): each routed guess is taken in the state it is in,
    # READY -> CONSUMED, FILLING or HEAD -> TAKEN, one CAS a try; a try fails only when the copy moved the slot on
    # meanwhile (READY first: the common case; at most four tries)
    want = tl.where(ok, ready, -1)
    got = tl.full([KB], -1, tl.int64)                                           # the word each guess was taken in
    pend = ok
    while tl.sum(pend.to(tl.int32), 0) > 0:
        old = tl.atomic_cas(sp, tl.where(pend, want, -1), tl.where(pend, tl.where(want == ready, consumed, taken), -1),
                            sem="acq_rel")
        won = pend & (old == want)
        got = tl.where(won, want, got)
        pend = pend & (old != want) & ((old == filling) | (old == head_w) | (old == ready))
        want = tl.where(pend, old, want)
    use = got == ready
    half = got == head_w                          # head landing: gate and up from the slot, down from RAM
    n_late = tl.sum((got == filling).to(tl.int64), 0)
    n_used = tl.sum(use.to(tl.int64), 0)
    nb = tl.load(nbytes_p + at, mask=use, other=0)
    b_used = tl.sum(tl.where(use, nb, 0), 0)
    off = tl.load(slot_offset_p + tl.where(use | half, s, 0), mask=use | half, other=0)
    tl.store(table_p + at, off, mask=use)
    tl.store(used_p + tl.where(use, s, 0), nb, mask=use)
    if HAS_SRC:
        tl.store(src_p + at, off, mask=use | half)
    n_half = tl.sum(half.to(tl.int64), 0)
    if SPLIT:                                     # the cache's fill reads the head at src, the rest at tail
        hb = tl.load(head_p + at, mask=half, other=0)
        b_used += tl.sum(tl.where(half, hb, 0), 0)
        tl.store(tail_p + at, tl.load(ram_rows_p + at, mask=half, other=0), mask=half)
        tl.store(used_p + tl.where(half, s, 0), hb, mask=half)
    # the guesses of layer j still being copied that nobody routed are abandoned too: the copy stops at their next chunk
    # instead of spending the link on bytes no layer reads (the copy then marks them TAKEN_DONE, release frees them).
    # Every slot at once: one load and one CAS a lane (-1, never a word, where a lane has nothing to change)
    ss, live, w = _slot_words(state_p, S, SB)
    st = w % 8
    hit = live & ((st == _FILLING) | (st == _HEAD)) & (w // 8 // E == j)
    at = tl.where(live, ss, 0)
    tl.atomic_cas(state_p + at, tl.where(hit, w, -1), tl.where(hit, w - st + _TAKEN, -1), sem="acq_rel")
    n_guess = tl.sum((guess >= 0).to(tl.int64), 0)
    c = counts_p + j * _NC
    tl.store(c + 0, tl.load(c + 0) + n_used)
    tl.store(c + 1, tl.load(c + 1) + n_late)
    tl.store(c + 4, tl.load(c + 4) + b_used)
    tl.store(c + 6, tl.load(c + 6) + n_guess)
    tl.store(c + 7, tl.load(c + 7) + n_right)
    tl.store(c + 8, tl.load(c + 8) + tl.where(n_guess > 0, K, 0))
    tl.store(c + 9, tl.load(c + 9) + n_half)
    tl.store(guessed_p + j * G + gg, tl.full([GB], -1, tl.int64), mask=gg < G)


@triton.jit
def release_kernel(j, E, state_p, where_p, slot_offset_p, ram_rows_p, table_p, src_p, tail_p, filled_p, used_p,
                   counts_p, S, SB: tl.constexpr, HAS_SRC: tl.constexpr, SPLIT: tl.constexpr):
    # main stream, after layer j's MoE: slots of layers <= j whose copy is over back to FREE; one program, every slot
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
        if SPLIT:
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


def note_guesses(gids: torch.Tensor, jj: int, st: PrefetchState) -> None:
    """(side stream, when the guesses for layer jj are issued) Keep them for `resolve`'s precision and recall."""
    st.guessed[jj, :gids.numel()].copy_(gids.reshape(-1))


def claim(gids: torch.Tensor, jj: int, st: PrefetchState) -> None:
    E = st.table.shape[1]
    claim_kernel[(1,)](gids, jj, E, st.state, st.where, st.assign, st.table, st.tier, st.state.numel(),
                       st.cached_hi, G=gids.numel(), GB=triton.next_power_of_2(gids.numel()),
                       SB=triton.next_power_of_2(st.state.numel()), num_warps=1)


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
    split = st.head is not None
    copy_kernel[(P,)](arena, gids, jj, E, st.assign, st.slot_offset, st.ram_rows, st.nbytes, st.counts, st.state,
                      st.filled, st.done, st.head if split else st.nbytes, st.done_head, n_chunks, total, P,
                      CHUNK=COPY_CHUNK, SPLIT=split)


def resolve(ids: torch.Tensor, j: int, st: PrefetchState) -> None:
    src = st.src if st.src is not None else st.table
    G = st.guessed.shape[1]
    split = st.head is not None
    resolve_kernel[(1,)](ids.reshape(-1), j, st.table.shape[1], st.state, st.where, st.slot_offset, st.table, src,
                         st.tier, st.nbytes, st.counts, st.guessed, st.ram_rows, st.head if split else st.nbytes,
                         st.tail if split else src, st.used, st.cached_hi, st.state.numel(), K=ids.numel(),
                         KB=triton.next_power_of_2(ids.numel()), G=G, GB=triton.next_power_of_2(G),
                         SB=triton.next_power_of_2(st.state.numel()),
                         HAS_SRC=st.src is not None, SPLIT=split, num_warps=1)


def release(j: int, st: PrefetchState) -> None:
    src = st.src if st.src is not None else st.table
    split = st.head is not None
    release_kernel[(1,)](j, st.table.shape[1], st.state, st.where, st.slot_offset, st.ram_rows, st.table, src,
                         st.tail if split else src, st.filled, st.used, st.counts, st.state.numel(),
                         SB=triton.next_power_of_2(st.state.numel()), HAS_SRC=st.src is not None, SPLIT=split,
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
        if int(st.state[s]) in (_word(tag, FILLING), _word(tag, HEAD)):     # not TAKEN meanwhile
            n, a, b = int(st.nbytes[jj, e]), int(st.ram_rows[jj, e]), int(st.slot_offset[s])
            arena[b:b + n] = arena[a:a + n]
            st.filled[s] += n
            st.counts[jj, COPIED] += n
            st.state[s] = _word(tag, READY)
        else:
            st.state[s] = _word(tag, TAKEN_DONE)


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
        elif st.head is not None and w == _word(tag, HEAD):      # gate and up landed: the cache's fill reads them
            st.state[s] = _word(tag, TAKEN)
            st.src[j, e] = off
            st.tail[j, e] = st.ram_rows[j, e]
            st.used[s] = st.head[j, e]
            st.counts[j, HEAD_USED] += 1
            st.counts[j, USED_BYTES] += int(st.head[j, e])
        elif w == _word(tag, FILLING):
            st.state[s] = _word(tag, TAKEN)
            st.counts[j, LATE] += 1
    for s in range(st.state.numel()):          # unrouted guesses of layer j still copying: abandoned
        w = int(st.state[s])
        if w % 8 in (FILLING, HEAD) and w // 8 // E == j:
            st.state[s] = w - w % 8 + TAKEN


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
