"""Measure a profile's calibration constants from engine runs (`strata-plan calibrate`).

    runs, notes = read_runs(["bench.json", "benchmarks/results/engine-....json"])
    fit = calibrate(runs, load_profile("h200"), sources="bench.json")      # -> Fit; fit.profile to save

A run is what `engine.bench.measure` returns: the mode, the measured seconds per decode token (median), the GPU
seconds of the device loop's step without its MoE calls (`device_step.without_moe_s`, graphed runs on a GPU), the
number of MoE layers and the plan (its file's path and sha256, and the plan itself). Three file shapes hold runs: the
bare dict (`strata-plan bench --json`), a results file with one under `run` (`bench --results`) and one with a
mapping of them under `runs` (or `results`) (`benchmarks/bench_engine.py`). Host-loop runs (`"loop": "host"`, or
neither `loop` nor `device_step` recorded) are skipped with a note naming their file.

Nothing is fitted; a constant is written only where the runs measure it:
- `layer_overhead_us`: per run that timed its step without the MoE calls, (t_nonMoE - the cost model's non-MoE
  seconds, `CostModel.non_moe_seconds`) / decoder layers, at the profile's `hbm_efficiency`; their mean.
- `stager_wake_us`, `stager_read_us` (runs whose NVMe stager read on demand): from its counters of a demand
  read's queue time by its turn in its request (`stager_host_us`), over the runs that read through AIO where any
  did (the engine's default), else the reader threads' runs; `stager_publish_us` from the same counters where they
  time a read's landing (a demand read's time to its ready word less its time to its last part in).
- Left at the profile's values: `hbm_efficiency`, `prefetch_overlap`, `moe_round_trip_us`, `host_fetch_us` (the
  last three price the copy path of several-GPU placements, the round trip also prefill's), `compute_efficiency`
  (decode at batch 1 is never compute-bound), `copy_overlap` (the profiler measures it), `dense_stream_efficiency`.
The measured constant is marked `measured` with today's date and the bench files as source; each run is
re-predicted before and after. `check` predicts other runs (another model's, never those measured on) with the
constants: the cross-model check.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strata_plan.errors import UserError


@dataclass(frozen=True)
class Run:
    name: str               # file:run
    file: str
    mode: str
    plan: object            # core.plan.Plan, as written (before the mode's baseline)
    plan_where: str         # where the plan came from, for messages
    measured_s: float       # median seconds per decode token
    n_moe: int
    nonmoe_s: float | None = None   # the device loop's step without its MoE calls, GPU seconds (`device_step`)
    gates: bool = True      # the run computed its lookahead gates (False: routing replayed, the replay's guesses)
    stager: dict | None = None   # the NVMe stager's counters (engine.stager.StagerCounters.to_data), if it ran
    stager_io: str = "threads"   # how it read ("aio" or "threads"; files before the record: threads)


@dataclass(frozen=True)
class Constant:
    name: str
    before: float
    after: float
    how: str                # "measured directly: ...", or why it was left alone
    measured: bool          # measured by the runs and written into the profile


@dataclass(frozen=True)
class RunFit:
    run: Run
    before_s: float         # predicted with the profile's constants
    after_s: float          # predicted with the measured ones
    overhead_us: float | None = None    # the per-layer overhead its step without the MoE calls measured

    @property
    def residual(self) -> float:
        return self.after_s / self.run.measured_s - 1.0


@dataclass(frozen=True)
class Fit:
    profile: object         # HardwareProfile with the measured calibration
    constants: tuple[Constant, ...]
    runs: tuple[RunFit, ...]

    @property
    def rms_residual(self) -> float:
        return math.sqrt(sum(r.residual ** 2 for r in self.runs) / len(self.runs))


# ---- reading bench files ------------------------------------------------------------------------------
def _is_run(d) -> bool:
    return isinstance(d, dict) and "measured" in d and "time_per_token" in d


def runs_in(data, where: str) -> list[tuple[str, dict]]:
    """(name, run dict) of every run in one bench file's JSON."""
    if _is_run(data):
        return [("", data)]
    if isinstance(data, dict):
        if _is_run(data.get("run")):
            return [("run", data["run"])]
        for key in ("runs", "results"):
            v = data.get(key)
            if isinstance(v, dict) and v and all(_is_run(r) for r in v.values()):
                return list(v.items())
            if isinstance(v, list) and v and all(_is_run(r) for r in v):
                return [(f"{key}[{i}]", r) for i, r in enumerate(v)]
    raise UserError(where, "", "holds no engine run (a dict with `measured` and `time_per_token`, or such dicts "
                    "under `run`, `runs` or `results`)", "pass the JSON of `strata-plan bench --json` or a "
                    "benchmarks/results/engine-*.json or bench-*.json file")


def _field(run: dict, dotted: str, where: str, prefix: str, kind=float):
    v = run
    for part in dotted.split("."):
        if not isinstance(v, dict) or part not in v:
            raise UserError(where, prefix + dotted, "missing", "pass a bench file written by this version of "
                            "`strata-plan bench` (engine/bench.py measure())")
        v = v[part]
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
        raise UserError(where, prefix + dotted, f"{v!r} is not a non-negative number", "pass an unedited bench file")
    if kind is str and not isinstance(v, str):
        raise UserError(where, prefix + dotted, f"{v!r} is not a string", "pass an unedited bench file")
    return v


def _sha256_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _local(path: str, folders: list[Path]) -> list[Path]:
    """`path` as recorded, then each trailing part of it under each folder (a plan recorded on another machine,
    e.g. /root/strata-plan/benchmarks/data/plan.yaml found as benchmarks/data/plan.yaml here)."""
    p = Path(path)
    out = [p] if p.is_file() else []
    parts = p.parts[1:] if p.is_absolute() else p.parts
    for i in range(len(parts)):
        for f in folders:
            q = f.joinpath(*parts[i:])
            if q.is_file() and q not in out:
                out.append(q)
    return out


def _plan_of(rec: dict, where: str, prefix: str, override: str | None, folders: list[Path]):
    """(Plan, where) of a run: `override` (--plan NAME=PATH), the recorded file (sha256 checked), or the plan
    recorded in the run, its input paths found here like the plan file."""
    from strata_plan.core.plan import SCHEMA_NAME, Plan, _with_paths, load_plan
    from strata_plan.schema import parse
    if override:
        return load_plan(override), override
    path, sha = rec.get("path") or "", rec.get("sha256") or ""
    for p in _local(path, folders) if path else []:
        if not sha or _sha256_file(p) == sha:
            return load_plan(p), str(p)
    data = rec.get("data")
    if isinstance(data, dict) and data.get("schema") == SCHEMA_NAME:
        name = f"{where} {prefix}plan.data"
        plan = parse(Plan, data, name)

        def here(p: str) -> str:
            found = _local(p, folders)
            return str(found[0]) if found else p
        return _with_paths(plan, here), name
    raise UserError(where, prefix + "plan.path", f"the run's plan {path or '(none recorded)'} is not here"
                    + (" with the recorded sha256" if path and sha else "") + " and the run holds no plan",
                    "pass --plan NAME=PATH (NAME: the run's name in the file, or the part before its '/')")


def require_gpu(profile, flag: str = "--profile") -> None:
    """Refuse a profile without a GPU: each run is re-predicted on the profile's GPU, and the constants measured are
    those of a machine whose GPU ran the plans."""
    if profile.gpu is None:
        raise UserError(flag, profile.name, "the profile has no GPU to re-predict the runs on (the cost model "
                        "predicts a GPU running the plans)", "pass the profile of the machine the runs were "
                        "measured on, one with a GPU (a shipped one such as rtx-4090, or `strata-plan profile` there)")


def _loop(r: dict) -> str:
    """The decode loop a run ran: its `loop`; without one, "device" where it records `device_step` (bench files
    from before the device loop record neither)."""
    return r.get("loop") or ("device" if "device_step" in r else "host")


def read_runs(paths, plans: dict[str, str] | None = None, find=()) -> tuple[list[Run], list[str]]:
    """(every device-loop run in the bench files `paths`, a note per file whose host-loop runs were skipped).
    `plans`: run name (or its prefix before '/') -> plan file, for files that do not record their plans (results
    written before engine/bench.py recorded them). `find`: more folders where the files a recorded plan names (model
    config, statistics) are looked for."""
    from strata_plan.core.modes import MODES
    plans = plans or {}
    out: list[Run] = []
    notes: list[str] = []
    skipped: list[str] = []                   # files with host-loop runs
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise UserError(str(path), "", "file not found", "pass a bench JSON file")
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(str(path), "", f"not JSON ({e.__class__.__name__})", "pass a bench JSON file") from None
        folders = [Path.cwd(), p.resolve().parent, *(Path(f) for f in find)]
        host = []
        for name, r in runs_in(data, str(path)):
            prefix = f"{name}." if name else ""
            loop = _loop(r)
            if loop == "host":
                host.append(name or p.name)
                continue
            if loop != "device":
                raise UserError(str(path), prefix + "loop", f"{loop!r} is not a decode loop", "pass an unedited bench file")
            mode = _field(r, "mode", str(path), prefix, str)
            if mode not in MODES:
                raise UserError(str(path), prefix + "mode", f"{mode!r} is not a mode", f"one of {', '.join(MODES)}")
            med = _field(r, "measured.decode_s_per_token.median", str(path), prefix)
            n_moe = _field(r, "plan.n_moe_layers", str(path), prefix)
            if med <= 0 or n_moe < 1 or n_moe != int(n_moe):
                raise UserError(str(path), prefix + ("plan.n_moe_layers" if med > 0 else
                                                     "measured.decode_s_per_token.median"),
                                "must be positive (a whole number of layers)", "pass an unedited bench file")
            override = plans.get(name) or plans.get(name.split("/")[0]) or (plans.get("") if len(plans) == 1 else None)
            plan, plan_where = _plan_of(r["plan"], str(path), prefix, override, folders)
            if len(plan.layers) != n_moe:
                raise UserError(str(path), prefix + "plan.n_moe_layers", f"{int(n_moe)}, but the plan "
                                f"{plan_where} has {len(plan.layers)} MoE layers", "pass the plan the run executed")
            step = r.get("device_step") or {}
            nonmoe = (_field(r, "device_step.without_moe_s", str(path), prefix)
                      if step.get("without_moe_s") is not None else None)
            out.append(Run(f"{p.name}:{name}" if name else p.name, str(path), mode, plan, plan_where, float(med),
                           int(n_moe), None if nonmoe is None else float(nonmoe), r.get("replay") is None,
                           r.get("stager") if isinstance(r.get("stager"), dict) else None,
                           str(r.get("stager_io") or "threads")))
        if host:
            skipped.append(str(path))
            notes.append(f"{path}: skipped {len(host)} host-loop run{'s' if len(host) > 1 else ''} "
                         f"({', '.join(host)}): the engine runs the device loop only")
    if not out:
        if skipped:
            raise UserError(skipped[0], "loop", "every run is a host-loop run (the engine runs "
                            "the device loop only)", "pass runs of this version's `strata-plan bench`")
        raise UserError("BENCH.json", "", "no runs given", "pass at least one bench file")
    return out, notes


# ---- measuring -----------------------------------------------------------------------------------------
def _with_calibration(profile, **figures):
    return dataclasses.replace(profile, calibration=dataclasses.replace(profile.calibration, **figures))


class _Predictor:
    """Predicted seconds per decode token of each run at given constants (one Problem per distinct plan)."""

    def __init__(self, runs: list[Run], profile):
        from strata_plan.core.plan import sha256_of
        from strata_plan.planner.repredict import plan_problem
        from strata_plan.schema import to_data
        self.runs, self.problems, self.keys = runs, {}, [sha256_of(to_data(r.plan)) for r in runs]
        for r, key in zip(runs, self.keys):
            if key not in self.problems:
                try:
                    self.problems[key] = plan_problem(r.plan, profile, r.plan_where)
                except UserError as e:
                    raise UserError(r.file, f"{r.name.split(':', 1)[-1]}.plan" if ":" in r.name else "plan",
                                    f"cannot re-predict its plan ({e.line()})", "pass --plan NAME=PATH, the plan "
                                    "file the run executed, with its statistics beside it") from None

    def layer_overheads_us(self, profile) -> list[float | None]:
        """Per run (None: it did not time its step without the MoE calls): (t_nonMoE - the cost model's non-MoE
        seconds without overhead) / decoder layers, in us, at `profile`'s rates (at least 0)."""
        from strata_plan.core.modes import baseline
        from strata_plan.planner.cost import CostModel
        from strata_plan.planner.placement import placement_of
        out: list[float | None] = []
        for r, k in zip(self.runs, self.keys):
            if r.nonmoe_s is None:
                out.append(None)
                continue
            prob = self.problems[k].replace(profile=profile)
            free = CostModel(prob).non_moe_seconds(placement_of(baseline(r.plan, r.mode)))
            out.append(max(0.0, (r.nonmoe_s - free) / prob.spec.n_layers * 1e6))
        return out

    def seconds(self, profile) -> np.ndarray:
        from strata_plan.planner.repredict import predict_plan
        return np.array([1.0 / predict_plan(r.plan, profile, r.mode, problem=self.problems[k], gates=r.gates).decode_tok_s
                         for r, k in zip(self.runs, self.keys)])


def _figure(value: float, sources: str, how: str):
    from strata_plan.profiles.schema import Figure
    return Figure(float(value), "measured", f"strata-plan calibrate ({how}) from {sources}",
                  _dt.date.today().isoformat())


def stager_host_us(counters) -> tuple[float, float, float | None, int] | None:
    """(wake, read, publish, demand reads) in us, the NVMe stager's host time measured by runs' stager counters (each
    `StagerCounters.to_data()`, or None), or None where none counted demand reads by their turn: a request's k-th
    demand read (k = 0, 1, ..) started q_k after the poller queued it; wake = q_0 plus half the poller's mean gap
    between looks (when the request came within it), read = the slope of q_k over k (least squares, weighted by the
    reads of each turn, every run pooled); publish = a demand read's mean time to its ready word less its time to
    its last part in (weighted by the runs' demand reads; None where no run timed the landing)."""
    k, q, w, wake, n0, pub, n_pub = [], [], [], 0.0, 0, 0.0, 0
    for st in counters:
        st = st or {}
        ranks, counts = st.get("demand_queue_ms_by_rank") or [], st.get("demand_reads_by_rank") or []
        if not ranks or len(counts) != len(ranks) or not counts[0]:
            continue
        wake += counts[0] * (ranks[0] + 0.5 * float(st.get("poll_gap_ms_mean") or 0.0)) * 1e3
        n0 += counts[0]
        k += list(range(len(ranks)))
        q += [v * 1e3 for v in ranks]
        w += list(counts)
        if st.get("demand_land_ms_mean") is not None:
            pub += sum(counts) * (st["demand_read_ms_mean"] - st["demand_land_ms_mean"]) * 1e3
            n_pub += sum(counts)
    if not n0 or len(set(k)) < 2:
        return None
    kk, qq, ww = (np.array(v, dtype=float) for v in (k, q, w))
    km = np.average(kk, weights=ww)
    slope = float(np.sum(ww * (kk - km) * (qq - np.average(qq, weights=ww))) / np.sum(ww * (kk - km) ** 2))
    return wake / n0, max(0.0, slope), max(0.0, pub / n_pub) if n_pub else None, int(ww.sum())


def calibrate(runs: list[Run], profile, sources: str) -> Fit:
    """The constants the runs measure (module docstring), the rest of `profile`'s calibration kept."""
    require_gpu(profile)
    cal = profile.calibration
    pred = _Predictor(runs, profile)
    before = pred.seconds(profile)
    per_run = pred.layer_overheads_us(profile)
    overheads = [o for o in per_run if o is not None]
    if not overheads:
        raise UserError(runs[0].file, "device_step.without_moe_s", "no run timed its step without the MoE calls, "
                        "which measures the per-layer overhead", "add a run of `strata-plan bench` on a GPU (its "
                        "graphed device loop times the step without its MoE calls)")
    o = float(np.mean(overheads))
    how = (f"measured directly: GPU time per decoder layer beyond its bytes and FLOPs, from the device loop's step "
           f"without its MoE calls, {min(overheads):.1f}-{max(overheads):.1f} us over {len(overheads)} runs")
    prof = _with_calibration(profile, layer_overhead_us=_figure(o, sources, how))
    left = "left alone: "
    # the stager's host time is its way of reading's: the AIO runs where any (the engine's default), else the threads'
    io = "aio" if any(r.stager_io == "aio" and r.stager for r in runs) else "threads"
    stager = stager_host_us([r.stager for r in runs if r.stager_io == io])
    none = left + "no run read from NVMe on demand (the stager's counters)"
    if stager is None:
        stager_rows = tuple(Constant(name, v, v, none, False) for name, v in (
            ("stager_wake_us", cal.stager_wake.value), ("stager_read_us", cal.stager_read.value),
            ("stager_publish_us", cal.stager_publish.value)))
    else:
        wake, read, publish, n = stager
        hw = (f"measured directly: a request's first demand read started after it, and the poller's half gap, over "
              f"{n} demand reads (stager io {io})")
        hr = f"measured directly: the slope of a demand read's start over its turn in its request, {n} reads ({io})"
        prof = _with_calibration(prof, stager_wake_us=_figure(wake, sources, hw),
                                 stager_read_us=_figure(read, sources, hr))
        stager_rows = (Constant("stager_wake_us", cal.stager_wake.value, wake, hw, True),
                       Constant("stager_read_us", cal.stager_read.value, read, hr, True))
        if publish is None:
            stager_rows += (Constant("stager_publish_us", cal.stager_publish.value, cal.stager_publish.value,
                                     left + "no run timed its demand reads' landing", False),)
        else:
            hp = f"measured directly: a demand read's time to its ready word less its time to its last part in ({io})"
            prof = _with_calibration(prof, stager_publish_us=_figure(publish, sources, hp))
            stager_rows += (Constant("stager_publish_us", cal.stager_publish.value, publish, hp, True),)
    after = pred.seconds(prof)
    copy_path = "prices the copy path (several-GPU placements, predictions only)"
    constants = (
        Constant("layer_overhead_us", cal.layer_overhead_us.value, o, how, True),
        *stager_rows,
        Constant("hbm_efficiency", cal.hbm_efficiency.value, cal.hbm_efficiency.value, left + "not fitted; the "
                 "per-layer overhead is measured at this value", False),
        Constant("prefetch_overlap", cal.overlap.value, cal.overlap.value, left + "not fitted; it " + copy_path, False),
        Constant("moe_round_trip_us", cal.round_trip.value, cal.round_trip.value, left + "device-loop runs make no "
                 "round trip at decode; it " + copy_path + " and prefill's round trips", False),
        Constant("host_fetch_us", cal.host_fetch.value, cal.host_fetch.value, left + "device-loop runs issue no "
                 "fetches from the host; it " + copy_path, False),
        Constant("compute_efficiency", cal.compute_efficiency.value, cal.compute_efficiency.value, left +
                 "decode at batch 1 is never compute-bound, and a bench times one prefill chunk", False),
        Constant("copy_overlap", cal.copy_overlap.value, cal.copy_overlap.value, left + "the profiler measures it", False),
        Constant("dense_stream_efficiency", cal.dense_stream_efficiency.value, cal.dense_stream_efficiency.value,
                 left + "decode reads streamed dense weights in place; it prices their copies at prefill and "
                 "on several GPUs", False),
    )
    return Fit(prof, constants, tuple(RunFit(r, float(b), float(a), ov)
                                      for r, b, a, ov in zip(runs, before, after, per_run)))


def check(runs: list[Run], profile, calibration) -> list[tuple[Run, float]]:
    """(run, predicted seconds per token) for runs that were not measured on: each re-predicted with `profile`'s
    measured figures (a profile of the machine they ran on) and the measured `calibration`."""
    prof = dataclasses.replace(profile, calibration=calibration)
    return list(zip(runs, (float(x) for x in _Predictor(runs, prof).seconds(prof))))


def sources_text(paths) -> str:
    return ", ".join(os.path.basename(str(p)) for p in paths)
