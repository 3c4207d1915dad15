"""Make a plan from names and paths: what `strata-plan plan` and the TUI call.

Resolves the model, the machine (profile, optionally with a shipped profile's GPU) and the routing
statistics (a statistics YAML, a trace `.npz`, or a named prior; uniform when none is given), runs the
search, checks the result against the physical bound and returns a `Plan`. Writes nothing; `save_plan` does.
"""
from __future__ import annotations

from pathlib import Path

from strata_plan.errors import UserError
from strata_plan.planner.bound import check_within, machine_bound, physical_bound
from strata_plan.planner.capacity import Budget
from strata_plan.planner.cost import CostModel
from strata_plan.planner.plan import Plan, SourceRef, Sources, build_plan, sha256_of
from strata_plan.planner.problem import DEFAULT_CHUNK, DEFAULT_CONTEXT, Problem
from strata_plan.planner.search import SearchResult, search_ladder
from strata_plan.schema import to_data

DEFAULT_PRIOR = "uniform"
"""Without --stats or --prior plans assume uniform routing: the conservative choice, and close to what
load-balanced routers (DeepSeek-V3, Kimi) do over long horizons."""


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


def load_routing(spec, stats: str | None = None, prior: str | None = None, seed: int = 0, tokens: int | None = None):
    """Routing statistics for `spec`: a statistics YAML or a trace `.npz` (checked against the model), or a
    prior (named or a path), uniform by default."""
    from strata_plan.planner import routing
    if stats and prior:
        raise UserError("--stats/--prior", f"{stats} / {prior}", "both given", "pass one: measured statistics or a prior")
    if stats:
        if Path(stats).suffix == ".npz":
            trace = routing.load_trace(stats, spec)
            return routing.compute_stats(trace, source=str(stats))
        return routing.load_stats(stats)
    kw = {"tokens": tokens} if tokens else {}
    return routing.stats_from_prior(prior or DEFAULT_PRIOR, spec.n_moe_layers, spec.n_routed, spec.top_k, seed=seed,
                                    model=spec.name, **kw)


def sources_of(problem, stats_path: str | None, prior: str | None, gpu_preset: str | None) -> Sources:
    spec, prof, st = problem.spec, problem.profile, problem.stats
    stats_name = stats_path or f"prior {prior or DEFAULT_PRIOR}"
    return Sources(model=SourceRef(spec.name, spec.config_sha256, spec.source),
                   profile=SourceRef(prof.name, sha256_of(to_data(prof))),
                   statistics=SourceRef(stats_name, sha256_of(to_data(st)), str(stats_path or ""), st.kind),
                   statistics_source_sha256=st.source_sha256, gpu_preset=gpu_preset or "")


def make_problem(profile: str, model: str, stats: str | None = None, prior: str | None = None,
                 gpu_preset: str | None = None, context: int = DEFAULT_CONTEXT, chunk: int = DEFAULT_CHUNK,
                 vram_gb: float | None = None, ram_gb: float | None = None, nvme_gb: float | None = None,
                 prior_seed: int = 0, prior_tokens: int | None = None) -> Problem:
    from strata_plan.planner.spec import load_spec
    spec = load_spec(model)
    prof = load_machine(profile, gpu_preset)
    routing_stats = load_routing(spec, stats, prior, prior_seed, prior_tokens)
    return Problem(spec, prof, routing_stats, Budget.from_profile(prof, vram_gb, ram_gb, nvme_gb), context, chunk)


def plan_from_result(problem: Problem, result: SearchResult, sources: Sources, cost: CostModel) -> Plan:
    bound = physical_bound(problem, result.best.placement)
    check_within(result.best.prediction, bound, f"{problem.spec.name} on {problem.profile.name}")
    return build_plan(problem, result, bound, sources, cost, machine_bound(problem, extra=(result.best.placement,)))


def make_plan(profile: str, model: str, stats: str | None = None, prior: str | None = None,
              gpu_preset: str | None = None, context: int = DEFAULT_CONTEXT, chunk: int = DEFAULT_CHUNK,
              trials: int = 200, objective: str = "decode", mix_weight: float = 0.5, vram_gb: float | None = None,
              ram_gb: float | None = None, nvme_gb: float | None = None, study_db: str | None = None, seed: int = 0,
              on_trial=None) -> Plan:
    """Search the best placement and return it as a Plan (see module docstring)."""
    problem = make_problem(profile, model, stats, prior, gpu_preset, context, chunk, vram_gb, ram_gb, nvme_gb)
    cost = CostModel(problem)
    result = search_ladder(problem, trials=trials, seed=seed, objective=objective, mix_weight=mix_weight,
                           study_db=study_db, cost=cost, on_trial=on_trial)
    return plan_from_result(problem, result, sources_of(problem, stats, prior, gpu_preset), cost)
