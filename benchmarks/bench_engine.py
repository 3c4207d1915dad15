"""The engine on a synthetic kimi-k3.1-pro-shaped model (5 MoE layers), routing replayed from the skewed
prior: measured decode tok/s of each plan against the planner's prediction, and against the LRU-only and
on-demand baselines built from the same plan.

    python3 benchmarks/bench_engine.py --dir /root/kimi5 --out-dir $OUT [--tokens 48] [--warmup 32]

The plans (`tests/data/plan-kimi5-h200-{ramrich,seed}.yaml`) come from
`strata-plan plan --model kimi-k3.1-pro --moe-layers 5 --profile h200 --prior olmoe-like --trials 60 --seed 0
--context 1024 --vram-gb 11 --ram-gb 60 --nvme-gb 0` (RAM-rich: 48% of routed accesses from VRAM, static or the
30-slot LRU, the rest in place from pinned RAM; lookahead depth 1 with partial landing, predicted 104.8 tok/s on the
shipped h200 profile against 100.8 in its LRU-only mode) and `... --ram-gb 11.5 --nvme-gb 60` (the seed's budget;
planned for the engine, whose NVMe experts are staged in pinned RAM: 49% of routed accesses from VRAM, 14% pinned RAM,
37% NVMe, a 77-slot staging cache). Where a plan has no lookahead, `<plan>_forced_d<D>` runs the same budget at depth D
(--forced-depth-ramrich, --forced-depth; labelled forced: the planner did not choose it): the plan made by the same
command with `--depth D` where PLANS_DIR has it (`plan-kimi5-h200-seed-depth2.yaml`: within the budgets), else the
plan with its staging slots grown on top of them (`_plans.forced_depth`); in its mode `plan` only,
with the NVMe guesses taken at the layer's end (`--forced-points output`, the default) and/or at its router
(`attention`: `<forced>_router`, its plan file's staging.lookahead_point, predicted there too), and with --deepest
each such NVMe row again with the stager reading the plan's depth's guesses alone (`<forced>_deepest`, as the cost
model counts them; by default it reads every depth's),
against its plan's LRU-only row (`<forced>.plan_over_lru`); --copy-programs adds the same with the lookahead's copy kernel
at other block counts (`<forced>_p<N>`); --whole-landing runs every lookahead row (planned or forced) again with whole
experts only (`<name>_whole`: no partial landing, kernels.prefetch), mode `plan`, against its plan's LRU-only row. The packed folder is built each run (strata_plan/engine/synthetic.py, random weights in the
plans' formats) and dropped from the page cache. Routing: `engine.replay.Replay.from_prior("olmoe-like")`
with seed 11 (the plans' statistics were sampled with seed 0); its hit rates are inputs, not measurements
of a model. Per plan and mode: engine.bench.measure (decode tok/s = 1 / median seconds per token after
the warm-up), bytes per tier per token, host and GPU time a token; for the NVMe plan also a plain O_DIRECT read of the
same files at the store's reader count, interleaved. Rows `<plan>.<mode>.*` (RAM experts read in place, one CUDA graph
a token, the device LRU, lookahead copies on a side stream); each run's bound 1 / (t_nonMoE + B / R_zc) is measured in
the same run (`bound_rows`; with lookahead also the overlapped 1 / max(t_nonMoE, B / R_zc)), with whether the run gave
the tokens of the same budget with every routed expert static in VRAM (`<plan>.resident`, run first: nothing moves
bytes there, so its tokens are the reference; `.tokens_equal_resident`, and `.tokens_equal_resident_first` the
timed tokens it shares with it before the first difference, `.steps_equal_resident_first` the decode steps' inputs
from the prefill's argmax on, warm-up included (0: the prefill's logits already chose another token); `<plan>.resident_again`: the reference run once more, whether
its own tokens repeat). For a plan with an NVMe tier the bound is the drive's instead: a plain O_DIRECT read at
the stager's reads in flight and request size (one blob), measured after each run, a thread a request and through
native AIO with a blob's requests submitted together (`<plan>.plain_odirect_threads_gbps`, `_aio_gbps`: medians;
`<plan>.plain_odirect_gbps`: the median of the faster of the two at each of those interleaved repeats, min and max
beside it), over the NVMe bytes the run read a token that were used (`.nvme_gb_per_token`; wrong guesses apart,
`.nvme_wasted_gb_per_token`); each run records the page cache on the blob files before and after (mincore).
`--pinned-gb` adds the pinned-memory cost of a region that size against torch's pinned
allocator. Writes engine-<time>.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shutil
import signal
import statistics
import time
from pathlib import Path

import psutil
import torch

from _plans import forced_depth  # noqa: E402
from _result import on_timeout, record_failure, result_path, stager_latency, write_result  # noqa: E402

from strata_plan.engine.bench import measure  # noqa: E402
from strata_plan.engine.engine import EngineOptions  # noqa: E402
from strata_plan.kernels.prefetch import copy_programs  # noqa: E402
from strata_plan.engine.aio import available as aio_available  # noqa: E402
from strata_plan.engine.directio import page_cache_residency, plain_read_aio_gbps, plain_read_gbps  # noqa: E402
from strata_plan.engine.replay import Replay  # noqa: E402
from strata_plan.engine.store import default_stager_io, plan_readers  # noqa: E402
from strata_plan.engine.synthetic import pack_synthetic  # noqa: E402
from strata_plan.profiler.gpu import ZeroCopyProbe  # noqa: E402
from strata_plan.pinned import HostRegion  # noqa: E402
from strata_plan.core.plan import load_plan, save_plan  # noqa: E402
from strata_plan.planner.estimated import scale_links  # noqa: E402
from strata_plan.planner.repredict import predict_plan, with_calibration_of  # noqa: E402
from strata_plan.core.spec import load_spec  # noqa: E402
from strata_plan.profiles.schema import load_profile  # noqa: E402

PLANS_DIR = Path(__file__).resolve().parents[1] / "tests" / "data"     # the tests read the same plans
PLANS = {"ramrich": PLANS_DIR / "plan-kimi5-h200-ramrich.yaml", "seed": PLANS_DIR / "plan-kimi5-h200-seed.yaml"}


def replay_for(plan) -> Replay:
    """The runs' routing: the olmoe-like prior, seed 11 (the plans' statistics were sampled with seed 0)."""
    return Replay.from_prior("olmoe-like", len(plan.layers), plan.n_experts, plan.top_k, tokens=4096, seed=11)


def zero_copy_gbps(nbytes: float, reps: int = 20) -> tuple[float, float | None]:
    """GB/s of a kernel reading `nbytes` of registered pinned RAM in place (kernels.stream_read), the median of
    `reps` reads rotating over four buffers (no read served by the GPU's L2), after a warm-up and a checksum check
    (the profiler's probe, `profiler.gpu.ZeroCopyProbe`); and the share of its region on huge pages."""
    n = int(nbytes) // 4096 * 4096
    probe = ZeroCopyProbe(4 * n)
    huge = probe.region.huge_share()
    try:
        probe.check(n)
        times = []
        for i in range(reps + 3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            probe.read((i % 4) * n, n)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
    finally:
        probe.close()
    return n / statistics.median(times[3:]) / 1e9, huge


def stager_split(plan) -> int:
    """The plan's largest full-batch split of a blob into requests."""
    return max((r.split for r in (plan.staging.nvme_reads or {}).values()), default=1)


def stager_request(plan) -> tuple[int, int]:
    """(request bytes, requests in flight) of the stager's reads: the plan's slot (a blob of the largest format) in the
    plan's largest full-batch split, at the plan's largest queue depth (at least 4)."""
    return -(-plan.cache.slot_bytes // stager_split(plan) // 4096) * 4096, plan_readers(plan)


def plain_odirect(files, plan, r: dict) -> dict[str, float]:
    """GB/s of a plain O_DIRECT read of the blob files at the stager's request size and requests in flight, each way
    the stager may read: a thread a request, and (where the kernel has it) native AIO with a blob's requests
    submitted together, which the kernel may merge."""
    block, readers = stager_request(plan)
    got = {"threads": plain_read_gbps(files, block, threads=readers, nbytes=1 << 30)}
    if aio_available():
        got["aio"] = plain_read_aio_gbps(files, block, stager_split(plan), readers, nbytes=1 << 30)
    return got


def drive_as_measured(profile, plan, gbps: float):
    """`profile` (a HardwareProfile, name or path) with its drive's read surface scaled so that it reads `gbps` at the
    stager's request size and requests in flight (`stager_request`): the drive as a plain O_DIRECT read measured it
    while the runs went on (a virtual disk drifts between the profile and the runs), every other figure as it was."""
    prof = load_profile(profile) if isinstance(profile, str) else profile
    block, readers = stager_request(plan)
    return scale_links(prof, nvme=gbps / prof.nvme[0].rand_read.at(block, readers))


def pinned_cost(nbytes: float) -> dict:
    """RSS growth and seconds of `nbytes` page-locked as the store's RAM tier is (`pinned.HostRegion`) and by
    torch's pinned allocator, one after the other."""
    proc = psutil.Process()
    out = {}
    for name, make in (("region", lambda: HostRegion(int(nbytes), "cuda")),
                       ("torch", lambda: torch.empty(int(nbytes), dtype=torch.uint8, pin_memory=True))):
        gc.collect()
        rss0, t0 = proc.memory_info().rss, time.perf_counter()
        obj = make()
        dt = time.perf_counter() - t0
        grown = proc.memory_info().rss - rss0
        key = f"pinned_{nbytes / 1e9:.0f}gb.{name}"
        out[f"{key}.rss_over_size"], out[f"{key}.seconds"] = grown / nbytes, dt
        print(f"{nbytes / 1e9:.0f} GB pinned by {name}: RSS grew {grown / 1e9:.2f} GB ({grown / nbytes:.4f} of the size) "
              f"in {dt:.1f} s", flush=True)
        if name == "region":
            obj.close()
        del obj
        gc.collect()
        if name == "torch":
            torch.cuda.empty_cache()
            getattr(torch._C, "_host_emptyCache", lambda: None)()     # torch keeps freed pinned blocks cached
    return out


def complete_pack(folder: Path) -> bool:
    """Whether `folder` holds a whole pack: its index and every file it lists."""
    from strata_plan.engine.packed import load_index
    from strata_plan.errors import UserError
    try:
        load_index(folder)
        return True
    except (UserError, OSError, ValueError):
        return False


def first_difference(a: list, b: list) -> int:
    """How many leading tokens `a` and `b` share (the length of the shorter when one is the other's prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--warmup", type=int, default=32)
    ap.add_argument("--plans", default="ramrich,seed", help="names of the shipped plans, or NAME=PATH (a plan for "
                    "the packed folder in --dir: the CPU smoke test runs the fixture that way)")
    ap.add_argument("--modes", default="plan,lru,on-demand")
    ap.add_argument("--stager-io", default=None, choices=("aio", "threads"),
                    help="the NVMe stager's reads: Linux native AIO (default where the kernel has it) or reader threads "
                         "(EngineOptions.stager_io; an A/B between calls: compare each row's share of its drive bound)")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--deadline-s", type=float, default=0, help="start no further run after this many seconds "
                    "(the runs done are written; 0: no limit)")
    ap.add_argument("--profile", help="re-predict every plan and mode with this profile (one measured in the same "
                    "run: `strata-plan profile --quick`); default: the plans' own predictions (the shipped h200)")
    ap.add_argument("--calibration", help="with --profile: predict with the calibration constants of this profile "
                    "YAML (measured by `strata-plan calibrate` and committed before the run) and --profile's measured figures")
    ap.add_argument("--forced-depth", type=int, default=2, help="run the seed plan also with this lookahead depth "
                    "when the planner chose none (labelled forced; 0: not)")
    ap.add_argument("--forced-depth-ramrich", type=int, default=1, help="the same for the RAM-rich plan (its mode "
                    "`plan` only, against the RAM-rich plan's LRU-only row)")
    ap.add_argument("--forced-points", default="output", help="comma-separated points where a forced row's NVMe "
                    "guesses are taken (output: the layer's end; attention: its router, row `<forced>_router`), each "
                    "a row of its own, in this order (its plan file's staging.lookahead_point)")
    ap.add_argument("--deepest", action="store_true", help="also run each forced NVMe row with the stager reading "
                    "the plan's depth's guesses alone (`<forced>_deepest`, EngineOptions.stage_depths='deepest': what "
                    "the cost model counts; by default it reads every depth's)")
    ap.add_argument("--copy-programs", default="0", help="comma-separated thread blocks of the lookahead's copy "
                    "kernel, a forced row each (`_p<N>`; 0: the engine's default, no suffix)")
    ap.add_argument("--whole-landing", action="store_true", help="also run each lookahead row with the lookahead's "
                    "guesses read from their slots only whole (`_whole`: no partial landing)")
    ap.add_argument("--pinned-gb", type=float, default=0, help="also register a pinned region of this many GB as the "
                    "store registers its RAM tier, and allocate as much with torch's pinned allocator: RSS against size")
    a = ap.parse_args()
    predict_with = with_calibration_of(a.profile, a.calibration) if a.profile else None
    layer_times = load_profile(a.profile).gpu if a.profile else None    # its decode layer times (profile --models)
    paths = dict((k.split("=", 1)[0], Path(k.split("=", 1)[1])) if "=" in k else (k, PLANS[k]) for k in a.plans.split(","))
    plans = {k: load_plan(v) for k, v in paths.items()}
    forced: dict[str, str] = {}                            # a forced plan's name -> its plan's (its mode: plan only)
    programs: dict[str, int] = {}                          # a forced row's copy kernel blocks (0: the default)
    whole_only: set[str] = set()                           # forced rows without partial landing
    deepest: set[str] = set()                              # forced rows whose stager reads the deepest guesses alone
    for base, depth in (("ramrich", a.forced_depth_ramrich), ("seed", a.forced_depth)):
        if base in plans and depth and not plans[base].prefetch_depth:
            stem = f"{base}_forced_d{depth}"              # the same budget with a lookahead depth the planner did not pick
            saved = Path(a.out_dir or ".")                # its plan file a point (`_router`: at the router)
            saved.mkdir(parents=True, exist_ok=True)
            planned = PLANS_DIR / f"plan-kimi5-h200-{base}-depth{depth}.yaml"     # `strata-plan plan --depth`
            shipped = paths[base] == PLANS.get(base) and planned.exists()        # (only beside the shipped plan)
            plan = load_plan(planned) if shipped else forced_depth(plans[base], depth)
            for point in a.forced_points.split(","):
                at = stem + ("_router" if point == "attention" else "")
                at_plan = plan if plan.staging is None else dataclasses.replace(plan, staging=dataclasses.replace(
                    plan.staging, lookahead_point=None if point == "output" else point))
                at_path = saved / f"plan-kimi5-h200-{at}.yaml"
                save_plan(at_plan, at_path)
                for p in (int(x) for x in a.copy_programs.split(",")):
                    name = at + (f"_p{p}" if p else "")
                    plans[name], forced[name], paths[name], programs[name] = at_plan, base, at_path, p
                if a.deepest and any(l.nvme for l in plan.layers):
                    name = at + "_deepest"
                    plans[name], forced[name], paths[name], programs[name] = at_plan, base, at_path, 0
                    deepest.add(name)
    if a.whole_landing:                                    # every lookahead row again with whole landing only
        for name in [n for n, p in plans.items()
                     if p.prefetch_depth and programs.get(n, 0) == 0 and n not in deepest]:
            whole = f"{name}_whole"
            plans[whole], forced[whole], paths[whole], programs[whole] = plans[name], forced.get(name, name), \
                paths[name], 0
            whole_only.add(whole)
    first = next(iter(plans.values()))
    for k, p in plans.items():
        assert all(l.format_of(e) == l0.format_of(e) for l, l0 in zip(p.layers, first.layers)
                   for e in range(p.n_experts)), f"{k}: other formats"          # one packed folder serves them all
    folder = Path(a.dir)
    out, metrics = {}, {}
    skipped: list[str] = []
    errors: list[str] = []
    path = result_path("engine", a.out_dir)
    signal.signal(signal.SIGTERM, on_timeout)                    # `timeout`: still write what was measured

    def save() -> None:                                 # after every run: a crash or a kill keeps the runs done
        write_result("engine", metrics, out_dir=a.out_dir, path=path,
                     extra={"runs": out, "skipped_at_deadline": skipped, "errors": errors})

    def attempt(what: str, fn):
        """fn() or, if it raises, None with the error recorded (one line; the traceback on stderr): a run that fails
        on the GPU machine leaves the others."""
        try:
            return fn()
        except Exception as err:                        # noqa: BLE001 (recorded, the next run goes on)
            record_failure(errors, what, err)
            return None
        finally:
            gc.collect()                                # the run's engine (pinned RAM tier) goes before the next
            save()

    try:
        t0 = time.perf_counter()
        if not complete_pack(folder):                   # none, or a run cut off while packing or removing it
            shutil.rmtree(folder, ignore_errors=True)
            pack_synthetic(load_spec(first.model), folder, [{e: l.format_of(e) for e in range(first.n_experts)} for l in first.layers],
                           device="cuda" if torch.cuda.is_available() else "cpu")
        files = sorted(folder.glob("experts-*.bin"))
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        metrics["build_s"] = time.perf_counter() - t0
        a.stager_io = a.stager_io or default_stager_io()
        metrics["stager_io"] = a.stager_io
        print(f"packed {sum(f.stat().st_size for f in files) / 1e9:.1f} GB in {metrics['build_s']:.0f} s", flush=True)

        def late(what: str) -> bool:
            if a.deadline_s and time.perf_counter() - t0 > a.deadline_s:
                print(f"deadline: {what} not run", flush=True)
                skipped.append(what)
                return True
            return False

        refs: dict[str, list | None] = {}
        ref_fed: dict[str, list] = {}       # the reference's every decode step's input, the prefill's argmax first

        def resident_tokens(name: str, plan) -> list | None:
            """The timed tokens of `plan`'s budget with every routed expert static in VRAM (no tier, cache, lookahead
            or staging: nothing that moves bytes), the same replayed routing and prompt: what every run's tokens
            should be. Each run's `tokens_equal_resident` says whether it computed them."""
            if late(f"{name}/resident"):
                return None
            E = plan.n_experts
            whole = dataclasses.replace(plan, prefetch_depth=0, layers=tuple(
                dataclasses.replace(l, vram=tuple(range(E)), ram=(), nvme=(), cache_slots=0) for l in plan.layers),
                cache=dataclasses.replace(plan.cache, total_slots=0))
            r = attempt(f"{name}/resident", lambda: measure(folder, whole, mode="plan", tokens=a.tokens,
                                                            warmup=a.warmup, replay=replay_for(plan),
                                                            options=EngineOptions()))
            refs[name] = r["tokens"] if r is not None else None
            if r is not None:                           # twice: are the reference tokens themselves repeatable?
                ref_fed[name] = r["context"]["fed"]
                again = attempt(f"{name}/resident_again", lambda: measure(
                    folder, whole, mode="plan", tokens=a.tokens, warmup=a.warmup, replay=replay_for(plan),
                    options=EngineOptions()))
                if again is not None:
                    metrics[f"{name}.resident_again.tokens_equal_resident"] = float(again["tokens"] == refs[name])
                metrics[f"{name}.resident.decode_tok_s"] = r["measured"]["decode_tok_s"]
                metrics[f"{name}.resident.tokens_per_graph"] = r["tokens_per_graph"]
                metrics[f"{name}.resident.prefill_tokens"] = r["measured"]["prefill_tokens"]   # the runs' prompt length
                print(f"{name:8s} resident  decode {r['measured']['decode_tok_s']:8.2f} tok/s (every routed expert in "
                      f"VRAM: the reference tokens)", flush=True)
            return refs[name]

        def one(name: str, plan, mode: str) -> dict | None:
            if late(f"{name}/{mode}"):
                return None
            r = attempt(f"{name}/{mode}", lambda: measure(
                folder, paths[name], mode=mode, tokens=a.tokens, warmup=a.warmup, replay=replay_for(plan),
                options=EngineOptions(copy_programs=programs.get(name, 0), partial_landing=name not in whole_only,
                                      stager_io=a.stager_io, stage_depths="deepest" if name in deepest else "all")))
            if r is None:
                return None
            out[f"{name}/{mode}"] = r
            if name in programs and torch.cuda.is_available():      # the copy kernel's blocks this row ran
                metrics[f"{name}.copy_programs"] = programs[name] or copy_programs(torch.device("cuda"))
            if refs.get(name) is not None:              # the same routing with every expert in VRAM: the truth
                metrics[f"{name}.{mode}.tokens_equal_resident"] = float(r["tokens"] == refs[name])
                metrics[f"{name}.{mode}.tokens_equal_resident_first"] = first_difference(r["tokens"], refs[name])
                # from the prefill's own argmax on, warm-up steps included: where the runs part (0: the prefill)
                if name in ref_fed:
                    metrics[f"{name}.{mode}.steps_equal_resident_first"] = first_difference(r["context"]["fed"],
                                                                                            ref_fed[name])
            report(name, paths[name], plan, mode, r)
            return r

        def report(name: str, path: Path, plan, mode: str, r: dict) -> None:
            m = r["measured"]
            tp = r["time_per_token"]
            print(f"{name:8s} {mode:9s} decode {m['decode_tok_s']:8.2f} tok/s (predicted for the plan "
                  f"{r['plan']['predicted']:.2f}) hit {r['hit_rate']:.3f} resident {r['resident_hit_rate']:.3f} "
                  f"pcie {r['bytes_per_token']['pcie'] / 1e9:.3f} GB/tok; GPU {(tp['device_compute_s'] or 0) * 1e3:.2f} "
                  f"ms/tok, decode thread CPU {tp['host_cpu_s'] * 1e3:.3f} ms/tok (graphs {r['graphs']})", flush=True)
            for key in ("device_compute_s", "step_launch_host_s"):
                if tp[key] is not None:
                    metrics[f"{name}.{mode}.{key[:-2]}_ms_per_token"] = tp[key] * 1e3
            metrics[f"{name}.{mode}.decode_tok_s"] = m["decode_tok_s"]
            metrics[f"{name}.{mode}.host_ms_per_token"] = tp["host_cpu_s"] * 1e3     # decode thread CPU time
            metrics[f"{name}.{mode}.tokens_per_graph"] = r["tokens_per_graph"]       # tokens a launch: the host's share
            metrics[f"{name}.{mode}.prefill_tokens"] = m["prefill_tokens"]           # the prompt: as the resident run's
            for part, v in (tp.get("host_cpu_parts_s") or {}).items():     # where it goes: step call, copy, read
                metrics[f"{name}.{mode}.host_ms_per_token.{part}"] = v * 1e3
            if a.profile:
                pr = predict_plan(plan, predict_with, mode, where=str(path), gates=False)   # replayed
                r["predicted"] = {"profile": a.profile, "calibration": a.calibration, "decode_tok_s": pr.decode_tok_s,
                                  "decode_binding": pr.decode_binding, "bytes_per_token": pr.bytes_per_token,
                                  "decode_seconds": pr.decode_seconds}
                metrics[f"{name}.{mode}.predicted_decode_tok_s"] = pr.decode_tok_s
                metrics[f"{name}.{mode}.measured_over_predicted"] = m["decode_tok_s"] / pr.decode_tok_s
                print(f"{'':18s} predicted with {a.profile} (constants: {a.calibration or 'its own'}): {pr.decode_tok_s:.2f} tok/s ({pr.decode_binding}), "
                      f"measured / predicted {m['decode_tok_s'] / pr.decode_tok_s:.3f}", flush=True)
            metrics[f"{name}.{mode}.pcie_gb_per_token"] = r["bytes_per_token"]["pcie"] / 1e9
            metrics[f"{name}.{mode}.nvme_read_gb_per_token"] = r["bytes_per_token"]["nvme"] / 1e9   # from the drive
            metrics[f"{name}.{mode}.hit_rate_replayed"] = r["hit_rate"]
        def drive_measured_rows(name: str, plan, gbps: float) -> None:
            """Each measured row of a plan with an NVMe tier predicted again with the profile's drive scaled to this
            run's plain O_DIRECT rate (`drive_as_measured`): `predicted_drive_measured_decode_tok_s`, beside the
            prediction with the profile as measured before the runs."""
            prof = drive_as_measured(predict_with, plan, gbps)
            for mode in ("plan", "lru", "on-demand"):
                k = f"{name}.{mode}"
                if f"{k}.decode_tok_s" in metrics:
                    pr = predict_plan(plan, prof, mode, where=str(paths[name]), gates=False).decode_tok_s
                    metrics[f"{k}.predicted_drive_measured_decode_tok_s"] = pr
                    metrics[f"{k}.measured_over_predicted_drive_measured"] = metrics[f"{k}.decode_tok_s"] / pr
                    print(f"{name:8s} {mode:9s} predicted with the drive at this run's {gbps:.2f} GB/s plain read: "
                          f"{pr:.2f} tok/s, measured / predicted {metrics[f'{k}.decode_tok_s'] / pr:.3f}", flush=True)

        def nvme_bound_rows(name: str, mode: str, r: dict, plain: list[float]) -> None:
            """A run with an NVMe tier against the drive: the plain O_DIRECT rate (median of the repeats so
            far, interleaved with the runs) over the NVMe bytes read a token that a layer used; what the stager did."""
            bt, st, k = r["bytes_per_token"], r["stager"] or {}, f"{name}.{mode}"
            # the stager's wrong guesses (the lookahead's VRAM copies of RAM experts wasted are not drive reads)
            wasted = bt["nvme_wasted"] or 0.0
            used = bt["nvme"] - wasted
            rate = statistics.median(plain)
            metrics[f"{name}.plain_odirect_gbps"] = rate
            metrics[f"{name}.plain_odirect_gbps_min"], metrics[f"{name}.plain_odirect_gbps_max"] = min(plain), max(plain)
            metrics[f"{name}.plain_odirect_repeats"] = len(plain)
            metrics[f"{k}.nvme_gb_per_token"] = used / 1e9
            metrics[f"{k}.nvme_wasted_gb_per_token"] = wasted / 1e9
            metrics[f"{k}.staged_gb_per_token"] = bt["staged"] / 1e9
            if used > 0:
                metrics[f"{k}.bound_tok_s"] = rate * 1e9 / used
                metrics[f"{k}.over_bound"] = r["measured"]["decode_tok_s"] / metrics[f"{k}.bound_tok_s"]
            c = r["counters"]
            metrics[f"{k}.stage_wait_ms_per_token"] = r["time_per_token"]["stage_wait_s"] * 1e3
            metrics[f"{k}.staging_hit_rate"] = st.get("staging_hit_rate", 0.0)
            metrics.update({f"{k}.{m}": v for m, v in stager_latency(st).items()})
            for d, la in c["lookahead"].items():
                metrics[f"{k}.lookahead_d{d}.precision"] = la["precision"]
                metrics[f"{k}.lookahead_d{d}.recall"] = la["recall"]
            metrics[f"{k}.page_cache_before"] = r["page_cache"]["before"]
            metrics[f"{k}.page_cache_after"] = r["page_cache"]["after"]
            print(f"{name:8s} {mode:9s} {r['measured']['decode_tok_s']:.2f} tok/s = "
                  f"{metrics.get(k + '.over_bound', 0):.3f} of the drive's bound {metrics.get(k + '.bound_tok_s', 0):.2f} "
                  f"({used / 1e9:.3f} GB/tok used from NVMe, {wasted / 1e9:.3f} wasted, plain O_DIRECT {rate:.2f} GB/s); "
                  f"GPU waited {metrics[k + '.stage_wait_ms_per_token']:.2f} ms/tok; staging hits "
                  f"{metrics[k + '.staging_hit_rate']:.3f}; page cache {r['page_cache']['before']} -> "
                  f"{r['page_cache']['after']}; tokens equal to the resident run's: "
                  f"{metrics.get(k + '.tokens_equal_resident')} (steps shared from the prefill on: "
                  f"{metrics.get(k + '.steps_equal_resident_first')})", flush=True)

        def bound_rows(name: str, mode: str, r: dict, plain=None) -> None:
            """The run against its bound 1 / (t_nonMoE + B / R_zc): B the bytes read in place from pinned
            RAM a token (counted on the device), t_nonMoE the step's GPU time without its MoE calls and R_zc the
            zero-copy read rate at one layer's share of B, both measured now."""
            B = r["bytes_per_token"]["ram"]
            parts = r["device_step"]
            if parts is None:                                       # no graphs (a CPU run): nothing to bound
                return
            rate, huge = zero_copy_gbps(max(B / r["plan"]["n_moe_layers"], 1 << 20))
            bound = 1.0 / (parts["without_moe_s"] + B / (rate * 1e9))
            k = f"{name}.{mode}"
            metrics["zero_copy_gbps"] = rate                        # (the last run's; each run's below)
            metrics[f"{k}.zero_copy_gbps"] = rate
            metrics[f"{k}.zero_copy_huge_page_share"] = huge
            metrics[f"{k}.bound_tok_s"] = bound
            metrics[f"{k}.over_bound"] = r["measured"]["decode_tok_s"] / bound
            # with lookahead the link may overlap the rest of the step: 1 / max(t_nonMoE, B / R_zc), B every byte
            # that crossed the link (copies of guesses, wasted ones included)
            metrics[f"{k}.overlap_bound_tok_s"] = 1.0 / max(parts["without_moe_s"], B / (rate * 1e9))
            metrics[f"{k}.over_overlap_bound"] = r["measured"]["decode_tok_s"] / metrics[f"{k}.overlap_bound_tok_s"]
            metrics[f"{k}.prefetch_gb_per_token"] = r["bytes_per_token"]["prefetch"] / 1e9
            metrics[f"{k}.wasted_gb_per_token"] = r["bytes_per_token"]["wasted"] / 1e9
            metrics[f"{k}.t_nonmoe_ms"] = parts["without_moe_s"] * 1e3
            if layer_times is not None:        # the profile's layer times summed: the probe held to the engine
                spec = load_spec(r["plan"]["data"]["model"])
                lt = layer_times.layer_time(spec.layer_geometry)
                if lt is not None:
                    n_dense = spec.n_layers - spec.n_moe_layers
                    us = lt.head_us + n_dense * lt.dense_layer_us + spec.n_moe_layers * lt.moe_layer_us
                    metrics[f"{k}.t_nonmoe_from_layer_times_ms"] = us / 1e3
            metrics[f"{k}.step_gpu_ms"] = parts["step_s"] * 1e3
            metrics[f"{k}.replay_cpu_ms"] = parts["step_replay_cpu_s"] * 1e3     # host CPU launching the step's graph
            metrics[f"{k}.ram_gb_per_token"] = B / 1e9
            pin = r["pinned"]
            metrics[f"{name}.ram_tier_gb"] = pin["tier_bytes"] / 1e9
            metrics[f"{name}.ram_tier_pinned_over_size"] = pin["pinned_bytes"] / pin["tier_bytes"]
            metrics[f"{k}.ram_huge_page_share"] = pin["huge_page_share"]
            if pin.get("staging_huge_page_share") is not None:          # the staged blobs the GPU reads in place
                metrics[f"{k}.staging_huge_page_share"] = pin["staging_huge_page_share"]
            if pin.get("numa_node") is not None:
                metrics[f"{k}.ram_numa_node"] = pin["numa_node"]
            print(f"{name:8s} {mode:9s} {r['measured']['decode_tok_s']:.2f} tok/s = "
                  f"{metrics[k + '.over_bound']:.3f} of its bound {bound:.2f} (t_nonMoE {parts['without_moe_s'] * 1e3:.2f} ms, "
                  f"{B / 1e9:.3f} GB/tok in place at {rate:.1f} GB/s zero-copy; step alone {parts['step_s'] * 1e3:.2f} ms); "
                  f"tokens equal to the resident run's: {metrics.get(k + '.tokens_equal_resident')} (steps shared "
                  f"from the prefill on: {metrics.get(k + '.steps_equal_resident_first')})", flush=True)

        for name, plan in plans.items():
            nvme = any(l.nvme for l in plan.layers)
            plain: list[float] = []
            by_way: dict[str, list[float]] = {}
            if name in forced:                                # the same budget as its plan: the same reference
                refs[name] = refs.get(forced[name])
                if forced[name] in ref_fed:
                    ref_fed[name] = ref_fed[forced[name]]
            else:
                resident_tokens(name, plan)
            for mode in (["plan"] if name in forced else a.modes.split(",")):
                r = one(name, plan, mode)
                if r is None:
                    continue
                if nvme:
                    ways = plain_odirect(files, plan, r)               # interleaved with the runs
                    plain.append(max(ways.values()))                   # the faster way: the drive's best
                    for way, v in ways.items():
                        by_way.setdefault(way, []).append(v)
                        metrics[f"{name}.plain_odirect_{way}_gbps"] = statistics.median(by_way[way])
                attempt(f"{name}/{mode}/bound", lambda: (nvme_bound_rows if nvme else bound_rows)(name, mode, r, plain))
            if nvme and plain and a.profile:      # predicted again with the drive as this run's plain reads found it
                attempt(f"{name}/drive", lambda: drive_measured_rows(name, plan, statistics.median(plain)))
            metrics[f"{name}.predicted_decode_tok_s"] = plan.predicted.decode_tok_s     # the plan file's (its profile)
            if f"{name}.plan.decode_tok_s" in metrics:      # (`.plan.measured_over_predicted`: this call's profile)
                metrics[f"{name}.plan.measured_over_plan_file_predicted"] = (metrics[f"{name}.plan.decode_tok_s"]
                                                                             / plan.predicted.decode_tok_s)
            for other, key in (("on-demand", "ondemand"), ("lru", "lru")):   # plan / on-demand and / LRU-only,
                ratio = [f"{n}.{m}.decode_tok_s" for n, m in ((name, "plan"), (forced.get(name, name), other))]
                if all(k in metrics for k in ratio):                            # measured beside the cost model's
                    metrics[f"{name}.plan_over_{key}"] = metrics[ratio[0]] / metrics[ratio[1]]
                    if a.profile:
                        pr = [metrics[k.replace("decode_tok_s", "predicted_decode_tok_s")] for k in ratio]
                        metrics[f"{name}.plan_over_{key}_predicted"] = pr[0] / pr[1]
        metrics["page_cache_after"] = max(page_cache_residency(f) for f in files)
        if a.pinned_gb and torch.cuda.is_available() and not late("pinned cost"):
            metrics.update(pinned_cost(a.pinned_gb * 1e9))
    finally:
        save()
        if not a.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(metrics, indent=1))
    print(path, f"({len(errors)} runs failed)" if errors else "")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
