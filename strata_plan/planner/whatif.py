"""What would help a plan most: the same problem with one budget or one link changed, searched again.

Each change (more VRAM, more pinned RAM, a faster NVMe or PCIe link) and each point of the VRAM sweep is a
short Optuna search warm-started from the plan (its placement, when it still fits, and its knobs), so the
answer is never worse than keeping the plan and comes back in well under a second per change. Every figure
is a cost-model prediction. `strata-plan what-if` prints this; the wizard's Result step shows it.
No Textual here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from strata_plan.errors import UserError

SWEEP_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)   # VRAM budgets, as multiples of the plan's


@dataclass(frozen=True)
class Change:
    """One hypothetical upgrade: budgets grow by GB, links get faster by a factor."""

    label: str
    vram_gb: float = 0.0
    ram_gb: float = 0.0
    nvme: float = 1.0
    pcie: float = 1.0


CHANGES = (Change("+16 GB VRAM", vram_gb=16), Change("+64 GB pinned RAM", ram_gb=64),     # VRAM: on each GPU
           Change("2x NVMe read bandwidth", nvme=2.0), Change("2x PCIe bandwidth", pcie=2.0))


@dataclass(frozen=True)
class Outcome:
    label: str
    decode_tok_s: float
    prefill_tok_s: float
    decode_binding: str
    score: float                      # what the plan's objective maximises

    def gain_text(self, base: "Outcome", objective: str) -> str:
        d, p = self.decode_tok_s - base.decode_tok_s, self.prefill_tok_s - base.prefill_tok_s
        if objective == "decode":
            return f"{d:+.3g} tok/s"
        if objective == "prefill":
            return f"{p:+.3g} tok/s prefill"
        return f"{d:+.3g} decode, {p:+.3g} prefill tok/s"


@dataclass(frozen=True)
class SweepPoint:
    vram_gb: float
    decode_tok_s: float
    prefill_tok_s: float
    fits: bool                        # False: the working set alone exceeds this VRAM budget
    is_plan: bool


@dataclass(frozen=True)
class WhatIf:
    objective: str
    base: Outcome
    changes: tuple[Outcome, ...]
    sweep: tuple[SweepPoint, ...]

    @property
    def ranked(self) -> tuple[Outcome, ...]:
        """Changes, most helpful first."""
        return tuple(sorted(self.changes, key=lambda c: -c.score))

    @property
    def best(self) -> Outcome | None:
        return self.ranked[0] if self.changes else None

    def as_data(self) -> dict:
        return {"label": "predicted", **dataclasses.asdict(self)}


def _outcome(label: str, pred, objective: str, mix_weight: float) -> Outcome:
    from strata_plan.planner.search import score
    return Outcome(label, pred.decode_tok_s, pred.prefill_tok_s, pred.decode_binding,
                   score(pred, objective, mix_weight))


def replan(problem, plan, trials: int) -> object | None:
    """Best prediction of a warm-started search on `problem` (a changed copy of the plan's), or None when
    nothing fits it."""
    from strata_plan.planner.placement import Knobs, placement_of
    from strata_plan.planner.search import search
    s = plan.search
    names = {f.name for f in dataclasses.fields(Knobs)}
    needed = {f.name for f in dataclasses.fields(Knobs) if f.default is dataclasses.MISSING}
    knobs = Knobs(**s.knobs) if s.knobs and needed <= set(s.knobs) <= names else None   # None: older knobs
    try:
        result = search(problem, trials=trials, seed=s.seed, objective=s.objective, mix_weight=s.mix_weight,
                        start=placement_of(plan), start_knobs=knobs)
    except UserError:
        return None
    return result.best.prediction


def with_vram(b, change: Callable[[int], int]):
    """Budget `b` with `change` applied to the VRAM of each GPU (one GPU: to `vram`)."""
    from strata_plan.planner.capacity import Budget
    if b.gpus:
        gpus = tuple(change(v) for v in b.gpus)
        return Budget(sum(gpus), b.ram, b.nvme, b.reserve, gpus)
    return Budget(change(b.vram), b.ram, b.nvme, b.reserve)


def changed_problem(problem, change: Change):
    from strata_plan.planner.capacity import Budget
    from strata_plan.planner.estimated import scale_links
    b = problem.budget
    budget = with_vram(Budget(b.vram, b.ram + int(change.ram_gb * 1e9), b.nvme, b.reserve, b.gpus),
                       lambda v: v + int(change.vram_gb * 1e9))          # several GPUs: on each
    profile = problem.profile
    if change.nvme != 1.0 or change.pcie != 1.0:
        profile = scale_links(profile, pcie=change.pcie, nvme=change.nvme)
    return problem.replace(budget=budget, profile=profile)


def what_if(plan, problem, trials: int = 16, changes: tuple[Change, ...] = CHANGES,
            factors: tuple[float, ...] = SWEEP_FACTORS,
            on_step: Callable[[int, int], None] | None = None) -> WhatIf:
    """Re-plan `problem` (the plan's, see `planner.make.problem_for_plan`) under each change and each VRAM
    budget of the sweep; `on_step(done, total)` reports progress (and may raise to cancel)."""
    s = plan.search
    total, done = len(changes) + len(factors), 0

    def step() -> None:
        nonlocal done
        done += 1
        if on_step is not None:
            on_step(done, total)

    base = _outcome("as planned", plan.predicted, s.objective, s.mix_weight)
    out = []
    for c in changes:
        pred = replan(changed_problem(problem, c), plan, trials)
        label = c.label + (" on each GPU" if c.vram_gb and problem.n_gpus > 1 else "")
        out.append(_outcome(label, pred, s.objective, s.mix_weight) if pred else Outcome(label, 0.0, 0.0, "", 0.0))
        step()
    b, sweep = problem.budget, []
    for f in factors:
        vram = int(b.vram * f)
        if f == 1.0:
            sweep.append(SweepPoint(vram / 1e9, base.decode_tok_s, base.prefill_tok_s, True, True))
        else:
            try:
                changed = problem.replace(budget=with_vram(b, lambda v: int(v * f)))
            except UserError:                      # below the working set: nothing fits
                changed = None
            pred = replan(changed, plan, trials) if changed is not None else None
            sweep.append(SweepPoint(vram / 1e9, pred.decode_tok_s if pred else 0.0,
                                    pred.prefill_tok_s if pred else 0.0, pred is not None, False))
        step()
    return WhatIf(s.objective, base, tuple(out), tuple(sweep))
