"""The device loop's handshake with the NVMe stager (`engine.stager`): announce a layer's routed ids, wait only for
what is not staged, publish the layer's end.

    stage_wait(ids, j, cb)           # after layer j's router: the request row, then every routed NVMe id resident
    stage_done(j, cb, gids, gscores) # after layer j's MoE (and its lookahead gates): guesses, then "done"
    stage_wait(ids, j, cb, gids, gscores); stage_done(j, cb)   # guesses taken at the router, with the request

Stores of a program's other threads reach the release through a CTA barrier (`debug_barrier`: bar.sync, and
release is cumulative). Everything the GPU and the stager share lives in pinned host memory, reached from the arena's base pointer by byte
offsets (`ControlBlock`: the same trick as the RAM tier's in-place offsets):

    words  int64 [8]        REQ: the last request published, DONE: the last layer whose kernels finished,
                            ERR: the request that found an expert the stager could not stage (0: none),
                            ABORT: set by the host when the stager stops (closing): waits end at once (poison)
    ready  int64 [L, E]     an NVMe expert's staging address (arena-relative, a multiple of 256, negative where
                            the block lies below the arena) once it is there; -1 not staged; -2 the stager failed
                            on it (read error, short read, checksum mismatch)
    ring   int64 [R, 2 + K + G]   per request s (row s mod R): s, the layer, its K routed ids (-1 where the id
                            is not read from staging: VRAM, RAM, a cached expert), then G lookahead guesses
                            (depth-major, -1 where the stager need not read one) written by `stage_done`
    scores float32 [R, G]   the guesses' gate weights

`stage_wait` (one program): s = ++seq (a device counter); the row's ids; REQ = s with a release store at system
scope; a sequentially consistent fence at system scope; then for each routed id whose tier is NVMe and whose table
entry is not a VRAM slot (the device LRU may hold it), `ready[j, e]` is loaded with acquire semantics at system
scope until it is not -1, and written into the table (and into `src`, the LRU fill's source). With the device LRU
it runs after the LRU step, so an expert the step admits (its entry now a VRAM slot, filled from `src` after this
kernel) or evicts (its entry back to a possibly stale staging address) is read from staging too. The fence pairs with
the stager's: it sets `ready` of a victim to -1, fences, then reads REQ and the outstanding row; so either the
stager sees this request (and keeps the slot) or this kernel sees -1 (and waits for the expert to be staged again):
a slot is never rewritten while a kernel may read it. `stage_done` writes the guesses, then DONE = s (release):
after it the stager may reuse the slots this request read. A timeout (`timeout_ns`, or `max_spins` polls) or a -2
points the entry at the poison slot (NaN scales) and sets ERR; the host raises the stager's one-line error before
the token reaches the user. Counters `counts [L, 4]`: staged uses (read from pinned staging), their bytes, uses
that waited, nanoseconds waited (GPU globaltimer).

On the GPU the system-scope loads, stores and fence are inline PTX; under TRITON_INTERPRET=1 (one program at a
time on the CPU, memory shared with the stager's thread) they are volatile loads and plain stores.
`reference_wait` / `reference_done` are the same in plain Python (the CPU engine's path; the kernels are tested
against them).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .triton_common import INTERPRET, tl, triton

REQ, DONE, ERR, ABORT = 0, 1, 2, 3
NOT_STAGED, FAILED = -1, -2
NVME = 2                       # tier code in `tier [L, E]` (0 VRAM, 1 RAM, 2 NVMe)
USES, BYTES, WAITED, WAIT_NS = range(4)
TIMEOUT_NS = 60 * 10 ** 9      # a GPU waits at most this long for one expert (then: poison, ERR)
INTERPRETED_SPINS = 200_000    # the interpreter has no clock: at most this many polls stand in for the timeout


@dataclass(frozen=True)
class ControlBlock:
    """What `stage_wait` / `stage_done` need: device tensors and the pinned block's offsets from the arena."""

    seq: torch.Tensor          # int64 [1] on the device: requests made so far
    tier: torch.Tensor         # int8 [L, E] on the device
    table: torch.Tensor        # int64 [L, E] on the device: the offsets fused_moe reads
    src: torch.Tensor | None   # int64 [L, E] on the device: the device LRU's fill source (None without a cache)
    admit: torch.Tensor | None # int64 [L, K] on the device: the LRU step's admissions (slot offset or -1)
    nbytes: torch.Tensor       # int64 [L, E] on the device
    counts: torch.Tensor       # int64 [L, 4] on the device
    words_at: int              # arena-relative byte offsets of the pinned words, ready table, ring, scores
    ready_at: int
    ring_at: int
    scores_at: int
    rows: int                  # R
    guesses: int               # G
    cached_hi: int             # table entries in [0, cached_hi) are VRAM (static or a cache slot)
    poison: int                # the poison slot's offset


@triton.jit
def _addr(p):
    return p.to(tl.int64)


@triton.jit
def _ld_acquire_sys(p, GPU: tl.constexpr):
    # p: int64 pointers; acquire loads at system scope (the stager's stores over PCIe)
    if GPU:
        return tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [_addr(p)],
                                         dtype=tl.int64, is_pure=False, pack=1)
    else:
        return tl.load(p, volatile=True)


@triton.jit
def _st_release_sys(p, v, GPU: tl.constexpr):
    # one int64 store with release semantics at system scope (orders the stores before it, host-visible)
    if GPU:
        tl.inline_asm_elementwise("st.release.sys.global.b64 [$1], $2;\n\tmov.b32 $0, 0;", "=r,l,l", [_addr(p), v],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.store(p, v)


@triton.jit
def _fence_sc_sys(v, GPU: tl.constexpr):
    # a sequentially consistent fence at system scope; v (int64 scalar) passed through to order it by data
    if GPU:
        return tl.inline_asm_elementwise("fence.sc.sys;\n\tmov.b64 $0, $1;", "=l,l", [v], dtype=tl.int64,
                                         is_pure=False, pack=1)
    else:
        return v


@triton.jit
def _now_ns(v, GPU: tl.constexpr):
    # GPU global timer in ns (v: any int64 scalar, for the data dependence); the interpreter: 0
    if GPU:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,l", [v], dtype=tl.int64,
                                         is_pure=False, pack=1)
    else:
        return v * 0


@triton.jit
def _write_guesses(arena_p, s, gids_p, gscores_p, j, L, E, tier_p, table_p, ring_at, scores_at, R, cached_hi,
                   K: tl.constexpr, G: tl.constexpr, W: tl.constexpr, GB: tl.constexpr):
    # request s's guesses into its ring row: gids_p int64 [G] for layers j+1..j+G/W, W each (-1 padded), and their
    # scores float32 [G]; a guess the stager need not read (not NVMe, in a VRAM slot now, past the last layer) is -1
    g = tl.arange(0, GB)
    m = g < G
    jj = j + 1 + g // W
    gid = tl.load(gids_p + g, mask=m, other=-1)
    ok = m & (gid >= 0) & (jj < L)
    at = tl.where(ok, jj * E + gid, 0)
    cur = tl.load(table_p + at, mask=ok, other=0)
    ok = ok & (tl.load(tier_p + at, mask=ok, other=0) == 2) & ((cur < 0) | (cur >= cached_hi))
    row = (arena_p + ring_at).to(tl.pointer_type(tl.int64)) + (s % R) * (2 + K + G)
    tl.store(row + 2 + K + g, tl.where(ok, gid, -1), mask=m)
    sc = (arena_p + scores_at).to(tl.pointer_type(tl.float32)) + (s % R) * G
    tl.store(sc + g, tl.load(gscores_p + g, mask=m, other=0.0), mask=m)


@triton.jit
def stage_wait_kernel(arena_p, ids_p, j, L, E, seq_p, tier_p, table_p, src_p, admit_p, nbytes_p, counts_p, words_at,
                      ready_at, ring_at, scores_at, R, cached_hi, poison, timeout_ns, max_spins, gids_p, gscores_p,
                      K: tl.constexpr, KB: tl.constexpr, G: tl.constexpr, W: tl.constexpr, GB: tl.constexpr,
                      HAS_SRC: tl.constexpr, HAS_ADMIT: tl.constexpr, HAS_GUESS: tl.constexpr, GPU: tl.constexpr):
    # ids_p: int64 [K] layer j's routed ids; one program, KB >= K lanes. With the device LRU (HAS_ADMIT) this runs
    # after its step: an id is read from staging when its table entry is not VRAM, or when the step admitted it
    # (admit_p [L, K] >= 0: the fill copies it from src)
    kk = tl.arange(0, KB)
    m = kk < K
    ids = tl.load(ids_p + kk, mask=m, other=0)                                  # [KB]
    words = (arena_p + words_at).to(tl.pointer_type(tl.int64))
    ready = (arena_p + ready_at).to(tl.pointer_type(tl.int64))
    nvme = tl.load(tier_p + j * E + ids, mask=m, other=0) == 2
    cur = tl.load(table_p + j * E + ids, mask=m, other=0)
    off_vram = (cur < 0) | (cur >= cached_hi)
    if HAS_ADMIT:
        admitted = tl.load(admit_p + j * K + kk, mask=m, other=-1) >= 0
    else:
        admitted = m & False
    need = m & nvme & (off_vram | admitted)                                     # read from staging
    s = tl.load(seq_p) + 1
    tl.store(seq_p, s)
    row = (arena_p + ring_at).to(tl.pointer_type(tl.int64)) + (s % R) * (2 + K + G)
    tl.store(row, s)
    tl.store(row + 1, s * 0 + j)
    tl.store(row + 2 + kk, tl.where(need, ids, -1), mask=m)                     # the ids read from staging
    if HAS_GUESS:                                          # guesses taken at this layer's router go with its request
        _write_guesses(arena_p, s, gids_p, gscores_p, j, L, E, tier_p, table_p, ring_at, scores_at, R, cached_hi,
                       K, G, W, GB)
    tl.debug_barrier()                                                          # every thread's row stores first
    _st_release_sys(words + 0, s, GPU)                                          # REQ = s: the request is out
    s = _fence_sc_sys(s, GPU)
    where = ready + j * E + tl.where(need, ids, 0)
    v = tl.where(need, _ld_acquire_sys(where, GPU), 0)
    waited = need & (v == -1)
    t0 = _now_ns(s, GPU)
    t = t0
    spins = s * 0
    stop = s * 0
    missing = tl.sum((need & (v == -1)).to(tl.int32), 0) > 0
    while missing & (t - t0 < timeout_ns) & (spins < max_spins) & (stop == 0):
        v = tl.where(need, _ld_acquire_sys(where, GPU), 0)
        stop = tl.max(_ld_acquire_sys(words + 3 + kk * 0, GPU), 0)     # ABORT: the host stopped the stager
        t = _now_ns(s, GPU)
        spins += 1
        missing = tl.sum((need & (v == -1)).to(tl.int32), 0) > 0
    # failed, or still missing: the two sentinels, never an address (those are multiples of 256, and negative where
    # the pinned block lies below the arena)
    bad = need & ((v == -1) | (v == -2))
    off = tl.where(bad, poison, v)
    tl.store(table_p + j * E + ids, off, mask=need & off_vram)
    if HAS_SRC:
        tl.store(src_p + j * E + ids, off, mask=need)
    nb = tl.load(nbytes_p + j * E + ids, mask=need, other=0)
    c = counts_p + j * 4
    tl.store(c + 0, tl.load(c + 0) + tl.sum(need.to(tl.int64), 0))
    tl.store(c + 1, tl.load(c + 1) + tl.sum(nb, 0))
    tl.store(c + 2, tl.load(c + 2) + tl.sum(waited.to(tl.int64), 0))
    tl.store(c + 3, tl.load(c + 3) + (t - t0))
    if (tl.sum(bad.to(tl.int32), 0) > 0) & (stop == 0):                        # (aborted: no error to report)
        tl.debug_barrier()
        _st_release_sys(words + 2, s, GPU)                                      # ERR = s


@triton.jit
def stage_done_kernel(arena_p, seq_p, gids_p, gscores_p, j, L, E, tier_p, table_p, words_at, ring_at, scores_at, R,
                      cached_hi, K: tl.constexpr, G: tl.constexpr, W: tl.constexpr, GB: tl.constexpr,
                      HAS_GUESS: tl.constexpr, GPU: tl.constexpr):
    # gids_p: int64 [G] guesses for layers j+1..j+G/W, W each (-1 padded), gscores_p: float32 [G]; one program.
    # A guess the stager need not read (not NVMe, or in a VRAM slot now, or past the last layer) is written as -1.
    s = tl.load(seq_p)
    words = (arena_p + words_at).to(tl.pointer_type(tl.int64))
    if HAS_GUESS:
        _write_guesses(arena_p, s, gids_p, gscores_p, j, L, E, tier_p, table_p, ring_at, scores_at, R, cached_hi,
                       K, G, W, GB)
    tl.debug_barrier()                                      # the guesses (and the MoE kernels before) come first
    _st_release_sys(words + 1, s, GPU)                                          # DONE = s


def stage_wait(arena: torch.Tensor, ids: torch.Tensor, j: int, cb: ControlBlock, max_spins: int = 1 << 62,
               gids: torch.Tensor | None = None, gscores: torch.Tensor | None = None, per_layer: int = 1) -> None:
    """Layer j's request and wait (graph-safe: one launch). ids int64 [1, K] or [K]. `gids` / `gscores` (int64 /
    float32 [G], `per_layer` for each of layers j+1, j+2, ...): guesses taken at this layer's router, written into the
    request's row before it is published (then `stage_done` carries none)."""
    L, E = cb.table.shape
    K = ids.numel()
    src = cb.src if cb.src is not None else cb.table
    admit = cb.admit if cb.admit is not None else cb.table
    has = gids is not None and cb.guesses > 0
    G = cb.guesses                                     # the row's width: the block's layout (0 without lookahead)
    stage_wait_kernel[(1,)](arena, ids.reshape(-1), j, L, E, cb.seq, cb.tier, cb.table, src, admit, cb.nbytes,
                            cb.counts, cb.words_at, cb.ready_at, cb.ring_at, cb.scores_at, cb.rows, cb.cached_hi,
                            cb.poison, TIMEOUT_NS, min(max_spins, INTERPRETED_SPINS) if INTERPRET else max_spins,
                            gids.reshape(-1) if has else cb.seq, gscores.reshape(-1) if has else cb.seq,
                            K=K, KB=triton.next_power_of_2(K), G=G, W=per_layer, GB=triton.next_power_of_2(max(G, 1)),
                            HAS_SRC=cb.src is not None, HAS_ADMIT=cb.admit is not None, HAS_GUESS=has,
                            GPU=not INTERPRET, num_warps=1)


def stage_done(arena: torch.Tensor, j: int, cb: ControlBlock, K: int, gids: torch.Tensor | None = None,
               gscores: torch.Tensor | None = None, per_layer: int = 1) -> None:
    """Layer j's end: its guesses (int64 [G], float32 [G], `per_layer` for each of layers j+1, j+2, ...; None: none)
    into the row, then DONE. Graph-safe."""
    has = gids is not None and cb.guesses > 0
    dummy = cb.seq
    L, E = cb.table.shape
    stage_done_kernel[(1,)](arena, cb.seq, gids.reshape(-1) if has else dummy, gscores.reshape(-1) if has else dummy,
                            j, L, E, cb.tier, cb.table, cb.words_at, cb.ring_at, cb.scores_at, cb.rows, cb.cached_hi,
                            K=K, G=max(cb.guesses, 1), W=per_layer, GB=triton.next_power_of_2(max(cb.guesses, 1)),
                            HAS_GUESS=has, GPU=not INTERPRET, num_warps=1)


# ---- the pinned block ------------------------------------------------------------------------------------
@dataclass
class HostViews:
    """The pinned block seen from the host (numpy views): what the reference and the stager read and write."""

    words: np.ndarray          # int64 [8]
    ready: np.ndarray          # int64 [L, E]
    ring: np.ndarray           # int64 [R, 2 + K + G]
    scores: np.ndarray         # float32 [R, G]


def block_layout(L: int, E: int, K: int, G: int, R: int) -> dict[str, int]:
    """Byte offsets of the words, ready table, ring and scores inside the pinned block, and its size (each part
    on a 256-byte boundary: the words and the ring share no cache line with the ready table)."""
    out, at = {}, 0
    for name, n in (("words", 8 * 8), ("ready", L * E * 8), ("ring", R * (2 + K + G) * 8), ("scores", R * G * 4)):
        out[name] = at
        at += -(-max(n, 8) // 256) * 256
    out["size"] = at
    return out


def host_views(block: torch.Tensor, L: int, E: int, K: int, G: int, R: int) -> HostViews:
    """Numpy views of a pinned uint8 CPU block laid out by `block_layout`, initialised: nothing requested, nothing
    staged (ready -1)."""
    lay = block_layout(L, E, K, G, R)
    a = block.numpy()
    view = lambda name, dt, shape: a[lay[name]:lay[name] + int(np.prod(shape)) * np.dtype(dt).itemsize] \
        .view(dt).reshape(shape)       # noqa: E731
    hv = HostViews(view("words", np.int64, (8,)), view("ready", np.int64, (L, E)),
                   view("ring", np.int64, (R, 2 + K + G)), view("scores", np.float32, (R, G)))
    hv.words[:] = 0
    hv.ready[:] = NOT_STAGED
    hv.ring[:] = -1
    hv.scores[:] = 0.0
    return hv


# ---- the plain reference (the CPU engine's path; the kernels are held to it) -------------------------------

def reference_wait(ids: torch.Tensor, j: int, cb: ControlBlock, hv: HostViews, timeout_s: float = 60.0,
                   max_spins: int = 1 << 62, gids: torch.Tensor | None = None, gscores: torch.Tensor | None = None,
                   per_layer: int = 1) -> None:
    ids = [int(e) for e in ids.reshape(-1).tolist()]
    K = len(ids)
    admitted = [cb.admit is not None and int(cb.admit[j, i]) >= 0 for i in range(len(ids))]
    need = [e for e, a in zip(ids, admitted) if int(cb.tier[j, e]) == NVME and (a or not _in_vram(cb, j, e))]
    s = int(cb.seq[0]) + 1
    cb.seq[0] = s
    row = hv.ring[s % cb.rows]
    row[0], row[1] = s, j
    row[2:2 + K] = [e if e in need else -1 for e in ids]
    if gids is not None and cb.guesses > 0:
        _reference_guesses(s, j, cb, hv, K, gids, gscores, per_layer)
    hv.words[REQ] = s
    t0 = time.perf_counter_ns()
    waited, spins, got = 0, 0, {}
    for e in need:
        v = int(hv.ready[j, e])
        waited += v == NOT_STAGED
        while (v == NOT_STAGED and time.perf_counter_ns() - t0 < timeout_s * 1e9 and spins < max_spins
               and not hv.words[ABORT]):
            time.sleep(0)
            spins += 1
            v = int(hv.ready[j, e])
        got[e] = v
    bad = False
    aborted = bool(hv.words[ABORT])
    for e, v in got.items():
        off = cb.poison if v in (NOT_STAGED, FAILED) else v
        bad |= v in (NOT_STAGED, FAILED)
        if not _in_vram(cb, j, e):
            cb.table[j, e] = off
        if cb.src is not None:
            cb.src[j, e] = off
    c = cb.counts[j]
    c[USES] += len(need)
    c[BYTES] += sum(int(cb.nbytes[j, e]) for e in need)
    c[WAITED] += waited
    c[WAIT_NS] += time.perf_counter_ns() - t0 if waited else 0
    if bad and not aborted:
        hv.words[ERR] = s


def _in_vram(cb: ControlBlock, j: int, e: int) -> bool:
    return 0 <= int(cb.table[j, e]) < cb.cached_hi


def _staged_tier(cb: ControlBlock, j: int, e: int) -> bool:
    """(layer j, expert e) is read from staging: NVMe tier, not in a VRAM slot."""
    return int(cb.tier[j, e]) == NVME and not _in_vram(cb, j, e)


def reference_done(j: int, cb: ControlBlock, hv: HostViews, K: int, gids: torch.Tensor | None = None,
                   gscores: torch.Tensor | None = None, per_layer: int = 1) -> None:
    s = int(cb.seq[0])
    if gids is not None and cb.guesses > 0:
        _reference_guesses(s, j, cb, hv, K, gids, gscores, per_layer)
    hv.words[DONE] = s


def _reference_guesses(s: int, j: int, cb: ControlBlock, hv: HostViews, K: int, gids: torch.Tensor,
                       gscores: torch.Tensor, per_layer: int) -> None:
    """Request s's guesses into its ring row (`_write_guesses`)."""
    L = cb.table.shape[0]
    g = [int(e) for e in gids.reshape(-1).tolist()]
    keep = [e if e >= 0 and j + 1 + i // per_layer < L and _staged_tier(cb, j + 1 + i // per_layer, e) else -1
            for i, e in enumerate(g)]
    hv.ring[s % cb.rows, 2 + K:2 + K + cb.guesses] = keep
    hv.scores[s % cb.rows] = gscores.reshape(-1).float().cpu().numpy()


# ---- a block to time the handshake on (profiler.gpu.stage_layer_us) ----------------------------------------

PROBE_STAGED = 1 << 30          # the arena-relative address every probe expert is published at (never dereferenced)


def probe_block(L: int, E: int, K: int, G: int, R: int, device) -> tuple[torch.Tensor, ControlBlock, HostViews,
                                                                           torch.Tensor]:
    """(arena, control block, host views, the pinned block) for timing `stage_wait` / `stage_done` with nothing to
    wait for: L layers of E experts, every one on NVMe and published as staged (`ready` = PROBE_STAGED), none in
    VRAM, top-K, G guesses a layer, R ring rows. On a GPU the block is pinned host memory reached from a small
    device arena by its offset (unified addressing), as the engine lays them out; on a CPU one buffer holds both."""
    lay = block_layout(L, E, K, G, R)
    poison = 0                                  # the arena's only slot: table entries at or past it are not VRAM
    if torch.device(device).type == "cuda":
        arena = torch.zeros(4096, dtype=torch.uint8, device=device)
        block = torch.zeros(lay["size"], dtype=torch.uint8, pin_memory=True)
        base = block.data_ptr() - arena.data_ptr()
    else:
        arena = torch.zeros(4096 + lay["size"], dtype=torch.uint8)
        block, base = arena[4096:], 4096
    hv = host_views(block, L, E, K, G, R)
    hv.ready[:] = PROBE_STAGED
    i64 = dict(dtype=torch.int64, device=device)
    cb = ControlBlock(seq=torch.zeros(1, **i64), tier=torch.full((L, E), NVME, dtype=torch.int8, device=device),
                      table=torch.full((L, E), PROBE_STAGED, **i64), src=None, admit=None,
                      nbytes=torch.full((L, E), 4096, **i64), counts=torch.zeros((L, 4), **i64),
                      words_at=base + lay["words"], ready_at=base + lay["ready"], ring_at=base + lay["ring"],
                      scores_at=base + lay["scores"], rows=R, guesses=G, cached_hi=poison, poison=poison)
    return arena, cb, hv, block
