"""The cost model re-run on an executed plan: what the planner predicts for a plan as the engine ran it
(`mode`), with a given hardware profile (one measured on the machine that ran it, or one whose calibration
constants are being fitted, `planner.calibrate`).

    pred = predict_plan(load_plan("plan.yaml"), "h200", mode="lru")       # -> cost.Prediction (predicted)

The problem is the plan's own: model, routing statistics (trace, statistics file or prior, checked by
sha256), budgets, context and prefill chunk as recorded in `sources` and `memory` (`make.problem_for_plan`),
with `profile` in place of the recorded profile. Modes (`core.modes`) are the engine's: "plan" as written,
"lru" without lookahead, "on-demand" also without cache slots.
"""
from __future__ import annotations

from strata_plan.core.modes import baseline


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


def predict_plan(plan, profile, mode: str = "plan", where: str = "plan", problem=None, gates: bool = True,
                 sampled: bool | None = None):
    """The cost model's `Prediction` of `plan` run as `mode` on `profile`. `problem`: the plan's problem already
    built (`plan_problem`; its profile is replaced by `profile` when one is given). gates: False for a run replaying
    routing (no lookahead gates run: the replay hands the guesses over). sampled: the run draws its tokens
    (`Problem.sampled`; None: as `problem` has it, greedy for a new one)."""
    from strata_plan.planner.cost import CostModel
    from strata_plan.planner.placement import placement_of
    if problem is None:
        problem = plan_problem(plan, profile, where)
    elif profile is not None:
        problem = problem.replace(profile=machine_for_plan(plan, profile))
    if problem.lookahead_gates != gates:
        problem = problem.replace(lookahead_gates=gates)
    if sampled is not None and problem.sampled != sampled:
        problem = problem.replace(sampled=sampled)
    return CostModel(problem).predict(placement_of(baseline(plan, mode)))
