"""Fit a profile's calibration constants to measured engine runs (`strata-plan calibrate`).

    runs = read_runs(["bench.json", "benchmarks/results/engine-....json"])
    fit = calibrate(runs, load_profile("h200"), sources="bench.json")      # -> Fit; fit.profile to save

A run is what `engine.bench.measure` returns: the mode, the measured seconds per decode token (median), the
round trips' time per token (graphed runs: the compute stream's waits between router and MoE call less
the copy stream's busy time, in runs without lookahead or NVMe; older runs: host time in the round trips
and the store less the store's waits for fetches, which the cost model charges to the links), the number of MoE
layers and the plan (its file's path and sha256, and the plan itself). Three file shapes hold runs: the
bare dict (`strata-plan bench --json`), a results file with one under `run` (`bench --results`) and one with
a mapping of them under `runs` (or `results`) (`benchmarks/bench_engine.py`).

What the runs identify, and how each constant is fitted:
- `moe_round_trip_us`: measured directly, the mean over the runs that identify it of the round trips'
  time per token / MoE layers.
- `host_fetch_us`: measured directly in LRU-only runs, the store's host time less its waits over the experts
  it fetched (`_fetch_host`).
- `layer_overhead_us` from device-loop runs that timed their step without the MoE calls (`device_step`): measured
  directly, (t_nonMoE - the cost model's non-MoE seconds without it) / decoder layers (`CostModel.non_moe_seconds`),
  the mean over those runs, at the hbm_efficiency the least squares then fit alone (the non-MoE seconds depend on
  it, so the overhead follows it). Without such runs:
- `layer_overhead_us` (and `hbm_efficiency` where the runs separate it): least squares on decode seconds
  per token, predicted (`repredict.predict_plan`, the plan as the run executed it) against measured, each
  run's residual relative to its measurement so that every run counts alike; Gauss-Newton on the
  piecewise-linear prediction (the walk's maxima), with a numerical Jacobian and halved steps.
- `hbm_efficiency` is fitted only when its column of the Jacobian is not (nearly) parallel to the
  overhead's: runs of one model at one context move HBM time and per-layer overhead together.
- `prefetch_overlap` (the share of a prefetch's link time the engine hides) jointly with them, from the
  lookahead runs (mode `plan` at depth > 0), clamped to [0, 1] and started from 0 (near 1 a lookahead token
  is bound by the link's busy time, where it moves nothing). Each step is halved until it lowers the squares.
- Left alone: `compute_efficiency` (decode at batch 1 is never compute-bound; the prefill a bench times is
  one chunk shorter than the plan's and bound by the measured expansion rate), `copy_overlap` (measured by
  the profiler), `dense_stream_efficiency` (the engine keeps dense weights resident).
Fitted constants are marked `measured` with today's date and the bench files as source. `check` predicts
other runs (another model's, never those fitted on) with the fitted constants: the cross-model check.
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

COLLINEAR = 0.99        # |cos| between Jacobian columns above which the runs do not separate two constants


@dataclass(frozen=True)
class Run:
    name: str               # file:run
    file: str
    mode: str
    plan: object            # core.plan.Plan, as written (before the mode's baseline)
    plan_where: str         # where the plan came from, for messages
    measured_s: float       # median seconds per decode token
    host_s: float | None    # the round trips' seconds per token (`_round_trip_s`); None: not identified
    n_moe: int
    fetch_us: float | None = None   # host time per fetched expert (`_fetch_host`); None: not identified
    loop: str = "host"      # the engine's decode loop that ran (bench files before the device loop: host)
    nonmoe_s: float | None = None   # the device loop's step without its MoE calls, GPU seconds (`device_step`)
    gates: bool = True      # the run computed its lookahead gates (False: routing replayed, the replay's guesses)

    @property
    def round_trip_us(self) -> float | None:
        return None if self.host_s is None else self.host_s / self.n_moe * 1e6


@dataclass(frozen=True)
class Constant:
    name: str
    before: float
    after: float
    how: str                # "measured directly", "least squares", or why it was left alone
    fitted: bool


@dataclass(frozen=True)
class RunFit:
    run: Run
    before_s: float         # predicted with the profile's constants
    after_s: float          # predicted with the fitted ones

    @property
    def residual(self) -> float:
        return self.after_s / self.run.measured_s - 1.0


@dataclass(frozen=True)
class Fit:
    profile: object         # HardwareProfile with the fitted calibration
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


def _fetch_host(r: dict, where: str, prefix: str) -> tuple[float, float] | None:
    """(host seconds per fetched expert, fetches per token) of an LRU-only run without NVMe: the store's host time in
    `ensure` and the launch, less its waits for fetches, over the experts it fetched. None for other modes:
    with lookahead the store also issues and waits for prefetches, and on-demand runs are left out as
    planner/PLANNER.md's `host_fetch_us` row says."""
    if r.get("mode") != "lru" or (r.get("bytes_per_token") or {}).get("nvme", 0.0) > 0:
        return None                       # NVMe fetches also pay the reader threads' share of the lock
    fetches = sum((r.get("counters") or {}).get("fetches_from", {}).values())
    uses = (r.get("counters") or {}).get("uses", 0)
    per_token_uses = _field(r, "plan.n_moe_layers", where, prefix) * (r["plan"].get("data") or {}).get("top_k", 0)
    tokens = uses / per_token_uses if per_token_uses else 0
    if fetches <= 0 or tokens <= 0:
        return None
    n = fetches / tokens
    host = (_field(r, "time_per_token.store_and_launch_host_s", where, prefix)
            - _field(r, "time_per_token.store_wait_s", where, prefix))
    return max(0.0, host) / n, n


def _round_trip_s(r: dict, where: str, prefix: str) -> float | None:
    """The round trips' share of a token on the critical path, in seconds per token. Graphed runs (CUDA
    events on the compute stream): the compute stream's waits from each router's end to its MoE call, less
    what else fills them: the copy stream's busy time or, when the host was slower than the link, the
    store's host time issuing the fetches (`_fetch_host`); LRU-only runs without NVMe only (other modes
    also wait for prefetches or reads, or issue fetches at another host cost). Older runs: host time in
    the round trips and the store, less the store's waits for fetches."""
    tp = r.get("time_per_token") or {}
    if tp.get("device_wait_s") is not None:
        fh = _fetch_host(r, where, prefix)
        if fh is None:
            return None
        copy = _field(r, "links.copy_busy_s_per_token", where, prefix)
        return max(0.0, tp["device_wait_s"] - max(copy, fh[0] * fh[1]))
    return max(0.0, _field(r, "time_per_token.router_round_trip_s", where, prefix)
               + _field(r, "time_per_token.store_and_launch_host_s", where, prefix)
               - _field(r, "time_per_token.store_wait_s", where, prefix))


def require_gpu(profile, flag: str = "--profile") -> None:
    """Refuse a profile without a GPU: each run is re-predicted on the profile's GPU, and the constants fitted are
    those of a machine whose GPU ran the plans."""
    if profile.gpu is None:
        raise UserError(flag, profile.name, "the profile has no GPU to re-predict the runs on (the cost model "
                        "predicts a GPU running the plans)", "pass the profile of the machine the runs were "
                        "measured on, one with a GPU (a shipped one such as rtx-4090, or `strata-plan profile` there)")


def read_runs(paths, plans: dict[str, str] | None = None, find=()) -> list[Run]:
    """Every run in the bench files `paths`. `plans`: run name (or its prefix before '/') -> plan file, for
    files that do not record their plans (results written before engine/bench.py recorded them). `find`: more
    folders where the files a recorded plan names (model config, statistics) are looked for."""
    from strata_plan.core.modes import LOOPS, MODES
    plans = plans or {}
    out: list[Run] = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise UserError(str(path), "", "file not found", "pass a bench JSON file")
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(str(path), "", f"not JSON ({e.__class__.__name__})", "pass a bench JSON file") from None
        folders = [Path.cwd(), p.resolve().parent, *(Path(f) for f in find)]
        for name, r in runs_in(data, str(path)):
            prefix = f"{name}." if name else ""
            mode = _field(r, "mode", str(path), prefix, str)
            if mode not in MODES:
                raise UserError(str(path), prefix + "mode", f"{mode!r} is not a mode", f"one of {', '.join(MODES)}")
            loop = r.get("loop", "host")
            if loop not in LOOPS:
                raise UserError(str(path), prefix + "loop", f"{loop!r} is not a loop", f"one of {', '.join(LOOPS)}")
            med = _field(r, "measured.decode_s_per_token.median", str(path), prefix)
            host = _round_trip_s(r, str(path), prefix) if loop == "host" else None    # the device loop has none
            fh = _fetch_host(r, str(path), prefix) if (r.get("time_per_token") or {}).get("device_wait_s") is not None else None
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
            nonmoe = step.get("without_moe_s")
            out.append(Run(f"{p.name}:{name}" if name else p.name, str(path), mode, plan, plan_where, float(med),
                           None if host is None else float(host), int(n_moe),
                           None if fh is None else fh[0] * 1e6, loop, None if nonmoe is None else float(nonmoe),
                           r.get("replay") is None))
    if not out:
        raise UserError("BENCH.json", "", "no runs given", "pass at least one bench file")
    return out


# ---- fitting -----------------------------------------------------------------------------------------
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

    def layer_overheads_us(self, profile) -> list[float]:
        """Per device-loop run that timed its step without the MoE calls: (t_nonMoE - the cost model's non-MoE
        seconds without overhead) / decoder layers, in us, at `profile`'s rates (at least 0)."""
        from strata_plan.planner.cost import CostModel
        from strata_plan.planner.placement import placement_of
        from strata_plan.core.modes import baseline
        out = []
        for r, k in zip(self.runs, self.keys):
            if r.nonmoe_s is None or r.loop != "device":
                continue
            prob = self.problems[k].replace(profile=profile, loop="device")
            cm = CostModel(prob)
            free = cm.non_moe_seconds(placement_of(baseline(r.plan, r.mode)))
            out.append(max(0.0, (r.nonmoe_s - free) / prob.spec.n_layers * 1e6))
        return out

    def seconds(self, profile) -> np.ndarray:
        from strata_plan.planner.repredict import predict_plan
        return np.array([1.0 / predict_plan(r.plan, profile, r.mode, problem=self.problems[k], loop=r.loop,
                                           gates=r.gates).decode_tok_s
                         for r, k in zip(self.runs, self.keys)])


def _figure(value: float, sources: str, how: str):
    from strata_plan.profiles.schema import Figure
    return Figure(float(value), "measured", f"strata-plan calibrate ({how}) from {sources}",
                  _dt.date.today().isoformat())


def calibrate(runs: list[Run], profile, sources: str, iterations: int = 40) -> Fit:
    """Fit the constants the runs identify (module docstring) starting from `profile`'s calibration."""
    require_gpu(profile)
    cal = profile.calibration
    meas = np.array([r.measured_s for r in runs])
    pred = _Predictor(runs, profile)
    before = pred.seconds(profile)
    rts = [r.round_trip_us for r in runs if r.round_trip_us is not None]
    overheads = pred.layer_overheads_us(profile)       # device loop runs: measured from their t_nonMoE
    if not rts and not overheads:
        raise UserError(runs[0].file, "time_per_token", "no run identifies the round trip (every run has lookahead "
                        "or an NVMe tier) or the per-layer time (no device-loop run timed its step)",
                        "add a run in mode lru or on-demand of a plan without NVMe, or a device-loop run on a GPU")
    rt = float(np.mean(rts)) if rts else cal.round_trip.value
    spread = f"{min(rts):.0f}-{max(rts):.0f} us over {len(rts)} runs" if rts else ""
    prof = profile
    if rts:
        prof = _with_calibration(prof, moe_round_trip_us=_figure(rt, sources, f"round trip per MoE layer, {spread}"))
    fus = [r.fetch_us for r in runs if r.fetch_us is not None]
    fetch = float(np.mean(fus)) if fus else cal.host_fetch.value
    fspread = f"{min(fus):.0f}-{max(fus):.0f} us over {len(fus)} runs" if fus else ""
    if fus:
        prof = _with_calibration(prof, host_fetch_us=_figure(fetch, sources, f"host time per fetched expert, {fspread}"))

    names = ("layer_overhead_us", "hbm_efficiency", "prefetch_overlap")
    lo, hi = np.array([0.0, 0.05, 0.0]), np.array([np.inf, 1.0, 1.0])

    def overhead_at(e: float) -> float:
        """The per-layer overhead the device-loop runs' t_nonMoE give at hbm_efficiency e (their mean)."""
        eff = _with_calibration(prof, hbm_efficiency=dataclasses.replace(cal.hbm_efficiency, value=float(e)))
        return float(np.mean(pred.layer_overheads_us(eff)))

    def at(x: np.ndarray):
        if overheads:                  # measured, not fitted: what t_nonMoE leaves at this hbm_efficiency
            x = x.copy()
            x[0] = overhead_at(x[1])
        figs = {n: dataclasses.replace(f, value=float(v)) for n, f, v in
                zip(names, (cal.layer_overhead_us, cal.hbm_efficiency, cal.overlap), x)}
        return _with_calibration(prof, **figs)

    def resid(x: np.ndarray) -> np.ndarray:
        return pred.seconds(at(x)) / meas - 1.0

    def jac(x: np.ndarray, r0: np.ndarray) -> np.ndarray:
        cols = []
        for i, h in enumerate((max(1.0, 0.01 * x[0]), -0.01 * x[1], -0.01 if x[2] > 0.5 else 0.01)):
            y = x.copy()
            y[i] += h
            cols.append((resid(y) - r0) / h)
        return np.stack(cols, axis=1)

    look = [r for r in runs if _looks_ahead(r)]
    # from no overlap: near full overlap a lookahead token is bound by the link's busy time, where the overlap
    # moves nothing (a zero column)
    x = np.array([cal.layer_overhead_us.value, cal.hbm_efficiency.value, 0.0 if look else cal.overlap.value])
    r0 = resid(x)
    J = jac(x, r0)
    norms = np.linalg.norm(J, axis=0)
    fit_o = norms[0] > 1e-12
    cos = abs(float(J[:, 0] @ J[:, 1])) / (norms[0] * norms[1]) if fit_o and norms[1] > 1e-12 else 1.0
    fit_e = fit_o and norms[1] > 1e-12 and cos < COLLINEAR and len(runs) >= 2
    fit_ov = norms[2] > 1e-12
    why_o = ("least squares on decode s/token" if fit_o else "left alone: no run's predicted token is paced by the "
             "per-layer host terms (every run bound by a link's busy time)")
    why_e = ("least squares on decode s/token, with layer_overhead_us" if fit_e else
             "left alone: " + ("layer_overhead_us is not identified" if not fit_o else
                               "no run's predicted token depends on it" if norms[1] <= 1e-12 else
                               f"the runs move it together with layer_overhead_us (|cos| {cos:.3f} between their "
                               "columns): runs of other models or contexts separate them"))
    why_ov = (f"least squares on decode s/token, with the others ({len(look)} lookahead runs)" if fit_ov else
              "left alone: " + ("no lookahead run" if not look else "no lookahead run's predicted token depends on "
                                "it (bound by a link's busy time)"))
    if overheads:                   # measured directly (at each hbm_efficiency the fit tries): not a free parameter
        x[0] = overhead_at(x[1])
        fit_o = True
        why_o = (f"measured directly: GPU time per decoder layer beyond its bytes and FLOPs, from the device loop's "
                 f"step without its MoE calls, {min(overheads):.1f}-{max(overheads):.1f} us over {len(overheads)} runs")
        r0 = resid(x)
        J = jac(x, r0)
        norms = np.linalg.norm(J, axis=0)
        fit_e = norms[1] > 1e-12 and len(runs) >= 2
        why_e = ("least squares on decode s/token, the overhead measured at each value" if fit_e else
                 "left alone: no run's predicted token depends on it")
    cols = [i for i, ok in enumerate((not overheads and fit_o, fit_e, fit_ov)) if ok]
    for _ in range(iterations if cols else 0):
        step, *_ = np.linalg.lstsq(J[:, cols], -r0, rcond=None)
        for _half in range(12):           # backtrack: the prediction is piecewise linear (the walk's maxima)
            x_new = x.copy()
            x_new[cols] = np.clip(x[cols] + step, lo[cols], hi[cols])
            r_new = resid(x_new)
            if float(r_new @ r_new) <= float(r0 @ r0):
                break
            step = step / 2
        else:
            break                         # no step lowers the squares: a minimum
        done = bool(np.all(np.abs(x_new - x) <= 1e-6 * np.maximum(1.0, np.abs(x))))
        x, r0 = x_new, r_new
        if done:
            break
        J = jac(x, r0)
    if overheads:
        x[0] = overhead_at(x[1])
        overheads = pred.layer_overheads_us(_with_calibration(prof, hbm_efficiency=dataclasses.replace(
            cal.hbm_efficiency, value=float(x[1]))))
        why_o = (f"measured directly: GPU time per decoder layer beyond its bytes and FLOPs, from the device loop's "
                 f"step without its MoE calls, {min(overheads):.1f}-{max(overheads):.1f} us over {len(overheads)} runs")
    o, e, ov = (float(v) for v in x)
    figures = {n: _figure(v, sources, why) for n, v, why, ok in
               zip(names, (o, e, ov), (why_o, why_e, why_ov), (fit_o, fit_e, fit_ov)) if ok}
    prof = _with_calibration(prof, **figures)
    after = pred.seconds(prof)
    left = "left alone: "
    constants = (
        Constant("moe_round_trip_us", cal.round_trip.value, rt, f"measured directly: round trip per MoE layer, {spread}"
                 if rts else "left alone: no host-loop run without lookahead or NVMe", bool(rts)),
        Constant("host_fetch_us", cal.host_fetch.value, fetch, f"measured directly: host time per fetched expert in "
                 f"LRU-only runs, {fspread}" if fus else "left alone: no LRU-only graphed run", bool(fus)),
        Constant("layer_overhead_us", cal.layer_overhead_us.value, o if fit_o else cal.layer_overhead_us.value, why_o, fit_o),
        Constant("hbm_efficiency", cal.hbm_efficiency.value, e if fit_e else cal.hbm_efficiency.value, why_e, fit_e),
        Constant("prefetch_overlap", cal.overlap.value, ov if fit_ov else cal.overlap.value, why_ov, fit_ov),
        Constant("compute_efficiency", cal.compute_efficiency.value, cal.compute_efficiency.value, left +
                 "decode at batch 1 is never compute-bound, and a bench times one prefill chunk", False),
        Constant("copy_overlap", cal.copy_overlap.value, cal.copy_overlap.value, left + "the profiler measures it", False),
        Constant("dense_stream_efficiency", cal.dense_stream_efficiency.value, cal.dense_stream_efficiency.value,
                 left + "the engine streams no dense weights", False),
    )
    return Fit(prof, constants, tuple(RunFit(r, float(b), float(a)) for r, b, a in zip(runs, before, after)))


def _looks_ahead(r: Run) -> bool:
    return r.mode == "plan" and r.plan.prefetch_depth > 0


def check(runs: list[Run], profile, calibration) -> list[tuple[Run, float]]:
    """(run, predicted seconds per token) for runs that were not fitted on: each re-predicted with `profile`'s
    measured figures (a profile of the machine they ran on) and the fitted `calibration`."""
    prof = dataclasses.replace(profile, calibration=calibration)
    return list(zip(runs, (float(x) for x in _Predictor(runs, prof).seconds(prof))))


def sources_text(paths) -> str:
    return ", ".join(os.path.basename(str(p)) for p in paths)
