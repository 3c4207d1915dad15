"""compare-tables: the seed post's throughput table beside our predictions, bounds and needed hit rates.

For each row of the seed's table (a shipped profile; the two-GPU rows plan over both GPUs), the best plan
found for kimi-k3.1-pro is predicted under uniform routing and under the named skewed prior, with the
physical bound of each plan, and the hit rates the published figure would need. While building the table it
checks what must hold: no prediction above its bound; for a fixed plan, more bandwidth on any link never
predicts fewer tok/s; a search with twice the pinned RAM, started from the smaller budget's plan, never
predicts less; and on a two-GPU row, neither the plan nor the machine bound is below the first GPU's alone.
Every violated check is listed in `Comparison.failures` (the test requires none).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from strata_plan.planner.bound import (BoundViolation, Throughput, check_within, first_gpu_problem, link_peaks,
                                       machine_bound, physical_bound)
from strata_plan.planner.cost import CostModel
from strata_plan.planner.estimated import at_alternative, binding_estimate, scale_links
from strata_plan.planner.placement import Placement, footprint
from strata_plan.planner.problem import DEFAULT_CHUNK, DEFAULT_CONTEXT, Problem

SEED_MODEL = "kimi-k3.1-pro"
ONE_GPU_PROFILES = ("rtx-4090", "rtx-5090", "a100-80g", "h100-80g", "rtx-pro-6000")
TWO_GPU_PROFILES = ("rtx-4090-x2", "rtx-pro-6000-x2", "h100-nvl-x2")
DEFAULT_PROFILES = ONE_GPU_PROFILES + TWO_GPU_PROFILES
RAM_FACTOR = 2.0                 # the larger budget of the searched-monotonicity check
BANDWIDTH_FACTOR = 1.5           # the faster link of the fixed-plan monotonicity check


@dataclass(frozen=True)
class Claim:
    """One row of the seed post's table (one author's claims, not measurements we reproduced)."""

    row: str
    decode: tuple[float, float]      # tok/s range (low, high)
    prefill: tuple[float, float]

    @staticmethod
    def fmt(r: tuple[float, float]) -> str:
        return f"{r[0]:g}" if r[0] == r[1] else f"{r[0]:g}-{r[1]:g}"


_SMALL = Claim("1x RTX 4090 / 5090 (24-32 GB) + 128 GB DDR5 + Gen4 NVMe", (4.0, 5.5), (11.0, 14.0))
_BIG = Claim("1x A100 / H100 (80 GB) + 160 GB RAM + Gen4 NVMe", (9.0, 10.0), (27.0, 31.0))
_TWO_BIG = Claim("2x PRO 6000 / 2x H100 (192 GB) + 512 GB DDR5", (18.0, 22.0), (55.0, 62.0))
SEED_CLAIMS = {"rtx-4090": _SMALL, "rtx-5090": _SMALL, "a100-80g": _BIG, "h100-80g": _BIG,
               "rtx-pro-6000": Claim("TESTED: 1x RTX PRO 6000 Blackwell (96 GB) + 176 GB RAM", (10.8, 10.8), (36.8, 36.8)),
               "rtx-4090-x2": Claim("2x RTX 3090 / 4090 (48 GB) + 192 GB DDR5 + Gen5 NVMe", (7.5, 9.0), (19.0, 23.0)),
               "rtx-pro-6000-x2": _TWO_BIG, "h100-nvl-x2": _TWO_BIG}


@dataclass(frozen=True)
class Case(Throughput):
    """The best plan found for one routing assumption on one machine."""

    routing: str
    bound_decode_binding: str
    bound_prefill_binding: str
    vram_hit: float              # share of routed-expert accesses served from VRAM
    off_nvme: float              # share not read from NVMe
    machine_decode_tok_s: float = 0.0       # the machine bound (bound.machine_bound) on these budgets and links
    machine_prefill_tok_s: float = 0.0
    machine_decode_binding: str = ""
    machine_prefill_binding: str = ""
    decode_estimate: str = ""    # the estimated input behind the decode binding ("" none), estimated.py
    decode_alternative: str = ""     # the typical alternative it is re-predicted at, and the prediction there
    decode_at_alternative: float = 0.0
    prefill_estimate: str = ""
    prefill_alternative: str = ""
    prefill_at_alternative: float = 0.0


@dataclass(frozen=True)
class Needs:
    """Hit rates a published figure needs, from link peaks alone (None: unreachable whatever the hit rate).
    vram_hit: share of routed-expert bytes that must come from VRAM if every miss came from pinned RAM at
    the best H2D rate (after the dense weights the plan streams); off_nvme: share that must avoid NVMe at the
    drive's best rate."""

    decode_vram_hit: float | None
    decode_off_nvme: float | None
    prefill_vram_hit: float | None
    prefill_off_nvme: float | None


@dataclass(frozen=True)
class Row:
    profile: str
    gpu: str
    vram_gb: float
    ram_gb: float
    claim: Claim
    uniform: Case
    skewed: Case
    more_ram: Case               # skewed routing, RAM_FACTOR x pinned RAM, search started from `skewed`'s plan
    needs: Needs
    n_gpus: int = 1
    one_gpu: Case | None = None  # two-GPU rows: skewed routing on the first GPU alone (what the second adds to)


@dataclass(frozen=True)
class Comparison:
    model: str
    skewed_prior: str
    trials: int
    seed: int
    context: int
    chunk: int
    rows: tuple[Row, ...]
    failures: tuple[str, ...]

    def as_data(self) -> dict:
        return dataclasses.asdict(self)


def _case(routing: str, problem: Problem, result, where: str, failures: list[str], machine: bool = True,
          extra_placements: tuple = ()) -> Case:
    """The plan's prediction and bound, the machine bound (`machine`) and the estimated input behind each
    binding; a prediction above its bound, or a bound above the machine bound, is recorded in `failures`."""
    p = result.best.prediction
    b = physical_bound(problem, result.best.placement)
    try:
        check_within(p, b, where)
    except BoundViolation as e:
        failures.append(str(e))
    extra: dict = {}
    if machine:
        mb = machine_bound(problem, extra=(result.best.placement, *extra_placements))
        extra.update(machine_decode_tok_s=mb.decode_tok_s, machine_prefill_tok_s=mb.prefill_tok_s,
                     machine_decode_binding=mb.decode_binding, machine_prefill_binding=mb.prefill_binding)
        for what in ("decode", "prefill"):
            if getattr(b, f"{what}_tok_s") > getattr(mb, f"{what}_tok_s") * (1 + 1e-9):
                failures.append(f"{where}: plan bound {what} {getattr(b, f'{what}_tok_s'):.4g} above the machine bound")
        for what in ("decode", "prefill"):
            est = binding_estimate(problem, getattr(p, f"{what}_binding"))
            if est is None:
                continue
            extra[f"{what}_estimate"] = f"{est.name} {est.value}"
            alt = at_alternative(problem, result.best.placement, est.link)
            if alt is not None:
                extra[f"{what}_alternative"] = alt[1]
                extra[f"{what}_at_alternative"] = getattr(alt[0], f"{what}_tok_s")
    return Case(**Throughput.fields_of(p, b), routing=routing, bound_decode_binding=b.decode_binding,
                bound_prefill_binding=b.prefill_binding, vram_hit=p.hit_rate, off_nvme=1.0 - p.nvme_share, **extra)


def forced_dense_stream(problem: Problem) -> float:
    """Dense bytes per token that must stream because they cannot all fit in VRAM beside the working set
    (several GPUs: an even pipeline split, each GPU's excess over its own budget)."""
    from strata_plan.planner.placement import split_points
    L = problem.curves.n_layers
    split = split_points(problem.spec.n_layers, problem.n_gpus, 1.0 / problem.n_gpus)
    resident = Placement((0,) * L, (0,) * L, (0,) * L, (True,) * len(problem.dense_units), 0, split)
    fp = footprint(problem, resident)
    if split:
        return float(sum(max(0, u - b) for u, b in zip(fp.per_gpu_vram, problem.budget.gpus)))
    return float(max(0, fp.vram - problem.budget.vram))


def pcie_peak(problem: Problem) -> float:
    """Best H2D bytes/s of the machine's GPUs together: each GPU's peak added, capped by the host side's
    concurrent H2D (one GPU: its peak)."""
    if problem.n_gpus == 1:
        return link_peaks(problem.profile)["pcie"]
    total = sum(link_peaks(problem.profile, g)["pcie"] for g in problem.gpus)
    return min(total, problem.profile.concurrent_h2d().value * 1e9)


def needed_hit_rates(problem: Problem, claim: Claim) -> Needs:
    """See `Needs`. Uses the claim's low end (the most lenient), the mean expert bytes of the tier mix, and
    only the dense bytes the card cannot hold (`forced_dense_stream`)."""
    spec, mix, C = problem.spec, problem.mix, problem.prefill_chunk
    peaks = dict(link_peaks(problem.profile), pcie=pcie_peak(problem))
    streamed = forced_dense_stream(problem)
    counts = mix.counts(spec.n_routed)
    per_layer = sum(c * spec.routed_expert_bytes(f) for f, c in zip(mix.formats, counts))   # all experts, bytes
    routed_token = spec.n_moe_layers * spec.top_k * per_layer / spec.n_routed
    touched_chunk = spec.n_moe_layers * per_layer * (1.0 - (1.0 - spec.top_k / spec.n_routed) ** C)

    def need(allowed: float, total: float) -> float | None:
        if allowed <= 0:
            return None
        return max(0.0, 1.0 - allowed / total)
    d, pf = claim.decode[0], claim.prefill[0]
    return Needs(need(peaks["pcie"] / d - streamed, routed_token), need(peaks["nvme"] / d, routed_token),
                 need(peaks["pcie"] * C / pf - streamed, touched_chunk), need(peaks["nvme"] * C / pf, touched_chunk))


def check_bandwidth_monotone(problem: Problem, placement, where: str, out: list[str]) -> None:
    """A fixed plan on a machine with one link (or all) BANDWIDTH_FACTOR faster must not predict less."""
    base = CostModel(problem).predict(placement)
    f = BANDWIDTH_FACTOR
    for link, kw in (("pcie", {"pcie": f}), ("nvme", {"nvme": f}), ("hbm", {"hbm": f}), ("compute", {"compute": f}),
                     ("all", {"pcie": f, "nvme": f, "hbm": f, "compute": f})):
        fast = CostModel(problem.replace(profile=scale_links(problem.profile, **kw))).predict(placement)
        for what in ("decode_tok_s", "prefill_tok_s"):
            if getattr(fast, what) < getattr(base, what) * (1 - 1e-12):
                out.append(f"{where}: {link} x{f} predicts {what} {getattr(fast, what):.4g} < {getattr(base, what):.4g}")


def compare_tables(profiles=None, model: str = SEED_MODEL, trials: int = 60, seed: int = 0, tokens: int | None = None,
                   context: int = DEFAULT_CONTEXT, chunk: int = DEFAULT_CHUNK,
                   progress: Callable[[str, int, int], None] | None = None) -> Comparison:
    """progress(what, done, total), if given, is called as the work starts and after every search trial
    (`total`: the trials of every search the comparison runs)."""
    from strata_plan.planner.capacity import Budget
    from strata_plan.core.routing.sources import load_routing
    from strata_plan.planner.make import load_machine
    from strata_plan.core.routing import SKEWED_PRIOR
    from strata_plan.planner.search import search
    from strata_plan.core.spec import load_spec
    spec = load_spec(model)
    names = list(profiles or DEFAULT_PROFILES)
    machines = {name: load_machine(name) for name in names}
    total = trials * sum(5 if machines[n].n_gpus > 1 else 3 for n in names)   # searches: see the loop below
    done = [0]

    def on_trial(what: str):
        def tick(number: int, value: float) -> None:
            done[0] += 1
            progress(what, done[0], total)
        return tick if progress else None
    if progress:
        progress(f"sampling routing for {spec.name}", 0, total)
    routings = {"uniform": load_routing(spec, prior="uniform", tokens=tokens),
                SKEWED_PRIOR: load_routing(spec, prior=SKEWED_PRIOR, tokens=tokens)}
    rows, failures = [], []
    for name in names:
        prof = machines[name]
        budget = Budget.from_profile(prof, gpus=prof.n_gpus)
        cases, skewed, one_case = {}, None, None
        for routing, stats in routings.items():
            problem = Problem(spec, prof, stats, budget, context, chunk)
            if problem.n_gpus > 1:
                one, result, m1 = _two_gpu_search(problem, trials, seed, f"{name}/{routing}", failures,
                                                  on_trial(f"{name}, {routing}"))
                extra = (m1.decode_placement, m1.prefill_placement)
                if routing == SKEWED_PRIOR:
                    one_case = _case(f"{routing}, first GPU alone", first_gpu_problem(problem), one,
                                     f"{name}/{routing}/first GPU", failures, machine=False)
            else:
                result, extra = search(problem, trials=trials, seed=seed, on_trial=on_trial(f"{name}, {routing}")), ()
            cases[routing] = _case(routing, problem, result, f"{name}/{routing}", failures, extra_placements=extra)
            if problem.n_gpus > 1:
                for what in ("decode", "prefill"):
                    if getattr(cases[routing], f"machine_{what}_tok_s") < getattr(m1, f"{what}_tok_s") * (1 - 1e-12):
                        failures.append(f"{name}/{routing}: two-GPU machine bound {what} below the first GPU's alone")
            check_bandwidth_monotone(problem, result.best.placement, f"{name}/{routing}", failures)
            if routing == SKEWED_PRIOR:
                skewed = (problem, result)
        problem, result = skewed
        bigger = problem.replace(budget=dataclasses.replace(budget, ram=int(budget.ram * RAM_FACTOR)))
        more = search(bigger, trials=trials, seed=seed, start=result.best.placement, start_knobs=result.best.knobs,
                      on_trial=on_trial(f"{name}, {RAM_FACTOR:g}x RAM"))
        more_case = _case(f"{SKEWED_PRIOR}, {RAM_FACTOR:g}x RAM", bigger, more, f"{name}/{RAM_FACTOR:g}x RAM", failures,
                          machine=False)
        if more_case.decode_tok_s < cases[SKEWED_PRIOR].decode_tok_s * (1 - 1e-12):
            failures.append(f"{name}: {RAM_FACTOR:g}x RAM search predicts decode {more_case.decode_tok_s:.4g} < "
                            f"{cases[SKEWED_PRIOR].decode_tok_s:.4g} with less RAM")
        claim = SEED_CLAIMS.get(name, Claim("(not in the seed's table)", (0.0, 0.0), (0.0, 0.0)))
        needs = needed_hit_rates(problem, claim) if claim.decode[0] > 0 else Needs(None, None, None, None)
        rows.append(Row(name, prof.gpu.name, prof.gpu.vram_gb.value, budget.ram / 1e9, claim, cases["uniform"],
                        cases[SKEWED_PRIOR], more_case, needs, budget.n_gpus, one_case))
    return Comparison(spec.name, SKEWED_PRIOR, trials, seed, context, chunk, tuple(rows), tuple(failures))


def _two_gpu_search(problem: Problem, trials: int, seed: int, where: str, failures: list[str], on_trial=None):
    """(the first GPU's best result alone, the two-GPU result started from it, the first GPU's machine bound):
    the same trials on each; a two-GPU plan predicting less than the first GPU's alone is a
    failure (a second GPU never predicts slower)."""
    from strata_plan.planner.search import search
    one_p = first_gpu_problem(problem)
    one = search(one_p, trials=trials, seed=seed, on_trial=on_trial)
    two = search(problem, trials=trials, seed=seed, start=one.best.placement, start_knobs=one.best.knobs,
                 on_trial=on_trial)
    for what in ("decode_tok_s", "prefill_tok_s"):
        a, b = getattr(one.best.prediction, what), getattr(two.best.prediction, what)
        if what == "decode_tok_s" and b < a * (1 - 1e-12):
            failures.append(f"{where}: two GPUs predict {what} {b:.4g} < {a:.4g} on the first GPU alone")
    return one, two, machine_bound(one_p, extra=(one.best.placement,))


# ------------------------------------------------------------------------------------------------
# Markdown
# ------------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "unreachable" if x is None else f"{x:.1%}"


def _tok(v: float, binding: str) -> str:
    return f"{v:.3g} ({binding})"


def _columns(c: Comparison, phase: str) -> list[tuple[str, Callable[[Row], str]]]:
    """(header, cell) of each column of the decode or prefill table."""
    sk = c.skewed_prior
    tok = lambda case, what: _tok(getattr(case, f"{what}_tok_s"), getattr(case, f"{what}_binding"))  # noqa: E731
    needs = lambda r: (_pct(getattr(r.needs, f"{phase}_vram_hit")) + " / "  # noqa: E731
                       + _pct(getattr(r.needs, f"{phase}_off_nvme")))
    cols = [("profile", lambda r: r.profile)]
    if phase == "decode":
        cols.append(("GPU", lambda r: f"{_times(r)}{r.gpu} ({_times(r)}{r.vram_gb:g} GB, {r.ram_gb:g} GB pinned)"))
    cols += [("seed claim", lambda r: Claim.fmt(getattr(r.claim, phase))),
             ("predicted, uniform", lambda r: tok(r.uniform, phase)),
             (f"predicted, {sk}", lambda r: tok(r.skewed, phase)),
             (f"bound (binding), uniform / {sk}",
              lambda r: f"{tok(r.uniform, 'bound_' + phase)} / {tok(r.skewed, 'bound_' + phase)}"),
             (f"machine bound, uniform / {sk}",
              lambda r: f"{tok(r.uniform, 'machine_' + phase)} / {tok(r.skewed, 'machine_' + phase)}"),
             (f"estimated input binding ({sk})", lambda r: getattr(r.skewed, f"{phase}_estimate") or "none"),
             (f"predicted at a typical alternative ({sk})", lambda r: _alt(r.skewed, phase))]
    if phase == "decode" and any(r.one_gpu is not None for r in c.rows):
        cols.append((f"predicted, {sk}, first GPU alone",
                     lambda r: tok(r.one_gpu, phase) if r.one_gpu is not None else "-"))
    if phase == "decode":
        cols += [("claim needs: VRAM hit / traffic off NVMe", needs),
                 (f"{sk} plan has: VRAM hit / off NVMe", lambda r: f"{r.skewed.vram_hit:.1%} / {r.skewed.off_nvme:.1%}"),
                 (f"predicted, {sk}, {RAM_FACTOR:g}x pinned RAM", lambda r: tok(r.more_ram, phase))]
    else:
        cols.append(("claim needs: VRAM share of touched experts / off NVMe", needs))
    return cols


def _times(r: Row) -> str:
    return f"{r.n_gpus}x " if r.n_gpus > 1 else ""


def _alt(case: Case, phase: str) -> str:
    alt = getattr(case, f"{phase}_alternative")
    return f"{getattr(case, f'{phase}_at_alternative'):.3g} at {alt}" if alt else "-"


def _table(c: Comparison, phase: str) -> list[str]:
    cols = _columns(c, phase)
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    return lines + ["| " + " | ".join(cell(r) for _, cell in cols) + " |" for r in c.rows]


def to_markdown(c: Comparison) -> str:
    out = [f"# {c.model}: the seed's throughput table beside strata-plan's predictions", "",
           f"Seed figures are one author's published claims. Predicted figures come from strata-plan's cost model "
           f"for the best plan an Optuna search found ({c.trials} trials, seed {c.seed}) on each shipped profile, "
           f"context {c.context}, prefill chunk {c.chunk}; they are predictions, not measurements. Bounds are "
           f"physical: bytes per token over each link's peak bandwidth, everything overlapped, no overheads; the "
           f"plan's bound belongs to its placement, the machine bound is the best bound over placements that put "
           f"the hottest experts in the fastest tiers on the same budgets (planner/PLANNER.md). Where the input "
           f"behind a prediction's binding resource is an estimate, the row names it and predicts the same plan "
           f"with that input at a typical alternative. "
           f"Routing: `uniform` and the skewed prior `{c.skewed_prior}`.", "",
           "## Decode (batch 1), tok/s", "", *_table(c, "decode"),
           "", f"## Prefill (chunks of {c.chunk} tokens), tok/s", "", *_table(c, "prefill")]
    out += ["", "How to read the needed hit rates: *VRAM hit* is the share of routed-expert bytes that must already "
            "be in VRAM if every miss came from pinned RAM at the profile's best H2D rate, after the dense weights "
            "that cannot fit in VRAM stream (`unreachable`: those dense weights alone exceed the time budget); "
            "*off NVMe* is the share that must not be read from NVMe at the drive's best rate. Both use the claim's "
            "low end and the seed's 1.92-bpw tier mix, and both are necessary, not sufficient.", "",
            "Checks: " + ("all predictions within their bounds; fixed plans never slower with a faster link; "
                          f"the {RAM_FACTOR:g}x-RAM search never slower than its smaller budget"
                          + ("; two GPUs never predicted, nor bounded, below the first GPU alone"
                             if any(r.n_gpus > 1 for r in c.rows) else "") + "." if not c.failures
                          else "FAILED: " + "; ".join(c.failures)), ""]
    return "\n".join(out)


def table_cells(c: Comparison, phase: str) -> tuple[list[str], list[list[str]]]:
    """The decode or prefill table as (headers, one row of cells per profile): what the markdown holds, for
    printing it another way (the command line at 80 columns)."""
    cols = _columns(c, phase)
    return [h for h, _ in cols], [[cell(r) for _, cell in cols] for r in c.rows]
