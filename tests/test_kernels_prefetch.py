"""The device loop's lookahead prefetch (kernels/prefetch.py): the slot protocol's kernels (interpreted on a CPU,
compiled on a GPU) against the plain reference, state for state, in the orders the two streams can interleave."""
from __future__ import annotations

import pytest
import torch

from strata_plan.kernels import prefetch as pf

L, E, K, S = 3, 16, 4, 3
BLOB = 2 * pf.COPY_CHUNK + 8192                # three chunks of the copy, the last one partial
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
C = 2                                           # device LRU slots a layer (resolve_step's test)
CACHE_AT = 8 * 4096 + S * BLOB                  # the LRU's slots, after the static experts and the staging slots
VRAM = CACHE_AT + L * C * BLOB + 4096           # ... and the poison slot
POISON = VRAM - 4096


CHUNK = pf.COPY_CHUNK
NCH = 3                                         # the copy's chunks a slot


def _setup(with_src: bool = False, partial: tuple[int, ...] | None = None):
    """(arena, state): experts 0-3 static, 4-11 in pinned RAM (each a distinct byte pattern), 12-15 NVMe; three
    staging slots after the static experts, then the device LRU's (`CACHE_AT`). The "RAM" lies in the same buffer past
    the VRAM part."""
    ram_at = VRAM
    arena = torch.zeros(VRAM + L * E * BLOB, dtype=torch.uint8)
    tier = torch.zeros((L, E), dtype=torch.int8)
    tier[:, 4:12] = 1
    tier[:, 12:] = 2
    rows = torch.full((L, E), POISON, dtype=torch.int64)
    rows[:, :4] = torch.arange(4) * 4096
    for j in range(L):
        for e in range(4, 12):
            at = ram_at + (j * E + e) * BLOB
            rows[j, e] = at
            arena[at:at + BLOB] = (j * E + e) % 251 + 1
    arena = arena.to(DEV)
    d = lambda t: t.to(DEV)                    # noqa: E731
    st = pf.PrefetchState(state=d(torch.zeros(S, dtype=torch.int64)),
                          slot_offset=d(torch.tensor([8 * 4096 + i * BLOB for i in range(S)])),
                          where=d(torch.full((L, E), -1, dtype=torch.int64)), assign=d(torch.full((K,), -1)),
                          ram_rows=d(rows), tier=d(tier), nbytes=d(torch.full((L, E), BLOB)), table=d(rows.clone()),
                          src=d(rows.clone()) if with_src or partial else None,
                          counts=d(torch.zeros((L, pf.N_COUNTS), dtype=torch.int64)),
                          cached_hi=POISON, guessed=d(torch.full((L, K), -1, dtype=torch.int64)),
                          **(dict(landed=d(torch.zeros((S, NCH), dtype=torch.int32)),
                                  partial=d(torch.tensor(partial, dtype=torch.int8)), tail=d(torch.full((L, E), -1)),
                                  split=d(torch.zeros((L, E), dtype=torch.int64))) if partial else {}))
    return arena, st


def _land_first_chunk(arena, g, jj, st):
    """The copy of guess g[0] cut short after its first chunk: the kernel's first item alone (its count of items put
    back, as if the rest never ran)."""
    pf.copy_kernel[(1,)](arena, g, jj, E, st.assign, st.slot_offset, st.ram_rows, st.nbytes, st.counts, st.state,
                         st.filled, st.done, st.landed, NCH, 1, 1, CHUNK=CHUNK, PARTIAL=True)
    st.done.zero_()


def _reference_land_first_chunk(arena, g, jj, st):
    e = int(g[0])
    s = int(st.assign[0])                      # (no slot: the kernel's item copies nothing)
    if s < 0:
        return
    a, b = int(st.ram_rows[jj, e]), int(st.slot_offset[s])
    arena[b:b + CHUNK] = arena[a:a + CHUNK]
    st.filled[s] += CHUNK
    st.counts[jj, pf.COPIED] += CHUNK
    st.landed[s, 0] = 1


def _claim(claim):
    def run(a, g, jj, st):
        pf.note_guesses(g, jj, st)
        claim(g, jj, st)
    return run


KERNELS = {"claim": _claim(pf.claim), "copy": lambda a, g, jj, st: pf.copy(a, g, jj, st, BLOB),
           "land": _land_first_chunk,
           "resolve": lambda a, ids, j, st: pf.resolve(ids, j, st), "release": lambda a, _, j, st: pf.release(j, st)}
REFERENCE = {"claim": _claim(pf.reference_claim), "land": _reference_land_first_chunk,
             "copy": lambda a, g, jj, st: pf.reference_copy(a, g, jj, st),
             "resolve": lambda a, ids, j, st: pf.reference_resolve(ids, j, st),
             "release": lambda a, _, j, st: pf.reference_release(j, st)}


def _play(steps, with_src=False, partial=None):
    """Both implementations through the same steps [(name, ids, layer)]; their states after each step must agree."""
    runs = []
    for impl in (KERNELS, REFERENCE):
        arena, st = _setup(with_src, partial)
        trace = []
        for name, ids, j in steps:
            impl[name](arena, torch.tensor(ids, device=DEV), j, st)
            if DEV.type == "cuda":
                torch.cuda.synchronize()
            trace.append((st.state.tolist(), st.where.tolist(), st.table.tolist(),
                          None if st.src is None else st.src.tolist(), st.counts.tolist(),
                          st.used.tolist(), st.filled.tolist(),
                          *([st.landed.tolist(), st.tail.tolist(), st.split.tolist()] if partial else [])))
        runs.append((trace, arena, st))
    (kt, ka, _), (rt, ra, _) = runs
    for step, (a, b) in enumerate(zip(kt, rt)):
        assert a == b, steps[step]
    assert torch.equal(ka, ra)
    return runs[1][2], runs[1][1]


def test_a_guess_landed_in_time_is_read_from_its_slot_then_freed():
    g = [5, 2, 13, 7]                       # RAM, static (skipped), NVMe (skipped), RAM
    st, arena = _play([("claim", g, 1), ("copy", g, 1), ("resolve", [5, 0, 9, 12], 1),
                       ("release", [], 1)])
    # 5 was used from its slot (then freed); 7 was guessed and not routed: wasted; 9 not guessed: in place
    assert st.counts[1].tolist() == [1, 0, 1, 2 * BLOB, BLOB, BLOB, 4, 1, 4, 0]    # 4 guesses, 1 right
    assert st.state.tolist() == [pf.FREE] * S and (st.where == -1).all()
    assert torch.equal(st.table, st.ram_rows)           # every entry back to pinned RAM


def test_during_the_layer_the_table_points_at_the_slot_and_the_slot_holds_the_expert():
    g = [6, -1, -1, -1]
    st, arena = _play([("claim", g, 2), ("copy", g, 2), ("resolve", [6, 1, 2, 3], 2)],
                      with_src=True)
    off = int(st.table[2, 6])
    assert off == int(st.slot_offset[0]) == int(st.src[2, 6])
    a = int(st.ram_rows[2, 6])
    assert torch.equal(arena[off:off + BLOB], arena[a:a + BLOB])


def test_a_guess_still_copying_is_taken_and_read_in_place_never_waited_for():
    """Resolve finds 4 claimed and not landed (its copy not over): TAKEN, read in place; release leaves its slot until
    the copy is over (TAKEN_DONE), the next release frees it. 8, guessed and not routed, is abandoned alike."""
    g = [4, 8, -1, -1]
    st, _ = _play([("claim", g, 0), ("resolve", [4, 9, 1, 2], 0),                   # the copy not over yet
                   ("release", [], 0),                                              # 4 and 8 TAKEN: not freed
                   ("copy", g, 0),                                                  # skipped: both TAKEN_DONE
                   ("release", [], 0)])
    assert st.counts[0].tolist() == [0, 1, 2, 0, 0, 0, 2, 1, 4, 0]                 # 4 late, 4 and 8 unused
    assert st.state.tolist() == [pf.FREE] * S and torch.equal(st.table, st.ram_rows)


def test_slots_run_out_and_guesses_of_a_later_layer_outlive_an_earlier_release():
    g1, g2 = [4, 5, 6, 7], [8, 9, -1, -1]
    st, _ = _play([("claim", g1, 1), ("copy", g1, 1),     # 3 slots: the 4th guess gets none
                   ("release", [], 0),                                          # layer 0 done: layer 1's stay
                   ("resolve", [4, 5, 6, 7], 1), ("release", [], 1),
                   ("claim", g2, 2), ("copy", g2, 2), ("release", [], 2)])
    assert st.counts[1].tolist() == [3, 0, 0, 3 * BLOB, 3 * BLOB, 0, 4, 4, 4, 0]
    assert st.counts[2].tolist() == [0, 0, 2, 2 * BLOB, 0, 2 * BLOB, 0, 0, 0, 0]     # layer 2 never resolved


def test_a_claim_takes_the_free_slots_in_order_skipping_twins_static_and_claimed_experts():
    """The vector claim against the reference's one slot after another: a slot still held by a later layer's guess
    is passed over, a repeated guess, a static expert (2), an NVMe one (13) and an expert already claimed get none."""
    st, _ = _play([("claim", [6, -1, -1, -1], 2),                          # slot 0 held by layer 2's guess
                   ("claim", [5, 5, 2, 13], 1), ("claim", [7, 6, 8, 9], 1)])
    assert st.assign.tolist() == [2, -1, -1, -1] and st.where[1, 5].item() == 1 and st.where[2, 6].item() == 0


def test_a_guess_taken_before_its_copy_is_not_copied():
    """Resolve takes a guess whose copy has not started (its layer reads it in place) and abandons the guess nobody
    routed: the copy skips both, so neither slot is written and no byte crosses the link for them."""
    g = [4, 8, -1, -1]
    st, arena = _play([("claim", g, 0), ("resolve", [4, 9, 1, 2], 0),      # 4 TAKEN, 8 abandoned before any copy
                       ("copy", g, 0), ("release", [], 0)])
    assert st.counts[0].tolist() == [0, 1, 2, 0, 0, 0, 2, 1, 4, 0]             # 4 late; both unused, nothing copied
    for slot in st.slot_offset[:2].tolist():                                # 4's and 8's slots (claimed first)
        assert int(arena[slot:slot + BLOB].sum()) == 0
    assert st.state.tolist() == [pf.FREE] * S and st.filled.tolist() == [0] * S


def test_only_the_resolved_layers_guesses_are_abandoned():
    """Layer 2's guess, claimed and not yet copied when layer 1 runs, is left alone: it is copied and serves layer 2."""
    g2 = [5, -1, -1, -1]
    st, _ = _play([("claim", g2, 2), ("resolve", [4, 9, 1, 2], 1), ("copy", g2, 2),
                   ("release", [], 1), ("resolve", [5, 1, 2, 3], 2), ("release", [], 2)])
    assert st.counts[2].tolist() == [1, 0, 0, BLOB, BLOB, 0, 1, 1, 4, 0]       # 5 copied and used


def test_a_late_guess_serves_the_part_that_landed_to_the_cache_fill():
    """Partial landing: resolve finds 5 still copying with its first chunk landed: TAKEN, the cache's fill source
    points at the slot for those bytes (split) and at RAM for the rest (tail), the table stays at RAM (read in place if
    the cache does not admit it), the copy skips the rest; once it is over, release frees the slot and puts the
    sources back; the landed bytes count as used, not wasted. 7, guessed and not routed, is abandoned."""
    g = [5, 7, -1, -1]
    st, arena = _play([("claim", g, 1), ("land", g, 1), ("resolve", [5, 1, 2, 3], 1)], partial=(1, 1, 1))
    s = int(st.where[1, 5])
    assert st.state[s] == pf._word(1 * E + 5, pf.TAKEN) and int(st.src[1, 5]) == int(st.slot_offset[s])
    assert int(st.tail[1, 5]) == int(st.ram_rows[1, 5]) == int(st.table[1, 5])
    assert int(st.split[1, 5]) == int(st.used[s]) == CHUNK
    st, arena = _play([("claim", g, 1), ("land", g, 1), ("resolve", [5, 1, 2, 3], 1), ("copy", g, 1),
                       ("release", [], 1)], partial=(1, 1, 1))
    assert st.counts[1].tolist() == [0, 0, 1, CHUNK, CHUNK, 0, 2, 1, 4, 1]
    assert st.state.tolist() == [pf.FREE] * S and torch.equal(st.src, st.ram_rows) and (st.tail == -1).all()


def test_a_layer_without_a_cache_reads_a_late_guess_in_place_in_full():
    g = [5, -1, -1, -1]
    st, _ = _play([("claim", g, 1), ("land", g, 1), ("resolve", [5, 1, 2, 3], 1), ("copy", g, 1),
                   ("release", [], 1)], partial=(1, 0, 1))
    assert st.counts[1].tolist() == [0, 1, 1, CHUNK, 0, CHUNK, 1, 1, 4, 0]      # late; its chunk wasted
    assert (st.tail == -1).all() and torch.equal(st.src, st.ram_rows)


def test_the_copy_marks_the_chunks_it_moves_and_a_claim_clears_them():
    """A whole copy marks its three chunks landed; after the slot is freed, the next claim of it clears them before
    the slot is FILLING again, so a late guess never takes another claim's bytes for its own."""
    g1, g2 = [5, -1, -1, -1], [9, -1, -1, -1]
    st, _ = _play([("claim", g1, 1), ("copy", g1, 1), ("resolve", [5, 1, 2, 3], 1), ("release", [], 1),
                   ("claim", g2, 2), ("resolve", [9, 1, 2, 3], 2), ("copy", g2, 2), ("release", [], 2)],
                  partial=(1, 1, 1))
    assert st.counts[1].tolist() == [1, 0, 0, BLOB, BLOB, 0, 1, 1, 4, 0]
    assert st.counts[2].tolist() == [0, 1, 1, 0, 0, 0, 1, 1, 4, 0]             # late: nothing landed, nothing used
    assert st.landed.tolist()[0] == [0] * NCH


def test_resolve_and_the_lru_step_in_one_launch_are_the_two_references():
    """`resolve_step` (one launch: resolve, then the device LRU's step on the same table and fill source) leaves
    both states as `reference_resolve` then `lru.reference_step` do, token after token, landed and late guesses and
    partial landing included, and the LRU's fill then copies the same bytes into its slots."""
    from strata_plan.kernels import lru
    runs = []
    for fused in (True, False):
        arena, st = _setup(partial=(1, 1, 1))
        offs = torch.tensor([[CACHE_AT + (j * C + c) * BLOB for c in range(C)] for j in range(L)])
        cache = lru.LruState(slot_expert=torch.full((L, C), -1), slot_stamp=torch.full((L, C), -1), slot_offset=offs,
                             n_slots=torch.full((L,), C), static=(st.tier == 0).to(torch.int8).cpu(),
                             ram_offset=st.src.cpu(), nbytes=st.nbytes.cpu(), table=st.table.cpu(),
                             admit=torch.full((L, K), -1), tick=torch.zeros(L, dtype=torch.int64),
                             counts=torch.zeros((L, 4), dtype=torch.int64), tail=st.tail.cpu(), split=st.split.cpu())
        cache = lru.LruState(**{f: (v.to(DEV) if f not in ("ram_offset", "table", "nbytes", "tail", "split") else
                                    getattr(st, {"ram_offset": "src"}.get(f, f)))
                                 for f, v in vars(cache).items()})
        trace = []
        for t, (g, ids) in enumerate([([5, 7, -1, -1], [5, 9, 1, 2]), ([6, 9, -1, -1], [6, 9, 0, 3]),
                                      ([4, 5, -1, -1], [4, 8, 5, 1])]):
            gg, rr = torch.tensor(g, device=DEV), torch.tensor(ids, device=DEV)
            (_claim(pf.claim) if fused else _claim(pf.reference_claim))(arena, gg, 1, st)
            if t == 1:                                          # the second token's copy is cut short
                (_land_first_chunk if fused else _reference_land_first_chunk)(arena, gg, 1, st)
            else:
                pf.copy(arena, gg, 1, st, BLOB) if fused else pf.reference_copy(arena, gg, 1, st)
            (pf.resolve_step if fused else pf.reference_resolve_step)(rr, 1, st, cache)
            trace.append([x.tolist() for x in (st.src, st.tail, st.split, cache.admit)])    # what the fill reads
            lru.fill_slots(arena, rr, 1, cache, BLOB) if fused else lru.reference_fill(arena, rr, 1, cache)
            (pf.release if fused else pf.reference_release)(1, st)
            if fused and DEV.type == "cuda":
                torch.cuda.synchronize()
            trace.append([x.tolist() for x in (st.state, st.table, st.src, st.counts, st.tail, st.split, cache.admit,
                                               cache.slot_expert, cache.counts)])
        runs.append((trace, arena.cpu()))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])
    assert runs[1][0][-1][3][1][pf.PART_USED] == 1 and runs[1][0][-1][8][1][lru.MISS] > 0


def test_the_profilers_probe_states_run_the_fused_and_the_plain_step():
    """`probe_state` + `probe_cache` (what `profiler.gpu.lookahead_layer_us` times): resolve_step and the LRU's step
    alone accept them, and resolve_step steps the cache as lru_step does."""
    from strata_plan.kernels import lru
    ids = torch.arange(8, dtype=torch.int64, device=DEV)
    ticks = []
    for fused in (True, False):
        st, cache = pf.probe_cache(pf.probe_state(24, 4, 64, 8, DEV, ram_base=24 * 4096), 8)
        for j in range(4):
            pf.resolve_step(ids, j, st, cache) if fused else lru.lru_step(ids, j, cache)
        ticks.append((cache.tick.tolist(), cache.slot_expert.tolist(), cache.counts.tolist()))
    assert ticks[0] == ticks[1] and ticks[0][0] == [1] * 4


@pytest.mark.gpu
def test_on_a_gpu_the_kernels_are_the_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    test_a_guess_landed_in_time_is_read_from_its_slot_then_freed()
    test_a_guess_still_copying_is_taken_and_read_in_place_never_waited_for()
    test_a_guess_taken_before_its_copy_is_not_copied()
    test_only_the_resolved_layers_guesses_are_abandoned()
    test_a_claim_takes_the_free_slots_in_order_skipping_twins_static_and_claimed_experts()
    test_a_late_guess_serves_the_part_that_landed_to_the_cache_fill()
    test_a_layer_without_a_cache_reads_a_late_guess_in_place_in_full()
    test_the_copy_marks_the_chunks_it_moves_and_a_claim_clears_them()
    test_resolve_and_the_lru_step_in_one_launch_are_the_two_references()
    test_the_profilers_probe_states_run_the_fused_and_the_plain_step()


@pytest.mark.parametrize("programs", [1, 2, 5, None])
def test_the_persistent_copy_moves_every_chunk_whatever_its_program_count(programs):
    """Blobs of several 64 KiB chunks (the last one partial), fewer programs than chunks: each program walks its
    items; the slots hold the experts' bytes, the bytes counted once per guess, a guess without a slot copies nothing."""
    n, nbytes = 3, 2 * pf.COPY_CHUNK + 4096
    i64 = dict(dtype=torch.int64, device=DEV)
    ram = n * nbytes + nbytes                                   # the slots, one spare, then the RAM copies
    arena = torch.zeros(ram + n * nbytes, dtype=torch.uint8, device=DEV)
    arena[ram:] = torch.randint(0, 256, (n * nbytes,), generator=torch.Generator().manual_seed(5),
                                dtype=torch.uint8).to(DEV)
    st = pf.PrefetchState(                                      # slots 0 and 2 claimed (FILLING) by guesses 0 and 2
        state=torch.tensor([pf.FILLING, pf.FREE, 2 * 8 + pf.FILLING], **i64),
        slot_offset=torch.tensor([i * nbytes for i in range(n)], **i64),
        where=torch.full((1, n), -1, **i64), assign=torch.tensor([0, -1, 2], **i64),
        ram_rows=torch.tensor([[ram + e * nbytes for e in range(n)]], **i64),
        tier=torch.ones((1, n), dtype=torch.int8, device=DEV), nbytes=torch.full((1, n), nbytes, **i64),
        table=torch.tensor([[ram + e * nbytes for e in range(n)]], **i64), src=None,
        counts=torch.zeros((1, pf.N_COUNTS), **i64), cached_hi=ram, guessed=torch.full((1, n), -1, **i64))
    pf.copy(arena, torch.arange(n, **i64), 0, st, nbytes, programs=programs)
    assert st.state.tolist() == [pf.READY, pf.FREE, 2 * 8 + pf.READY]  # each published by its last chunk
    assert st.done.tolist() == [0] * n                                  # its count of items back to 0
    for e in (0, 2):                                            # guess 1 got no slot
        assert torch.equal(arena[e * nbytes:(e + 1) * nbytes], arena[ram + e * nbytes:ram + (e + 1) * nbytes])
    assert int(arena[nbytes:2 * nbytes].sum()) == 0
    assert int(st.counts[0, pf.COPIED]) == 2 * nbytes
