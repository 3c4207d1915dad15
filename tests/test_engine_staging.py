"""The NVMe tier in the device loop (engine/staging.py, engine/stager.py) on the CPU: the stager thread reads real
blob files (O_DIRECT where the filesystem allows) into the staging cache while the decode step waits for them; the
logits are the resident run's bit for bit, in every mode, and a damaged or unreadable blob stops the run in one line
before a token computed from it is shown."""
from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest
import torch

from strata_plan.engine import aio, directio
from strata_plan.engine.engine import Engine, EngineOptions
from strata_plan.engine.packed import load_index
from strata_plan.errors import UserError

from test_engine_run import PROMPT, _one_thread, bench_runner_and_plain, bf16_plan, packed_bf16, run  # noqa: F401


IO = ["threads", pytest.param("aio", marks=pytest.mark.skipif(not aio.available(), reason="no Linux native AIO"))]


@pytest.mark.parametrize("io", IO)
@pytest.mark.parametrize("split,mode", [((4, 10, 0, 0), "on-demand"), ((4, 10, 2, 0), "lru"), ((4, 10, 2, 2), "plan"),
                                        ((0, 0, 3, 1), "plan")])
def test_the_stager_gives_the_ram_plans_logits_and_moves_the_same_expert_bytes(packed_bf16, split, mode, io):
    """The NVMe tier staged (stager on) against the same plan with those experts in pinned RAM instead: prompt a token a
    call (so prefill goes through the stager too) and 12 tokens; the logits bit for bit, the same experts static and
    cached, every use the RAM plan missed a miss here too (read in place from RAM or from staging), and without
    lookahead the same bytes over PCIe; each staged expert read from the drive at most once per staging. The reads by
    reader threads or submitted together (native AIO) alike."""
    vram, ram, cache, depth = split
    plan = bf16_plan(*split, chunk=1)
    ref = run(packed_bf16, bf16_plan(vram, 32 - vram, cache, depth, chunk=1), mode, new=12)
    dev = run(packed_bf16, plan, mode, new=12, io=io)
    assert torch.equal(dev[0], ref[0]) and dev[1] == ref[1]
    r, d = ref[2]["by_kind"], dev[2]["by_kind"]
    assert d["static"] == r["static"] and d["cached"] == r["cached"]
    missed = r["in_place"] + r["late"] + r["prefetched"]
    assert d["demand"] + d["late"] + d["in_place"] + d["staged"] + d["prefetched"] == missed
    db = dev[2]
    if not plan.prefetch_depth or mode != "plan":     # (with lookahead the staged guesses differ from the VRAM ones)
        assert db["bytes_from"]["ram"] + db["staged_bytes"] == ref[2]["bytes_from"]["ram"]
    assert 0 < db["bytes_from"]["nvme"] <= db["staged_bytes"] + db["wasted_bytes"]   # a staged expert read once


@pytest.mark.parametrize("io", IO)
def test_the_lookahead_guesses_are_read_ahead_and_counted(packed_bf16, io):
    """Depth 2: the gates' guesses for the next layers are staged before the layers ask (staged uses), wrong ones
    are counted as wasted; depth 0 stages only what the layers ask for (every NVMe read a demand)."""
    got = {}
    for depth in (0, 2):
        with Engine.open(packed_bf16, bf16_plan(0, 0, 0, depth, chunk=1), EngineOptions(device="cpu",
                                                                                           stager_io=io)) as eng:
            st = eng.store.staging.stager
            assert st.io == io and {t.name for t in st._threads} >= (
                {"stager-poll", "stager-reap"} if io == "aio" else {"stager-poll", "stager-read-0"})
            eng.generate(PROMPT, max_new_tokens=10)
            got[depth] = (eng.store.counter_data(), eng.store.staging.last)
    c0, s0 = got[0]
    c2, s2 = got[2]
    assert s0["reads_guess"] == 0 and s0["reads_demand"] > 0 and c0["prefetch_bytes"] == 0
    assert s0["demand_read_ms_mean"] > 0 and s0["demand_queue_ms_mean"] >= 0     # the host's part of a demand read
    assert 0 < s0["demand_land_ms_mean"] <= s0["demand_read_ms_mean"]            # ... the drive's, within it
    ranks = s0["demand_queue_ms_by_rank"]                  # ... by the read's turn within its request
    assert 1 <= len(ranks) <= 4 and all(q >= 0 for q in ranks)     # (top-4: at most 4 demand reads a request)
    assert s0["poll_gap_ms_max"] >= s0["poll_gap_ms_mean"] > 0
    assert s2["reads_guess"] > 0 and c2["prefetch_bytes"] == s2["guess_bytes"] > 0
    assert s0["guess_queued"] == s0["guess_stale"] == s0["guess_no_slot"] == s0["found_reading"] == 0
    # a queued guess is read, dropped (its layer asked first, or no slot it may take), staged meanwhile or still queued
    assert s2["reads_guess"] + s2["guess_stale"] + s2["guess_no_slot"] <= s2["guess_queued"]


@pytest.mark.parametrize("io,backend", [("threads", "auto"), ("threads", "triton")] +
                         ([("aio", "auto")] if aio.available() else []))
def test_guesses_taken_at_the_router_go_with_the_request_and_leave_the_tokens(packed_bf16, io, backend):
    """`lookahead_point="attention"`: the gates run on each layer's residual after attention (`before_moe`), their
    guesses ride in the layer's request (`stage_wait`, the kernel interpreted with backend "triton") and the stager
    queues them with it. The tokens are those of the guesses taken at the layer's end: guesses move reads, never
    results. Both count guesses and right ones; the guesses themselves differ (two hidden states)."""
    if backend == "triton" and torch.cuda.is_available():       # Triton interprets only without a GPU (conftest)
        pytest.skip("the kernels on a CPU device need Triton's interpreter; on a GPU: "
                    "test_on_a_gpu_guesses_taken_at_the_router_ride_in_the_graph")
    got = {}
    for point in ("output", "attention"):
        opts = EngineOptions(device="cpu", stager_io=io, backend=backend, lookahead_point=point)
        with Engine.open(packed_bf16, bf16_plan(2, 4, 0, 2, chunk=1), opts) as eng:
            early = point == "attention"
            assert eng.store.staging.early == eng.store.staging.stager.early == early
            assert (eng.model.before_moe is not None) == early
            tokens = eng.generate(PROMPT, max_new_tokens=8)
            got[point] = (tokens, eng.store.counter_data(), eng.store.staging.last)
    assert got["output"][0] == got["attention"][0]
    for point, (_, c, st) in got.items():
        la = c["lookahead"]["1"]
        assert st["guess_queued"] > 0 and la["guesses"] > 0 and 0 < la["precision"] <= 1, point
    with pytest.raises(UserError, match="lookahead_point"):
        EngineOptions(lookahead_point="router")


def test_the_engine_takes_the_lookahead_point_the_plan_records(packed_bf16):
    """A plan made with `strata-plan plan --lookahead-point attention` records it (`staging.lookahead_point`), and
    the engine follows it unless its options name a point."""
    import dataclasses
    plan = bf16_plan(2, 4, 0, 1, chunk=1)
    router = dataclasses.replace(plan, staging=dataclasses.replace(plan.staging, lookahead_point="attention"))
    for p, point, early in ((plan, None, False), (router, None, True), (router, "output", False)):
        with Engine.open(packed_bf16, p, EngineOptions(device="cpu", lookahead_point=point)) as eng:
            assert eng.store.staging.early == early and (eng.model.before_moe is not None) == early


def test_the_deepest_guesses_alone_are_read_when_asked_and_the_tokens_stay(packed_bf16):
    """`stage_depths="deepest"` (an A/B): at depth 2 the stager reads only the depth-2 guesses, as the cost model
    counts them; the depth-1 ones are still counted for precision and recall. The tokens are the same."""
    got = {}
    for which in ("all", "deepest"):
        opts = EngineOptions(device="cpu", stage_depths=which)
        with Engine.open(packed_bf16, bf16_plan(0, 0, 0, 2, chunk=1), opts) as eng:
            assert eng.store.staging.stager.first_read_depth == (2 if which == "deepest" else 1)
            tokens = eng.generate(PROMPT, max_new_tokens=10)
            got[which] = (tokens, eng.store.counter_data(), eng.store.staging.last)
    assert got["all"][0] == got["deepest"][0]
    (_, c_all, s_all), (_, c_deep, s_deep) = got["all"], got["deepest"]
    assert 0 < s_deep["guess_queued"] < s_all["guess_queued"] and s_deep["reads_guess"] > 0
    assert c_deep["lookahead"]["1"]["guesses"] > 0 and c_deep["lookahead"]["2"]["guesses"] > 0    # both counted
    with pytest.raises(UserError, match="stage_depths"):
        EngineOptions(stage_depths="nearest")


def _copy(packed, tmp_path):
    dst = tmp_path / "packed"
    shutil.copytree(packed, dst)
    return dst


def _nvme_blobs(folder, plan):
    """(path, offset, nbytes) of every NVMe-tier expert blob of the plan."""
    idx = load_index(folder)
    ent = {(e.layer, e.expert): e for e in idx.entries}
    return [(folder / ent[(l.layer, x)].file, ent[(l.layer, x)].offset, ent[(l.layer, x)].nbytes)
            for l in plan.layers for x in l.nvme]


def _damage(blobs) -> None:
    for path, off, n in blobs:
        with open(path, "r+b") as f:
            f.seek(off + n // 2)
            b = f.read(1)
            f.seek(off + n // 2)
            f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("io", IO)
@pytest.mark.parametrize("fault", ["checksum", "short", "eio"])
def test_a_bad_nvme_blob_stops_the_run_in_one_line_before_a_token_from_it(packed_bf16, tmp_path, monkeypatch, fault,
                                                                         io):
    folder = _copy(packed_bf16, tmp_path)
    plan = bf16_plan(4, 10, 0, 1, chunk=1)
    shown: list[int] = []
    with Engine.open(folder, plan, EngineOptions(device="cpu", stager_io=io)) as eng:
        assert eng.store.staging is not None
        blobs = _nvme_blobs(folder, plan)
        if fault == "checksum":                  # damaged after the start-up checks: the stager's check finds it
            _damage(blobs)
        elif fault == "short":                   # cut short after start-up
            for path in {p for p, _, _ in blobs}:
                os.truncate(path, min(off for p, off, _ in blobs if p == path))
        elif io == "threads":
            def eio(self, buf, offset, nbytes):
                raise OSError(5, "Input/output error", str(self.path))
            monkeypatch.setattr(directio.BlobFile, "read_into", eio)
        else:                                    # every completion an EIO, as the kernel reports one
            real = aio.AioContext.wait
            monkeypatch.setattr(aio.AioContext, "wait", lambda self, *a: [(t, -5) for t, _ in real(self, *a)])
        with pytest.raises(UserError) as err:
            eng.generate(PROMPT, max_new_tokens=4, on_token=shown.append)
    line = str(err.value)
    assert "\n" not in line and "expert" in line and str(folder) in line
    assert {"checksum": "checksum mismatch", "short": "short read", "eio": "Input/output error"}[fault] in line
    assert shown == []                            # the prompt's first layer already needed an NVMe expert


@pytest.mark.parametrize("mode", ["plan", "on-demand"])
def test_bench_with_replayed_routing_and_guesses_on_the_device(packed_bf16, mode):
    """`bench.measure` with routing replayed: the step takes the replay's ids and lookahead guesses from the device
    (`Replay.hint_table`) and gives the plain forward's tokens (the host's replay); the NVMe tier's files stay out of
    the page cache; what crossed PCIe is the RAM and staged bytes."""
    d, h = bench_runner_and_plain(packed_bf16, bf16_plan(4, 10, 2, 2, chunk=1), mode)
    assert d["tokens"] == h["tokens"]
    bt = d["bytes_per_token"]
    assert bt["pcie"] == pytest.approx(bt["ram"] + bt["staged"]) and bt["staged"] > 0
    assert d["stager"]["reads_guess"] > 0 if mode == "plan" else d["stager"]["reads_guess"] == 0
    assert d["stager"]["tokens"] > 0                        # the steps its per-token figures are over
    pc = d["page_cache"]
    if directio.BlobFile.open(next(packed_bf16.glob("*.bin")), warn=False).direct:   # O_DIRECT here: a cold tier
        assert pc["files"] > 0 and pc["after"] < 0.5


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO)
def test_on_a_gpu_the_graph_waits_for_the_stager_and_gives_the_eager_tokens(packed_bf16, io):
    """On a GPU: each MoE layer's stage_wait kernel (inside the token's CUDA graph) polls the pinned ready table the
    stager thread writes, the MoE kernel reads staged experts from the registered staging cache; the tokens are the
    same step's run eagerly (the same stager, no graph) and the logits agree to bf16 rounding, in every mode."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for split, mode in (((4, 10, 0, 0), "on-demand"), ((4, 10, 2, 0), "lru"), ((4, 10, 2, 2), "plan")):
        plan = bf16_plan(*split, chunk=1)
        eager, eager_tokens, _ = run(packed_bf16, plan, mode, new=12, device="cuda", graphs="eager")
        dev, tokens, dc = run(packed_bf16, plan, mode, new=12, device="cuda", io=io)
        assert tokens == eager_tokens, mode
        torch.testing.assert_close(dev, eager, rtol=0, atol=2 ** -7 * float(eager.abs().max()))
        assert dc["staged_bytes"] > 0 and dc["bytes_from"]["nvme"] > 0
    with Engine.open(packed_bf16, plan, EngineOptions(device="cuda", stager_io=io)) as eng:   # generate runs ahead
        assert eng.model.step_runner.ahead and eng.store.staging is not None
        assert eng.generate(PROMPT, max_new_tokens=8) == eager_tokens[:8]


@pytest.mark.gpu
def test_on_a_gpu_guesses_taken_at_the_router_ride_in_the_graph(packed_bf16):
    """On a GPU, the token's CUDA graph with the gates at each router and their guesses in the request's row
    (`lookahead_point="attention"`): the same tokens as the guesses taken at each layer's end, and the stager queued
    them."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    got = {}
    for point in ("output", "attention"):
        opts = EngineOptions(device="cuda", lookahead_point=point)
        with Engine.open(packed_bf16, bf16_plan(4, 10, 2, 2, chunk=1), opts) as eng:
            assert eng.model.step_runner.ahead
            got[point] = eng.generate(PROMPT, max_new_tokens=12)
            eng.store.counter_data()
            assert eng.store.staging.last["guess_queued"] > 0, point
    assert got["output"] == got["attention"]


def test_a_wait_that_timed_out_names_what_the_stager_knew(packed_bf16):
    """The GPU gave up on a request (ERR): the one line says what the stager saw of it (its ids, their ready words, the
    request counters, its threads), so a report shows which side lost the expert."""
    with Engine.open(packed_bf16, bf16_plan(0, 0, 0, 0, chunk=1), EngineOptions(device="cpu")) as eng:
        eng.generate(PROMPT, max_new_tokens=2)
        st = eng.store.staging.stager
        req = int(st.hv.words[0])
        st.hv.words[2] = req                      # ERR: as the kernel sets it after a timeout
        with pytest.raises(UserError) as e:
            st.check()
        msg = str(e.value)
        assert f"request {req}" in msg and f"REQ {req}" in msg and "ready" in msg and "threads alive" in msg
        assert "(staged, stamp" in msg and "slots free" in msg    # the last request's experts: in their slots
        assert "\n" not in msg


@pytest.mark.skipif(not aio.available(), reason="no Linux native AIO")
@pytest.mark.parametrize("refused", ["every read", "after the first"])
def test_a_read_the_kernel_refuses_stops_the_run_in_one_line(packed_bf16, monkeypatch, refused):
    """io="aio": io_submit refusing a read (as for a file the drive dropped) is the stager's error, as a failed read
    is; the reads it started before the refused one still land and are published."""
    real = aio.AioContext.submit

    def submit(self, reads):
        if refused == "every read" or len(reads) < 2:
            return (0, OSError(22, "Invalid argument")) if reads else (0, None)
        return real(self, reads[:1])[0], OSError(22, "Invalid argument")
    monkeypatch.setattr(aio.AioContext, "submit", submit)
    with Engine.open(packed_bf16, bf16_plan(4, 10, 0, 0, chunk=1), EngineOptions(device="cpu", stager_io="aio")) as eng:
        with pytest.raises(UserError) as err:
            eng.generate(PROMPT, max_new_tokens=2)
    line = str(err.value)
    assert "\n" not in line and "Invalid argument" in line and "expert" in line
    with pytest.raises(UserError, match="stager_io"):
        EngineOptions(stager_io="uring")


@pytest.mark.parametrize("io", IO)
def test_each_staged_blob_is_hashed_at_its_first_read_only(packed_bf16, monkeypatch, io):
    """Every byte is checked once a run (engine/PACK.md): a blob the stager reads again after an eviction is not hashed
    again. The least staging cache over 12 tokens re-reads blobs; each distinct blob's parts are hashed once."""
    from strata_plan.engine import stager
    hashed: list = []
    real = stager.verify_part

    def spy(index, entry, data, k):
        hashed.append((entry.layer, entry.expert, k))
        return real(index, entry, data, k)
    monkeypatch.setattr(stager, "verify_part", spy)
    with Engine.open(packed_bf16, bf16_plan(0, 0, 0, 0, chunk=1), EngineOptions(device="cpu", stager_io=io)) as eng:
        eng.generate(PROMPT, max_new_tokens=12)
        eng.store.counter_data()                     # folds the stager's counts in
        last = eng.store.staging.last
    reads = last["reads_demand"] + last["reads_guess"]
    blobs = {(j, e) for j, e, _ in hashed}
    assert len(hashed) == len(set(hashed)) and reads > len(blobs) > 0


def test_the_stager_reads_a_blob_in_the_plans_split(packed_bf16, monkeypatch):
    """`staging.nvme_reads[f].batch_splits`: i experts of a format queued together are each read as that many O_DIRECT
    requests in flight at once (PLANNER.md, "What the engine must do"); the logits are the one-request stager's."""
    import dataclasses as dc
    import threading

    from strata_plan.core.plan import NvmeRead
    plan = bf16_plan(4, 10, 2, 0, chunk=1)
    requests: dict = {}
    real = directio.BlobFile.read_into

    def spy(self, buf, offset, nbytes):
        who = "part" if threading.current_thread().name.startswith("stager-part") else "whole"
        requests.setdefault(who, []).append(nbytes)
        return real(self, buf, offset, nbytes)
    monkeypatch.setattr(directio.BlobFile, "read_into", spy)
    one = run(packed_bf16, plan, "lru", new=6)
    split = dc.replace(plan, staging=dc.replace(plan.staging, nvme_reads={
        "bf16": NvmeRead(split=2, queue_depth=8, batch_splits=(4, 2, 2, 2))}))
    requests.clear()
    four = run(packed_bf16, split, "lru", new=6)
    assert torch.equal(four[0], one[0]) and four[1] == one[1]
    blob = load_index(packed_bf16).entries[0].nbytes
    parts = requests.get("part", [])                         # the pool's requests: pieces of a blob, not whole blobs
    assert parts and max(parts) <= -(-blob // 2 // 4096) * 4096 and blob not in parts


@pytest.mark.skipif(not aio.available(), reason="no Linux native AIO")
def test_the_plain_reads_of_the_drive_bound_read_every_byte_asked(tmp_path, monkeypatch):
    """The drive's bound (bench_engine): a plain read of regions, each `split` requests submitted together through
    AIO with at most `in_flight` requests outstanding, reads every requested byte once, as the stager submits a
    blob's parts; the thread-a-request read beside it."""
    path = tmp_path / "blobs.bin"
    path.write_bytes(os.urandom(4 << 20))
    batches = []
    real = aio.AioContext.submit

    def submit(self, reads):
        batches.append(reads)
        return real(self, reads)
    monkeypatch.setattr(aio.AioContext, "submit", submit)
    assert directio.plain_read_aio_gbps([path], 64 << 10, 4, 8, nbytes=2 << 20) > 0
    sent = [r for b in batches for r in b]
    assert len(sent) == 32 and len({off // (256 << 10) for *_, off in sent}) == 8   # 8 regions of 4 x 64 KB
    assert all(n == 64 << 10 and off % (64 << 10) == 0 for _, _, _, n, off in sent)
    assert len({off for *_, off in sent}) == 32                         # no byte read twice
    assert len(batches[0]) == 8 and all(len(b) % 4 == 0 for b in batches)   # whole regions, 8 requests at most
    assert directio.plain_read_gbps([path], 64 << 10, 4, nbytes=2 << 20) > 0


def test_close_names_a_stager_thread_that_does_not_stop(packed_bf16, monkeypatch):
    """A thread held past close (as by a read the drive never finishes) is named in one warning after one shared
    deadline; the others stop."""
    import threading
    import warnings
    from strata_plan.engine import stager as stager_mod
    monkeypatch.setattr(stager_mod, "CLOSE_S", 0.2)
    release = threading.Event()
    with Engine.open(packed_bf16, bf16_plan(0, 0, 0, 0, chunk=1), EngineOptions(device="cpu")) as eng:
        st = eng.store.staging.stager
        held = threading.Thread(target=release.wait, name="stager-read-held", daemon=True)
        held.start()
        st._threads.append(held)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            eng.close()
            took = time.perf_counter() - t0
    release.set()
    msgs = [str(w.message) for w in got if "NVMe stager" in str(w.message)]
    assert len(msgs) == 1 and "stager-read-held" in msgs[0] and "stager-poll" not in msgs[0]
    assert took < 5


@pytest.mark.parametrize("io", IO)
def test_the_slot_heaps_hold_the_scans_candidates(packed_bf16, monkeypatch, io):
    """`Stager._take` takes its slot from two heaps instead of scanning the slots: before every take the FREE heap
    holds exactly the FREE slots, and the live `_lru` entries are exactly the STAGED slots in the order the scan
    took them (stamp, then slot). Depth 2, every expert on NVMe: the staging cache fills and evicts."""
    from strata_plan.engine import stager as stager_mod
    real, checked = stager_mod.Stager._take, [0]

    def take(self, demand, now):
        assert sorted(self._free) == list(np.flatnonzero(self.state == stager_mod.FREE))
        staged = np.flatnonzero(self.state == stager_mod.STAGED)
        scan = [int(v) for v in staged[np.argsort(self.stamp[staged], kind="stable")]]
        live = sorted((st, v) for st, v in set(self._lru) if self.state[v] == stager_mod.STAGED
                      and st == self.stamp[v])
        assert [v for _, v in live] == scan
        checked[0] += not self._free
        return real(self, demand, now)
    monkeypatch.setattr(stager_mod.Stager, "_take", take)
    with Engine.open(packed_bf16, bf16_plan(0, 0, 0, 2, chunk=1), EngineOptions(device="cpu", stager_io=io)) as eng:
        eng.generate(PROMPT, max_new_tokens=10)
    assert checked[0] > 10                     # takes that had to evict


@pytest.mark.skipif(not aio.available(), reason="no Linux native AIO")
def test_a_refused_aio_context_falls_back_to_reader_threads(packed_bf16, monkeypatch):
    """AIO is the default: where the kernel refuses a context when the stager starts (the system's AIO events used
    up), asked for or by default, one warning says so and how to fix it, and the stager reads with threads: the same
    logits."""
    import errno
    import warnings
    from strata_plan.engine.store import default_stager_io
    ref = run(packed_bf16, bf16_plan(0, 0, 0, 0, chunk=1), "plan", new=4, io="threads")
    assert default_stager_io() == "aio"                     # (decided once a process, before the refusals)

    def refuse(self, depth):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
    monkeypatch.setattr(aio.AioContext, "__init__", refuse)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        with Engine.open(packed_bf16, bf16_plan(0, 0, 0, 0, chunk=1), EngineOptions(device="cpu")) as eng:
            assert eng.store.staging.stager.io == "threads"
        dev = run(packed_bf16, bf16_plan(0, 0, 0, 0, chunk=1), "plan", new=4, io="aio")
    msgs = [str(w.message) for w in got if "native AIO refused" in str(w.message)]
    assert msgs and "fs.aio-max-nr" in msgs[0] and "Resource temporarily unavailable" in msgs[0]
    assert torch.equal(dev[0], ref[0]) and dev[1] == ref[1]
