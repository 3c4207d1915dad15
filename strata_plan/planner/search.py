"""The placement search: an Optuna TPE study over four global knobs, scored by the cost model.

Each trial picks dense_share, cache_bias, skew_weight and prefetch_depth; `placement.allocate` water-fills
them into per-layer counts (so a 92-layer x 384-expert model is a 4-dimensional search), and the cost
model predicts tok/s. Capacity goes through Optuna's `constraints_func` (bytes over budget per tier, <= 0
feasible). The greedy popularity plan is enqueued first, then a caller's starting plan (a smaller budget's
best), so the result is never worse than either. Studies can live in SQLite (`sqlite:///plan.db`): the same
problem resumes under the same study name and optuna-dashboard opens the file. Optuna is imported here,
lazily, and nowhere else in the planner.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from dataclasses import dataclass
from typing import Callable

from strata_plan.errors import UserError
from strata_plan.planner.capacity import Footprint
from strata_plan.planner.cost import CostModel, Prediction
from strata_plan.planner.polish import polish
from strata_plan.planner.problem import DEFAULT_TRIALS
from strata_plan.planner.placement import CACHE_BIAS_MAX, Knobs, Placement, allocate, footprint, greedy_knobs, staged

OBJECTIVES = ("decode", "prefill", "mix")


@dataclass(frozen=True)
class Candidate:
    knobs: Knobs | None         # None for a caller's fixed starting placement
    placement: Placement
    footprint: Footprint
    prediction: Prediction
    score: float


@dataclass(frozen=True)
class SearchResult:
    best: Candidate
    greedy: Candidate
    objective: str
    mix_weight: float
    trials: int                 # completed trials in the study (a resumed study counts earlier ones)
    seed: int
    study_name: str
    storage: str                # "" for an in-memory study
    polished: int = 0           # hill-climbing moves kept after the study (polish.py)

    @property
    def gain_over_greedy(self) -> float:
        return self.best.score / self.greedy.score - 1.0 if self.greedy.score > 0 else 0.0


def score(pred: Prediction, objective: str, mix_weight: float = 0.5) -> float:
    """What the study maximises: decode tok/s, prefill tok/s, or decode^w x prefill^(1-w)."""
    if objective == "decode":
        return pred.decode_tok_s
    if objective == "prefill":
        return pred.prefill_tok_s
    return pred.decode_tok_s ** mix_weight * pred.prefill_tok_s ** (1.0 - mix_weight)


def evaluate(problem, cost: CostModel, knobs: Knobs, objective: str, mix_weight: float) -> Candidate:
    a = allocate(problem, knobs)
    pred = cost.predict(a.placement)
    return Candidate(knobs, a.placement, a.footprint, pred, score(pred, objective, mix_weight))


def study_name(problem, objective: str, mix_weight: float, seed: int) -> str:
    """Names the problem, so a study in a shared SQLite file resumes only the same problem."""
    from strata_plan.schema import to_data
    b, st = problem.budget, problem.stats
    ident = {"model": problem.spec.config_sha256, "profile": to_data(problem.profile),
             "stats": [st.source, st.source_sha256, st.kind, getattr(st, "tokens", 0)],
             "budget": [b.vram, b.ram, b.nvme, b.reserve] + ([list(b.gpus)] if b.gpus else []), "context": problem.context, "chunk": problem.prefill_chunk,
             **({"depth": problem.depth} if problem.depth is not None else {}),
             "mix": list(problem.mix.fractions), "objective": objective, "w": mix_weight, "seed": seed}
    h = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{problem.spec.name}-{problem.profile.name}-{objective}-{h}"


def search(problem, trials: int = DEFAULT_TRIALS, seed: int = 0, objective: str = "decode", mix_weight: float = 0.5,
           study_db: str | None = None, start: Placement | None = None, start_knobs: Knobs | None = None,
           cost: CostModel | None = None, on_trial: Callable[[int, float], None] | None = None,
           polish_evals: int = 400) -> SearchResult:
    """Best placement found by `trials` TPE trials (a resumed study runs only the missing ones), its knobs tried at
    every lookahead depth (the tree sampler can settle on one depth early: the depth changes what else fits, as the
    staging slots take VRAM; `problem.depth` holds it at one), then polished by hill-climbing on per-layer counts with at most `polish_evals`
    cost-model calls."""
    _check(objective, trials, mix_weight)
    cost = cost or CostModel(problem)
    rate = lambda p: score(cost.predict(p), objective, mix_weight)  # noqa: E731
    greedy = evaluate(problem, cost, greedy_knobs(problem), objective, mix_weight)
    study, seen = _run_study(problem, cost, trials, seed, objective, mix_weight, study_db, greedy.knobs,
                             start_knobs, on_trial)
    candidates = [*seen.values(), greedy]
    if start is not None and problem.depth is not None:           # a start found at another depth: at this one
        start = dataclasses.replace(start, prefetch_depth=problem.depth)
    if start is not None:
        candidates.append(_candidate(problem, cost, None, start, objective, mix_weight))
    feasible = [c for c in candidates if c.footprint.fits(problem.budget)]
    if not feasible:
        _no_fit(problem, greedy)
    best = max(feasible, key=lambda c: c.score)          # ties: the first (greedy before trials, trials in order)
    if best.knobs is not None:     # the best knobs at every lookahead depth: a depth pays only where its copies beat
        lo, hi = problem.depths
        depths = [evaluate(problem, cost, dataclasses.replace(best.knobs, prefetch_depth=d), objective, mix_weight)
                  for d in range(lo, hi + 1) if d != best.knobs.prefetch_depth]
        best = max([best] + [c for c in depths if c.footprint.fits(problem.budget)], key=lambda c: c.score)
    polished = 0
    if polish_evals > 0:
        place, _, polished = polish(problem, best.placement, rate, polish_evals)
        if polished:
            best = _candidate(problem, cost, best.knobs, place, objective, mix_weight)
    import optuna
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    return SearchResult(best, greedy, objective, mix_weight, done, seed, study.study_name,
                        _storage(study_db) or "", polished)


def _check(objective: str, trials: int, mix_weight: float) -> None:
    if objective not in OBJECTIVES:
        raise UserError("--objective", objective, "unknown objective", f"use one of {', '.join(OBJECTIVES)}")
    if trials < 1:
        raise UserError("--trials", str(trials), "must be at least 1", f"pass --trials {DEFAULT_TRIALS} (or more)")
    if not 0.0 <= mix_weight <= 1.0:
        raise UserError("--mix-weight", str(mix_weight), "must lie in [0, 1]", "pass e.g. --mix-weight 0.5")


def _candidate(problem, cost, knobs, place: Placement, objective: str, mix_weight: float) -> Candidate:
    pred = cost.predict(place)
    return Candidate(knobs, place, footprint(problem, place), pred, score(pred, objective, mix_weight))


def _run_study(problem, cost, trials, seed, objective, mix_weight, study_db, greedy_knobs_, start_knobs, on_trial):
    """Create or resume the study, run the missing trials; returns it and every trial's candidate, in trial
    order (trials of an earlier session are re-evaluated: the cost model is deterministic)."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    budget, depths = problem.budget, problem.depths
    seen: dict[int, Candidate] = {}

    def objective_fn(trial) -> float:
        kn = Knobs(trial.suggest_float("dense_share", 0.0, 1.0), trial.suggest_float("cache_bias", 0.0, CACHE_BIAS_MAX),
                   trial.suggest_float("skew_weight", 0.0, 1.0), trial.suggest_int("prefetch_depth", *depths),
                   trial.suggest_float("gpu_split", 0.0, 1.0) if problem.n_gpus > 1 else None,
                   trial.suggest_float("staging_share", 0.0, 0.5) if staged(problem) else None)
        c = evaluate(problem, cost, kn, objective, mix_weight)
        over = [o / 1e9 for o in c.footprint.overflow(budget)]
        trial.set_user_attr("overflow_gb", over)
        if hasattr(trial, "set_constraint"):                    # Optuna >= 5: constraints live on the trial
            for tier, v in zip(("vram_over_gb", "ram_over_gb", "nvme_over_gb"), over):
                trial.set_constraint(tier, v)
        seen[trial.number] = c
        if on_trial is not None:
            on_trial(trial.number, c.score)
        return c.score

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        kw = {} if hasattr(optuna.trial.Trial, "set_constraint") else {
            "constraints_func": lambda ft: ft.user_attrs.get("overflow_gb", [1.0, 1.0, 1.0])}   # Optuna 4.x
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                             n_startup_trials=min(10, max(2, trials // 4)), **kw)
        study = optuna.create_study(direction="maximize", sampler=sampler, storage=_storage(study_db),
                                    study_name=study_name(problem, objective, mix_weight, seed), load_if_exists=True)
        if not study.trials:
            study.enqueue_trial(greedy_knobs_.as_params())
            if start_knobs is not None:
                study.enqueue_trial(_clip(start_knobs, depths, problem.n_gpus).as_params())
        done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
        if trials > done:
            study.optimize(objective_fn, n_trials=trials - done, gc_after_trial=False)
    for t in study.trials:
        if t.state == optuna.trial.TrialState.COMPLETE and t.number not in seen:
            seen[t.number] = evaluate(problem, cost, Knobs(**t.params), objective, mix_weight)
    return study, dict(sorted(seen.items()))


def _no_fit(problem, greedy: Candidate):
    budget = problem.budget
    over = greedy.footprint.overflow(budget)
    i = max(range(3), key=lambda t: over[t])
    flag, tier, have = (("--vram-gb", "VRAM", budget.vram), ("--ram-gb", "pinned RAM", budget.ram),
                        ("--nvme-gb", "NVMe", budget.nvme))[i]
    from strata_plan.units import fmt_bytes
    prof = problem.profile                  # what the machine has: a budget already there cannot be raised
    machine = (sum(g.vram_gb.value for g in problem.gpus), prof.host.ram_gb.value,
               sum(d.capacity_gb.value for d in prof.nvme) if prof.nvme else 0.0)[i] * 1e9
    full = have >= machine * (1 - 1e-9)
    kv = f"lower --context (its KV cache takes {fmt_bytes(problem.spec.kv_cache_bytes(problem.context))}), " if i == 0 else ""
    fix = ("" if full else f"raise {flag}, ") + kv + "or use a smaller model" + (f" or a machine with more {tier}" if full else "")
    raise UserError(flag, fmt_bytes(have), f"no placement of {problem.spec.name} fits ({fmt_bytes(over[i])} more "
                    f"needed in {tier}" + (f"; {fmt_bytes(have)} is all the machine has" if full else "") + ")", fix)


def _clip(k: Knobs, depths: tuple[int, int], n_gpus: int = 1) -> Knobs:
    """Knobs in this problem's ranges (several GPUs: a one-GPU start keeps every layer on the first, share 1)."""
    clamp = lambda v, hi=1.0: min(max(float(v), 0.0), hi)  # noqa: E731
    split = (1.0 if k.gpu_split is None else clamp(k.gpu_split)) if n_gpus > 1 else None
    return Knobs(clamp(k.dense_share), clamp(k.cache_bias, CACHE_BIAS_MAX), clamp(k.skew_weight),
                 min(max(int(k.prefetch_depth), depths[0]), depths[1]), split,
                 None if k.staging_share is None else clamp(k.staging_share, 0.5))


def _storage(study_db: str | None) -> str | None:
    if not study_db:
        return None
    if "://" in study_db:
        if not study_db.startswith("sqlite:///"):
            raise UserError("--study-db", study_db, "only SQLite storage is supported", "pass a path or sqlite:///PATH")
        return study_db
    from pathlib import Path
    folder = Path(study_db).resolve().parent
    if not folder.is_dir():
        raise UserError("--study-db", study_db, f"folder {folder} does not exist", "create it or pass another path")
    return f"sqlite:///{Path(study_db).resolve()}"


LADDER = (0.8, 0.9)
"""Budget fractions `plan` searches first (an eighth of the trials each), carrying each best placement into
the next search as its starting plan: the final search then never predicts slower than the plans of these
smaller budgets (the issue-26 case: a fresh 104 GB search found 0.448 tok/s, below 96 GB's 0.454)."""
LADDER_MIN_TRIALS = 16          # fewer trials: no ladder (each step would get less than 2)


def sweep_budgets(problem, budgets, trials: int = DEFAULT_TRIALS, seed: int = 0, objective: str = "decode",
                  mix_weight: float = 0.5, cost_of=None, polish_evals: int = 400,
                  on_trial: Callable[[int, float], None] | None = None) -> list[SearchResult | None]:
    """A search at each budget (`capacity.Budget`, in any order), run from the smallest up, each started
    from the best plan of every smaller budget it contains: more of every resource never predicts a slower
    plan along the sweep. None where nothing fits a budget. `cost_of(problem)` may supply cost models."""
    order = sorted(range(len(budgets)), key=lambda i: (budgets[i].vram + budgets[i].ram + budgets[i].nvme, i))
    out: list[SearchResult | None] = [None] * len(budgets)
    done: list[tuple[object, SearchResult]] = []
    for i in order:
        b = budgets[i]
        try:
            p = problem.replace(budget=b)
        except UserError:                          # below the working set
            continue
        below = [r for bb, r in done if b.contains(bb)]
        start = max(below, key=lambda r: r.best.score) if below else None
        try:
            r = search(p, trials=trials, seed=seed, objective=objective, mix_weight=mix_weight,
                       start=start.best.placement if start else None, start_knobs=start.best.knobs if start else None,
                       cost=cost_of(p) if cost_of else None, polish_evals=polish_evals, on_trial=on_trial)
        except UserError:                          # no placement fits
            continue
        out[i] = r
        done.append((b, r))
    return out


def search_ladder(problem, trials: int = DEFAULT_TRIALS, seed: int = 0, objective: str = "decode", mix_weight: float = 0.5,
                  study_db: str | None = None, cost: CostModel | None = None, on_trial=None,
                  ladder: tuple[float, ...] = LADDER, one_gpu: "SearchResult | None" = None) -> SearchResult:
    """`search` at the problem's budget, started from the best plans of the smaller budgets `ladder` (every
    tier scaled by each fraction; searches of trials // 8 each, chained by `sweep_budgets`). The trials add
    up to `trials` (the ladder's are taken from the final search's; `on_trial` sees every one, so progress
    and cancelling work as for one search); below LADDER_MIN_TRIALS, one search.

    Several GPUs: the best plan on the first GPU alone (`one_gpu`, else a ladder of half the trials on
    `bound.first_gpu_problem`) joins the starting plans, so a second GPU never predicts a slower plan than
    the first GPU's alone."""
    if problem.n_gpus > 1 and one_gpu is None:
        from strata_plan.planner.bound import first_gpu_problem
        one = first_gpu_problem(problem)
        if one is not None:
            half = trials // 2 if trials >= 2 else 0
            if half:
                try:
                    one_gpu = search_ladder(one, trials=half, seed=seed, objective=objective, mix_weight=mix_weight,
                                            on_trial=on_trial, ladder=ladder)
                    trials -= half
                except UserError:                  # nothing fits the first GPU alone
                    one_gpu = None
    b = problem.budget
    each = trials // 8 if trials >= LADDER_MIN_TRIALS and ladder else 0
    steps = sweep_budgets(problem, [b.scaled(f) for f in ladder], trials=each, seed=seed, objective=objective,
                          mix_weight=mix_weight, on_trial=on_trial) if each else []
    found = [r for r in steps if r is not None] + ([one_gpu] if one_gpu is not None else [])
    start = max(found, key=lambda r: r.best.score) if found else None
    result = search(problem, trials=trials - each * len(ladder), seed=seed, objective=objective, mix_weight=mix_weight,
                    study_db=study_db,
                    start=start.best.placement if start else None, start_knobs=start.best.knobs if start else None,
                    cost=cost, on_trial=on_trial)
    return dataclasses.replace(result, trials=result.trials + sum(r.trials for r in found))   # all trials run
