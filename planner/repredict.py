"""The cost model re-run on an executed plan: what the planner predicts for a plan as the engine ran it
(`mode`), with a given hardware profile (one measured on the machine that ran it, or one whose calibration
constants are being fitted, `planner.calibrate`).

    pred = predict_plan(load_plan("plan.yaml"), "h200", mode="lru")       # -> cost.Prediction (predicted)

The problem is the plan's own: model, routing statistics (trace, statistics file or prior, checked by
sha256), budgets, context and prefill chunk as recorded in `sources` and `memory` (`make.problem_for_plan`),
with `profile` in place of the recorded profile. Modes are the engine's (`engine.engine.EngineOptions`):
"plan" as written, "lru" without lookahead, "on-demand" also without cache slots (`baseline`).
"""
from __future__ import annotations

import dataclasses

from strata_plan.errors import UserError

MODES = ("plan", "lru", "on-demand")


def baseline(plan, mode: str):
    """The plan run as `mode`: "lru" keeps the cache and drops the lookahead; "on-demand" drops both
    (the plan's VRAM static set only)."""
    from strata_plan.planner.plan import CachePlan
    if mode not in MODES:
        raise UserError("mode", str(mode), "unknown", f"use one of {', '.join(MODES)}")
    if mode == "plan":
        return plan
    if mode == "lru":
        return dataclasses.replace(plan, prefetch_depth=0)
    layers = tuple(dataclasses.replace(l, cache_slots=0) for l in plan.layers)
    return dataclasses.replace(plan, layers=layers, prefetch_depth=0,
                               cache=CachePlan(plan.cache.policy, plan.cache.slot_bytes, 0))


def machine_for_plan(plan, profile):
    """`profile` (a HardwareProfile, a shipped name or a YAML path) as the machine to predict the plan on;
    a profile without a GPU takes the plan's recorded `--gpu-preset`."""
    from strata_plan.planner.make import load_machine
    if isinstance(profile, str):
        from strata_plan.profiles.schema import load_profile
        prof = load_profile(profile)
        if prof.gpu is None and plan.sources.gpu_preset:
            return load_machine(profile, plan.sources.gpu_preset)
        return load_machine(profile) if prof.gpu is None else prof
    return profile


def with_calibration_of(profile, frozen: str | None):
    """`profile` (a HardwareProfile, a shipped name or a YAML path: the machine's measured figures, e.g. a profile
    measured in the same call as the runs) with the calibration constants of the profile YAML `frozen` (fitted
    by `strata-plan calibrate` and committed before the runs it is to predict); `profile` itself when `frozen`
    is None."""
    import dataclasses

    from strata_plan.profiles.schema import load_profile
    if not frozen:
        return profile
    prof = load_profile(profile) if isinstance(profile, str) else profile
    return dataclasses.replace(prof, calibration=load_profile(frozen).calibration)


def plan_problem(plan, profile, where: str = "plan"):
    """The plan's planning problem (`where`: the plan file, for messages) on `profile`."""
    from strata_plan.planner.make import problem_for_plan
    return problem_for_plan(plan, where, machine=machine_for_plan(plan, profile))


def predict_plan(plan, profile, mode: str = "plan", where: str = "plan", problem=None):
    """The cost model's `Prediction` of `plan` run as `mode` on `profile`. `problem`: the plan's problem
    already built (`plan_problem`; its profile is replaced by `profile` when one is given)."""
    from strata_plan.planner.cost import CostModel
    if problem is None:
        problem = plan_problem(plan, profile, where)
    elif profile is not None:
        problem = problem.replace(profile=machine_for_plan(plan, profile))
    return CostModel(problem).predict(baseline(plan, mode).placement)
