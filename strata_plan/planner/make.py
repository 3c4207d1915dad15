"""Make a plan from names and paths: what `strata-plan plan` and the TUI call.

Resolves the model, the machine (profile, optionally with a shipped profile's GPU) and the routing
statistics (a statistics YAML, a trace `.npz`, or a named prior; uniform when none is given), runs the
search, checks the result against the physical bound and returns a `Plan`. Writes nothing; `save_plan` does.
"""
from __future__ import annotations

import os
from pathlib import Path

from strata_plan.errors import UserError
from strata_plan.planner.bound import check_within, machine_bound, physical_bound
from strata_plan.planner.capacity import Budget
from strata_plan.planner.cost import CostModel
from strata_plan.core.plan import Plan, SourceRef, Sources, sha256_of
from strata_plan.core.routing.sources import DEFAULT_PRIOR, load_routing
from strata_plan.planner.build import build_plan
from strata_plan.planner.problem import (DEFAULT_CHUNK, DEFAULT_CONTEXT, DEFAULT_LOOKAHEAD_POINT, DEFAULT_TRIALS,
                                         Problem)
from strata_plan.planner.search import SearchResult, search_ladder
from strata_plan.schema import to_data


def load_machine(profile: str, gpu_preset: str | None = None):
    """A hardware profile, with the GPU of the shipped profile `gpu_preset` when given."""
    from strata_plan.profiles.schema import load_profile
    prof = load_profile(profile)
    if gpu_preset:
        preset = load_profile(gpu_preset)
        if preset.gpu is None:
            raise UserError("--gpu-preset", gpu_preset, "that profile has no GPU", "name a shipped profile with a GPU")
        prof = prof.with_gpu(preset.gpu, name=f"{prof.name}+{gpu_preset}")
    if prof.gpu is None:
        raise UserError(f"profile {prof.name}", "gpus", "has no GPU to plan for",
                        "pass --gpu-preset NAME (a shipped profile's GPU) or profile a machine with a GPU")
    return prof


def stats_sha256(stats) -> str:
    """sha256 of routing statistics' content: their canonical JSON without `source`, which for a trace is the
    path it was named by (the trace's own sha256 is in `source_sha256`)."""
    return sha256_of({k: v for k, v in to_data(stats).items() if k != "source"})


def sources_of(problem, stats_path: str | None, prior: str | None, gpu_preset: str | None) -> Sources:
    """What the plan records of its inputs: a shipped model spec by name, other paths absolute (`save_plan` writes
    them relative to the plan)."""
    spec, prof, st = problem.spec, problem.profile, problem.stats
    stats_name = stats_path or f"prior {prior or DEFAULT_PRIOR}"
    return Sources(model=SourceRef(spec.name, spec.config_sha256,
                                    os.path.abspath(spec.source) if spec.source and not spec.shipped else ""),
                   profile=SourceRef(prof.name, sha256_of(to_data(prof))),
                   statistics=SourceRef(stats_name, stats_sha256(st), os.path.abspath(stats_path) if stats_path else "",
                                        st.kind),
                   statistics_source_sha256=st.source_sha256, gpu_preset=gpu_preset or "")


def make_problem(profile: str, model: str, stats: str | None = None, prior: str | None = None,
                 gpu_preset: str | None = None, context: int = DEFAULT_CONTEXT, chunk: int = DEFAULT_CHUNK,
                 vram_gb: float | tuple | None = None, ram_gb: float | None = None, nvme_gb: float | None = None,
                 prior_seed: int = 0, prior_tokens: int | None = None, gpus: int | None = None,
                 depth: int | None = None, lookahead_point: str = DEFAULT_LOOKAHEAD_POINT) -> Problem:
    """The planning problem from names and paths. `vram_gb`: one budget, or one per GPU (`--vram-gb 24,24`);
    `gpus`: how many of the profile's GPUs to plan over (default: as many as `vram_gb` lists, else all); `depth`: the
    lookahead depth held fixed (None: searched); `lookahead_point`: where the NVMe guesses are taken (`Problem`)."""
    from strata_plan.core.spec import load_spec
    spec = load_spec(model)
    prof = load_machine(profile, gpu_preset)
    routing_stats = load_routing(spec, stats, prior, prior_seed, prior_tokens)
    if gpus is None and not isinstance(vram_gb, (tuple, list)):
        gpus = max(1, prof.n_gpus)
    return Problem(spec, prof, routing_stats, Budget.from_profile(prof, vram_gb, ram_gb, nvme_gb, gpus=gpus), context,
                   chunk, depth=depth, lookahead_point=lookahead_point)


def plan_from_result(problem: Problem, result: SearchResult, sources: Sources, cost: CostModel) -> Plan:
    bound = physical_bound(problem, result.best.placement)
    check_within(result.best.prediction, bound, f"{problem.spec.name} on {problem.profile.name}")
    return build_plan(problem, result, bound, sources, cost, machine_bound(problem, extra=(result.best.placement,)))


def make_plan(profile: str, model: str, stats: str | None = None, prior: str | None = None,
              gpu_preset: str | None = None, context: int = DEFAULT_CONTEXT, chunk: int = DEFAULT_CHUNK,
              trials: int = DEFAULT_TRIALS, objective: str = "decode", mix_weight: float = 0.5, vram_gb: float | tuple | None = None,
              ram_gb: float | None = None, nvme_gb: float | None = None, study_db: str | None = None, seed: int = 0,
              on_trial=None, gpus: int | None = None, depth: int | None = None,
              lookahead_point: str = DEFAULT_LOOKAHEAD_POINT) -> Plan:
    """Search the best placement and return it as a Plan (see module docstring); `depth`: the lookahead depth held
    fixed (None: searched); `lookahead_point`: where the NVMe guesses are taken (recorded in `staging`)."""
    problem = make_problem(profile, model, stats, prior, gpu_preset, context, chunk, vram_gb, ram_gb, nvme_gb,
                           gpus=gpus, depth=depth, lookahead_point=lookahead_point)
    cost = CostModel(problem)
    result = search_ladder(problem, trials=trials, seed=seed, objective=objective, mix_weight=mix_weight,
                           study_db=study_db, cost=cost, on_trial=on_trial)
    return plan_from_result(problem, result, sources_of(problem, stats, prior, gpu_preset), cost)


# ------------------------------------------------------------------------------------------------
# The problem a saved plan was made for
# ------------------------------------------------------------------------------------------------
def _plan_spec(src, where: str):
    """The model spec a plan records: its config.json where recorded (cut to `NAME@Nmoe`'s layers when the
    name says so), else the shipped spec of that name; the first whose config sha256 is the recorded one."""
    from strata_plan.core.spec import TRUNCATED, load_spec
    m = TRUNCATED.match(src.model.name)
    tries = [(src.model.path, int(m["n"]) if m else None)] if src.model.path and Path(src.model.path).is_file() else []
    tries.append((src.model.name, None))
    found = []
    for model, n in tries:
        try:
            found.append((model, load_spec(model, n)))
        except UserError:
            continue
    if not found:
        raise UserError(where, "sources.model", f"model {src.model.name!r} is not a shipped spec, and its config.json "
                        f"{src.model.path or '(none recorded)'} is not there",
                        "restore the model's config.json where the plan records it, or plan again")
    for _, spec in found:
        if spec.config_sha256 == src.model.sha256:
            return spec
    raise UserError(where, "sources.model", f"{found[0][0]} is not the model config the plan was made for",
                    "plan again, or restore the model's config.json")


def problem_for_plan(plan, where: str, profile: str | None = None, stats: str | None = None,
                     machine=None) -> Problem:
    """Rebuild the planning problem of a saved plan (`where`: its file) from its recorded sources (model,
    profile, statistics) and budgets, refusing any source whose sha256 differs from the one the plan records,
    and a plan whose fields disagree with its model; every message names the plan file and the field.
    `profile`/`stats` override the recorded ones (a measured profile is recorded by name only: pass its YAML
    path). `machine` (a HardwareProfile) replaces the recorded profile on purpose, unchecked: the same plan
    predicted on another machine or with other calibration constants (`planner.repredict`). Recorded paths
    are absolute once loaded (`load_plan` resolves them against the plan's folder)."""
    from strata_plan.core.plan import check_plan_model
    src = plan.sources
    spec = _plan_spec(src, where)
    if plan.model != spec.name:
        raise UserError(where, "model", f"{plan.model!r}, but the plan was made for {spec.name} (sources.model)",
                        f"write `model: {spec.name}` back, or plan again")
    check_plan_model(plan, spec, where)
    if machine is not None:
        prof = machine
    else:
        prof = _recorded_profile(src, where, profile)
    st = src.statistics
    if stats:
        routing_stats = load_routing(spec, stats=stats)
    elif not st.path:                               # a prior named on the command line
        routing_stats = load_routing(spec, prior=st.name.removeprefix("prior "))
    else:                                           # a statistics file or trace (of a prior, or measured)
        if not Path(st.path).is_file():
            raise UserError(where, "sources.statistics.path", f"{st.path}: file not found (the routing statistics "
                            "the plan was made with)", "pass --stats PATH to read them from elsewhere")
        routing_stats = load_routing(spec, stats=st.path)
    if stats_sha256(routing_stats) != st.sha256:
        raise UserError(where, "sources.statistics", f"routing statistics {stats or st.path or st.name} differ from "
                        "the ones the plan was made for", "pass --stats PATH, the statistics the plan was made with")
    b = plan.memory.budgets
    try:
        gpus = tuple(g.vram_budget_bytes for g in plan.gpus) if plan.gpus else ()
        return Problem(spec, prof, routing_stats, Budget(b.vram_bytes, b.ram_bytes, b.nvme_bytes, b.vram_reserve_bytes,
                                                         gpus), plan.context, plan.prefill_chunk,
                       lookahead_point=plan.staging.point)
    except UserError as e:
        raise UserError(where, "memory.budgets", f"{e.where} {e.field}: {e.problem}", "plan again") from None


def _recorded_profile(src, where: str, profile: str | None):
    """The profile a plan was made with (or `profile`, which must be the same), checked by sha256."""
    preset = src.gpu_preset or None
    prof_name = src.profile.name
    if preset and prof_name.endswith(f"+{preset}"):
        prof_name = prof_name[: -len(preset) - 1]
    try:
        prof = load_machine(profile or prof_name, preset)
    except UserError as e:
        if profile is None and e.field == prof_name:
            raise UserError(where, "sources.profile", f"profile {prof_name!r} is not a shipped profile",
                            "pass --profile PATH, the profile YAML the plan was made with") from None
        raise
    if sha256_of(to_data(prof)) != src.profile.sha256:
        raise UserError(where, "sources.profile", f"profile {profile or prof_name} differs from the one the plan "
                        "was made for", "pass --profile PATH, the profile YAML the plan was made with")
    return prof


def load_plan_problem(path: str, profile: str | None = None, stats: str | None = None):
    """(plan, problem) of a plan file: what `export` and `what-if` start from."""
    from strata_plan.core.plan import load_plan
    plan = load_plan(path)
    return plan, problem_for_plan(plan, path, profile, stats)
