"""The device loop's handshake with the NVMe stager (kernels/stage_wait.py): the kernel (interpreted on a CPU, compiled
on a GPU) against the plain reference, with a second thread publishing `ready` while the kernel polls."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from strata_plan.kernels import stage_wait as sw

L, E, K, G, R = 3, 16, 4, 8, 8
ARENA = 1 << 16                  # bytes of "VRAM" before the pinned block (static + slots + poison)
POISON = ARENA - 4096
STAGE = 10 * ARENA               # arena-relative staging addresses the stager publishes (never dereferenced here)


DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _setup(cached=()):
    """(arena, control block, host views). On a CPU one buffer holds the "VRAM" part and the pinned block (the
    interpreter follows the offsets); on a GPU the arena is device memory and the block pinned host memory, reached
    from the arena's address by its offset (unified addressing), as the engine lays them out."""
    lay = sw.block_layout(L, E, K, G, R)
    if DEV.type == "cuda":
        arena = torch.zeros(ARENA, dtype=torch.uint8, device=DEV)
        block = torch.zeros(lay["size"], dtype=torch.uint8, pin_memory=True)
        base = block.data_ptr() - arena.data_ptr()
    else:
        arena = torch.zeros(ARENA + lay["size"], dtype=torch.uint8)
        block, base = arena[ARENA:], ARENA
    hv = sw.host_views(block, L, E, K, G, R)
    tier = torch.zeros((L, E), dtype=torch.int8)
    tier[:, 4:8] = 1
    tier[:, 8:] = sw.NVME
    table = torch.full((L, E), POISON, dtype=torch.int64)
    table[:, :8] = torch.arange(8) * 4096
    for j, e, slot in cached:                 # NVMe experts the device LRU holds in a VRAM slot
        table[j, e] = 9 * 4096 + slot * 4096
    d = lambda t: t.to(DEV)                   # noqa: E731
    cb = sw.ControlBlock(seq=d(torch.zeros(1, dtype=torch.int64)), tier=d(tier), table=d(table),
                         src=d(torch.full((L, E), -7, dtype=torch.int64)), admit=None,
                         nbytes=d(torch.full((L, E), 4096 * 3)), counts=d(torch.zeros((L, 4), dtype=torch.int64)),
                         words_at=base + lay["words"], ready_at=base + lay["ready"], ring_at=base + lay["ring"],
                         scores_at=base + lay["scores"], rows=R, guesses=G, cached_hi=POISON, poison=POISON)
    return arena, cb, hv


def _sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def _wait(kernel: bool, buf, ids, j, cb, hv, **kw) -> None:
    """Layer j's request and wait, by the kernel (then synchronized) or by the plain reference."""
    if kernel:
        sw.stage_wait(buf, ids, j, cb, **kw)
        _sync()
    else:
        sw.reference_wait(ids, j, cb, hv, **kw)


def _stager(hv, j, publish, delay=0.05, fail=()):
    """A stand-in stager: once request for layer j is out, publish each NVMe id after `delay` (failed ids: -2)."""
    def run():
        t0 = time.time()
        while hv.words[sw.REQ] == 0 and time.time() - t0 < 10:
            time.sleep(0.001)
        time.sleep(delay)
        for e in publish:
            hv.ready[j, e] = sw.FAILED if e in fail else STAGE + e * 4096
    th = threading.Thread(target=run)
    th.start()
    return th


@pytest.mark.parametrize("fail", [(), (9,)])
def test_the_wait_kernel_polls_until_the_stager_publishes_as_the_reference_does(fail):
    ids = torch.tensor([9, 2, 12, 5], device=DEV)                 # NVMe, VRAM, NVMe (staged already), RAM
    for kernel in (True, False):
        buf, cb, hv = _setup()
        hv.ready[1, 12] = STAGE + 12 * 4096
        th = _stager(hv, 1, [9], fail=fail)
        _wait(kernel, buf, ids, 1, cb, hv)
        th.join()
        assert int(hv.words[sw.REQ]) == 1 and int(cb.seq[0]) == 1
        assert hv.ring[1, :2 + K].tolist() == [1, 1, 9, -1, 12, -1]     # only ids read from staging
        want9 = POISON if fail else STAGE + 9 * 4096
        assert int(cb.table[1, 9]) == want9 and int(cb.src[1, 9]) == want9
        assert int(cb.table[1, 12]) == STAGE + 12 * 4096
        assert int(cb.table[1, 2]) == 2 * 4096 and int(cb.src[1, 2]) == -7      # not NVMe: untouched
        assert cb.counts[1, :3].tolist() == [2, 2 * 4096 * 3, 1]
        assert int(hv.words[sw.ERR]) == (1 if fail else 0)


def test_a_staging_address_below_the_arena_is_read_not_taken_for_a_failure():
    """The staging cache may lie below the arena in the address space (an H100 placed it there): its arena-relative
    addresses are negative multiples of 256, read like any other; only -1 and -2 mean missing and failed."""
    ids = torch.tensor([9, 2, 12, 5], device=DEV)
    below = -3439984640                                           # as the H100 published it
    for kernel in (True, False):
        buf, cb, hv = _setup()
        hv.ready[1, 12] = below
        th = _stager(hv, 1, [9])
        _wait(kernel, buf, ids, 1, cb, hv)
        th.join()
        assert int(cb.table[1, 12]) == below and int(cb.src[1, 12]) == below
        assert int(cb.table[1, 9]) == STAGE + 9 * 4096
        assert int(hv.words[sw.ERR]) == 0


def test_a_cached_nvme_expert_and_a_layer_without_nvme_ids_do_not_wait():
    for kernel in (True, False):
        buf, cb, hv = _setup(cached=[(0, 9, 0)])
        ids = torch.tensor([9, 1, 5, 7], device=DEV)
        _wait(kernel, buf, ids, 0, cb, hv, max_spins=5)
        assert int(cb.table[0, 9]) == 9 * 4096 and cb.counts[0].tolist() == [0, 0, 0, 0]
        assert int(hv.words[sw.ERR]) == 0


def test_a_missing_expert_times_out_into_the_poison_slot_and_sets_err():
    for kernel in (True, False):
        buf, cb, hv = _setup()
        ids = torch.tensor([10, 1, 2, 3], device=DEV)
        _wait(kernel, buf, ids, 2, cb, hv, max_spins=50)
        assert int(cb.table[2, 10]) == POISON and int(hv.words[sw.ERR]) == 1


def test_abort_ends_a_wait_at_once_on_the_poison_slot():
    """The host stops the stager (closing) while a wait polls: the wait ends without its timeout or spin limit."""
    for kernel in (True, False):
        buf, cb, hv = _setup()
        ids = torch.tensor([10, 1, 2, 3], device=DEV)
        th = threading.Thread(target=lambda: (time.sleep(0.05), hv.words.__setitem__(sw.ABORT, 1)))
        th.start()
        t0 = time.perf_counter()
        _wait(kernel, buf, ids, 2, cb, hv)
        th.join()
        assert time.perf_counter() - t0 < 30 and int(cb.table[2, 10]) == POISON
        assert int(hv.words[sw.ERR]) == 0                   # closing is not an error to report


def test_done_writes_the_guesses_the_stager_must_read_then_publishes_done():
    gids = torch.tensor([3, 9, 10, -1, 11, 12, -1, -1])       # 4 for layer 1, 4 for layer 2
    gsc = torch.linspace(1, 0, G)
    for name in ("kernel", "reference"):
        buf, cb, hv = _setup(cached=[(2, 12, 1)])
        cb.seq[0] = 5
        if name == "kernel":
            sw.stage_done(buf, 0, cb, K, gids.to(DEV), gsc.to(DEV), per_layer=4)
            _sync()
        else:
            sw.reference_done(0, cb, hv, K, gids, gsc, per_layer=4)
        assert int(hv.words[sw.DONE]) == 5
        # 3: VRAM; 12 at layer 2: in a VRAM slot
        assert hv.ring[5 % R, 2 + K:].tolist() == [-1, 9, 10, -1, 11, -1, -1, -1], name
        np.testing.assert_allclose(hv.scores[5 % R], gsc.numpy())
    buf, cb, hv = _setup()
    cb.seq[0] = 2
    sw.stage_done(buf, 2, cb, K)                      # no guesses: only DONE
    _sync()
    assert int(hv.words[sw.DONE]) == 2 and (hv.ring[2] == -1).all()


def test_guesses_taken_at_the_router_are_in_the_row_when_the_request_is_out():
    """The lookahead taken at layer 0's router (`lookahead_point="attention"`): the wait writes the guesses into the
    request's row before REQ, so a stager that reads the row the moment REQ shows it sees them; then done carries
    none and leaves them."""
    gids = torch.tensor([3, 9, 10, -1, 11, 12, -1, -1])       # 4 for layer 1, 4 for layer 2
    gsc = torch.linspace(1, 0, G)
    ids = torch.tensor([9, 2, 12, 5], device=DEV)
    for kernel in (True, False):
        buf, cb, hv = _setup(cached=[(2, 12, 1)])
        hv.ready[0, 9] = STAGE + 9 * 4096
        hv.ready[0, 12] = STAGE + 12 * 4096
        seen = []

        def watch():
            t0 = time.time()
            while hv.words[sw.REQ] == 0 and time.time() - t0 < 10:
                pass
            seen.append(hv.ring[1 % R].copy())
        th = threading.Thread(target=watch)
        th.start()
        _wait(kernel, buf, ids, 0, cb, hv, gids=gids.to(DEV), gscores=gsc.to(DEV), per_layer=4)
        th.join()
        # 3: VRAM; 12 at layer 2: in a VRAM slot
        assert seen[0][2 + K:].tolist() == [-1, 9, 10, -1, 11, -1, -1, -1], kernel
        np.testing.assert_allclose(hv.scores[1 % R], gsc.numpy())
        if kernel:
            sw.stage_done(buf, 0, cb, K)
            _sync()
        else:
            sw.reference_done(0, cb, hv, K)
        assert int(hv.words[sw.DONE]) == 1 and hv.ring[1 % R, 2 + K:].tolist() == seen[0][2 + K:].tolist()


def test_after_the_lru_step_an_admitted_nvme_expert_is_read_from_staging_into_src_only():
    """The device LRU admitted expert 9 (its entry is now a VRAM slot, filled from `src` after the wait): the wait
    asks the stager for it and sets `src`, leaving the table at the slot."""
    import dataclasses
    for kernel in (True, False):
        buf, cb, hv = _setup(cached=[(0, 9, 0)])
        cb = dataclasses.replace(cb, admit=torch.tensor([[0 * 4096 + 9 * 4096, -1, -1, -1]] * L, device=DEV))
        hv.ready[0, 9] = STAGE + 9 * 4096
        ids = torch.tensor([9, 1, 5, 7], device=DEV)
        _wait(kernel, buf, ids, 0, cb, hv, max_spins=5)
        assert int(cb.table[0, 9]) == 9 * 4096 and int(cb.src[0, 9]) == STAGE + 9 * 4096
        assert hv.ring[1, 2:2 + K].tolist() == [9, -1, -1, -1] and cb.counts[0, :3].tolist() == [1, 4096 * 3, 0]


def test_the_profilers_handshake_probe_reads_every_id_from_staging_and_never_waits():
    """What `profiler.gpu.stage_layer_us` runs: `probe_block` publishes every expert as staged, so `stage_wait` points
    each routed id at its staging address without a wait, and `stage_done` writes the guesses and DONE, token after
    token (the ring's rows reused)."""
    from strata_plan.profiler.gpu import LOOKAHEAD_SHAPE, STAGE_GUESSES
    _, k, e = LOOKAHEAD_SHAPE
    layers, w, rows = 4, 2 * k, 8
    g = STAGE_GUESSES * w
    arena, cb, hv, _ = sw.probe_block(layers, e, k, g, rows, DEV)
    ids = torch.arange(k, dtype=torch.int64, device=DEV)
    gids = torch.arange(g, dtype=torch.int64, device=DEV) % e
    for token in range(3):
        for j in range(layers):
            sw.stage_wait(arena, ids, j, cb, max_spins=10)
            sw.stage_done(arena, j, cb, k, gids, torch.ones(g, device=DEV), per_layer=w)
    _sync()
    s = 3 * layers
    assert int(hv.words[sw.REQ]) == int(hv.words[sw.DONE]) == s and int(hv.words[sw.ERR]) == 0
    assert cb.counts[:, sw.USES].tolist() == [3 * k] * layers and int(cb.counts[:, sw.WAITED].sum()) == 0
    assert (cb.table[:, :k] == sw.PROBE_STAGED).all()
    row = hv.ring[s % rows]
    assert row[:2 + k].tolist() == [s, layers - 1, *range(k)]
    assert (row[2 + k:] == -1).all()          # the last layer's guesses point past the model: none to read
    assert hv.ring[(s - 1) % rows][2 + k:2 + k + w].tolist() == list(range(w))
