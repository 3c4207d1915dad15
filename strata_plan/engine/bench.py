"""`strata-plan bench`'s measurement: prefill and decode tok/s of a plan run by the engine, and what the
store did, beside the planner's prediction for the same plan.

    r = measure(packed_dir, plan_path, mode="plan", tokens=64, warmup=32, replay=None)
    r["measured"]["decode_tok_s"], r["counters"], r["time_per_token"]

Decode: after `warmup` tokens (which fill the LRU cache; at least the statistics' warm-up), `tokens`
tokens are timed, greedy or drawn by `pick` (`picks.GumbelPick`: a small model's greedy continuation can loop over a
few tokens whose routing is not the text's; a fixed seed draws the same tokens in every mode, the logits being
equal); each ends when its id reaches the host, so every token's GPU work is included;
tok/s = 1 / median seconds per token, and the mean beside it. Where the step runner can run ahead (graphs) each
launch runs the runner's `k` tokens (`EngineOptions.tokens_per_graph`) and launch i+1 is queued before launch i's
tokens are read, as `generate` does, so a token's time is the interval between two launches' tokens reaching the
host over `k` (`tokens` is rounded up to whole launches). Per token: the decode thread's CPU time (split into the step
call, the token's copy and its read), the graph launch's host time, the step's GPU time (CUDA events), and after the
timed tokens the step replayed alone and without its MoE calls (`DeviceDecode.time_parts`). Prefill: one chunk
of the plan's `prefill_chunk` tokens after one warm-up chunk. Counters cover the timed decode tokens only. Every figure here is measured on this machine; `predicted` figures come from
the cost model and are labelled so by the caller.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from strata_plan.core.plan import load_plan
from strata_plan.schema import to_data

from .device_loop import TokenRing
from .engine import Engine, EngineOptions
from .picks import GREEDY, GumbelPick


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(packed, plan, mode: str = "plan", tokens: int = 64, warmup: int = 32, replay=None,
            device: str = "", prompt: list[int] | None = None, seed: int = 0, progress=None,
            options: EngineOptions | None = None, ring_poll_s: float | None = None, pick=None) -> dict:
    """`options` (optional) sets the engine's other knobs; its mode and device are replaced by these. `ring_poll_s`:
    the device loop's token reads poll their event at that interval instead of a blocking wait (`TokenRing`).
    `pick`: how each decode token is picked (default greedy), warm-up and timed tokens alike."""
    opts = dataclasses.replace(options or EngineOptions(), mode=mode, device=device)
    pick = GumbelPick(pick.temperature, pick.top_p, pick.seed) if isinstance(pick, GumbelPick) else pick or GREEDY
    #                                       (a fresh draw counter: every run draws the same stream from its seed)
    with Engine.open(packed, plan, opts, replay=replay) as eng:
        m, store, ex = eng.model, eng.store, eng.experts
        dev = m.device
        cold = sorted({str(store.folder / store.entries[j][e].file) for j, l in enumerate(eng.plan.layers)
                       for e in l.nvme})
        cache_before = _page_cache(cold)
        V = m.cfg.vocab
        rng = np.random.default_rng(seed)
        chunk = eng.plan.prefill_chunk
        runner = m.step_runner
        ahead = getattr(runner, "ahead", False)
        k = runner.k if ahead else 1                  # tokens a launch (the host reads them together)
        blocks = -(-tokens // k)                      # timed launches: `tokens` rounded up to whole launches
        tokens = blocks * k
        warm = warmup if k == 1 else max(2, -(-warmup // k))   # launches; a block's graph captured before timing
        # the prompt's length leaves room for the decode steps at the options' tokens a launch, whether or not this
        # plan's step chains them (a plan whose step cannot has k = 1): the same prompt for every run of a budget
        kk = opts.tokens_per_graph
        n_prefill = min(chunk, max(1, m.context - (-(-tokens // kk) * kk + max(warmup, 2 * kk) + 2 * kk) - 1) // 2)
        # ---- prefill: one warm-up chunk, one timed chunk ---------------------------------------------
        m.reset()
        m.prefill(rng.integers(0, V, n_prefill).tolist(), chunk)
        _sync(dev)
        m.reset()                                     # the decode's context is the prompt alone, not the warm-up chunk
        prompt = list(prompt) if prompt else rng.integers(0, V, n_prefill).tolist()
        t0 = time.perf_counter()
        logits = m.prefill(prompt, chunk)
        _sync(dev)
        prefill_s = time.perf_counter() - t0
        # ---- decode ------------------------------------------------------------------------------------
        tok = logits.argmax().reshape(1)
        fed = [int(tok)]                              # every token a decode step was given, in order
        for i in range(warm):
            tok = m.decode_block(tok[-1:], k, pick=pick)
            fed += tok.tolist()                       # (a host read a warm-up launch: untimed)
            ex.check()                                # a stager error (or a wait that timed out) stops here too
            if progress:
                progress("warm-up", (i + 1) * k, warm * k)
        counted_from = len(fed) - 1                   # the steps counted below are given fed[counted_from:]
        store.reset_counters()
        if runner is not None:
            runner.timing = True
            runner.split()
            launch0 = runner.launch_s
        per, out_ids = [], []
        ring = TokenRing(width=k, poll_s=ring_poll_s) if ahead else None
        cpu0 = time.thread_time()                     # the decode thread's CPU time (its waits sleep: blocking events)
        t_all = time.perf_counter()
        if ahead:
            tok = m.decode_block(tok[-1:], k, pick=pick)
            ring.push(tok)
        t1 = t_all
        parts_cpu = dict.fromkeys(("step", "push", "pop"), 0.0)     # the decode thread's CPU time by part
        for i in range(blocks):
            if ahead:                                 # launch i+1 queued before launch i's tokens are read
                c0 = time.thread_time()
                tok = m.decode_block(tok[-1:], k, pick=pick)
                c1 = time.thread_time()
                ring.push(tok)
                c2 = time.thread_time()
                out_ids += ring.pop()                 # launch i's tokens on the host: done, not the next launch
                parts_cpu["step"] += c1 - c0
                parts_cpu["push"] += c2 - c1
                parts_cpu["pop"] += time.thread_time() - c2
            else:
                tok = m.decode_step(tok, pick=pick)
                if dev.type == "cuda":
                    done = torch.cuda.Event(blocking=True)
                    done.record()
                    done.synchronize()
                out_ids.append(int(tok))              # the token on the host: its GPU work is done
            ex.check()                                # a stager error: one line, no more tokens
            t2 = time.perf_counter()
            per.append((t2 - t1) / k)                 # a token's share of its launch
            t1 = t2
            if progress:
                progress("decode", (i + 1) * k, tokens)
        wall = time.perf_counter() - t_all
        host_cpu = time.thread_time() - cpu0
        last = ring.pop() if ahead else []            # the launch queued past the last timed one
        steps = tokens + k * int(ahead)               # decode steps run while counting
        fed = (fed + out_ids + last)[:counted_from + steps]
        split = runner.split() if runner is not None else {"steps": 0}
        launch_s = (runner.launch_s - launch0) / steps if runner is not None else None
        c = store.counter_data()
        parts = runner.time_parts() if runner is not None and runner.graphs else None
        n = steps                                     # per-token figures: counted over the steps run
        L = store.n_layers
        med = statistics.median(per)
        return {
            "mode": mode,
            "loop": "device",                   # the engine's decode loop (`strata-plan calibrate` reads it)
            "tokens": out_ids,                  # the timed tokens (greedy or `pick`'s): the modes must agree
            # the text the decode ran on: the prompt, then the token each decode step was given (warm-up steps first;
            # the counters cover the steps given fed[counted_from:]): its routing, teacher-forced, is the run's own
            "context": {"prompt": prompt, "fed": fed, "counted_from": counted_from},
            "pick": getattr(pick, "key", "greedy"),
            "tokens_per_graph": k,              # decode tokens a launch ran (the host read them together)
            # how the NVMe stager read (a plan with an NVMe tier; threads where the kernel refused AIO)
            "stager_io": store.staging.stager.io if store.staging is not None else opts.stager_io,
            # where the NVMe lookahead took its guesses ("attention": at each layer's router, with its request)
            "lookahead_point": "attention" if store.staging is not None and store.staging.early else "output",
            # which depths' NVMe guesses the stager read ("all", or "deepest": the plan's depth alone)
            "stage_depths": opts.stage_depths,
            "device": str(dev),                 # where the experts were computed (the engine's device)
            "measured": {
                "decode_tok_s": 1.0 / med, "decode_tok_s_mean": tokens / wall,
                "prefill_tok_s": len(prompt) / prefill_s, "prefill_tokens": len(prompt),
                "decode_s_per_token": {"median": med, "p10": float(np.percentile(per, 10)),
                                       "p90": float(np.percentile(per, 90))},
            },
            # nvme: read from the drive; staged: read in place from the pinned staging cache
            "bytes_per_token": {"ram": c["bytes_from"]["ram"] / n, "nvme": c["bytes_from"]["nvme"] / n,
                                "staged": c["staged_bytes"] / n, "prefetch": c["prefetch_bytes"] / n,
                                "pcie": (c["bytes_from"]["ram"] + c["staged_bytes"]) / n,
                                "wasted": c["wasted_bytes"] / n, "dense": sum(c["dense_bytes"].values()) / n,
                                # the stager's wrong guesses: drive reads no layer used (NVMe tier)
                                "nvme_wasted": store.staging.last["wasted_bytes"] / n if store.staging is not None
                                else None},
            "links": {"pcie_gbps_wall": (c["bytes_from"]["ram"] + c["staged_bytes"]) / wall / 1e9,
                      "nvme_gbps_wall": c["bytes_from"]["nvme"] / wall / 1e9},     # the stager's reads
            "time_per_token": {"host_cpu_s": host_cpu / n,      # the decode thread's CPU time (time.thread_time)
                               # ... in the step call, its token copy queued, its token read
                               "host_cpu_parts_s": {k: v / tokens for k, v in parts_cpu.items()} if ahead else None,
                               "step_launch_host_s": launch_s,          # the step call's wall time on the host
                               "stage_wait_s": c["stage_wait_s"] / n,   # the GPU polling the stager
                               "per_moe_layer_s": med / L,
                               # the step's GPU time (CUDA events, graphs only)
                               "device_compute_s": split["compute_s"] / split["steps"] if split["steps"] else None},
            # GPU seconds of a step replayed alone, and of the step without its MoE calls
            "device_step": parts,
            "graphs": bool(runner is not None and runner.graphs),
            # the NVMe tier's files in the page cache (mincore), after start-up and after the run: a cold tier
            "page_cache": {"files": len(cold), "before": cache_before, "after": _page_cache(cold)},
            # the stager's counters, and its demand reads a token (GPU wait a token / these: the wait a read)
            "stager": None if store.staging is None else dict(store.staging.last, tokens=n,
                                                               demand_reads_per_token=store.staging.last["reads_demand"] / n),
            "pinned": store.pinned_info(),
            "counters": {k: v for k, v in c.items() if k != "layers"},
            "hit_rate": c["hit_rate"], "resident_hit_rate": c["resident_hit_rate"],
            "replay": None if replay is None else replay.source,
            "plan": {"prefetch_depth": eng.plan.prefetch_depth, "cache_slots": eng.plan.cache.total_slots,
                     "n_moe_layers": L, "predicted": eng.plan.predicted.decode_tok_s, **_plan_record(plan)},
        }


def _page_cache(files: list[str]) -> float | None:
    """The largest share of any file's pages in the page cache (None: no files)."""
    from .directio import page_cache_residency
    return max((page_cache_residency(f) for f in files), default=None)


def _plan_record(plan) -> dict:
    """What `strata-plan calibrate` re-predicts the run from: the plan file's path and sha256 (when a path
    was given) and the whole plan as written (before the mode's baseline)."""
    if isinstance(plan, (str, Path)):
        path = os.path.abspath(plan)
        return {"path": path, "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
                "data": to_data(load_plan(path))}
    return {"path": "", "sha256": "", "data": to_data(plan)}
