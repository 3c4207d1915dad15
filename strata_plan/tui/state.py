"""What the wizard has chosen so far, as the arguments of `make_plan` and as the equivalent command lines.

`Choices` is the only input of the search: the TUI calls `make_plan(**choices.plan_call())` and prints
`choices.plan_argv(out)`, which `strata-plan plan` turns into the same call, so the plan the wizard saves
equals the one its printed command writes. `Session` holds what the steps have produced (the measured
profile, the plan, the analysis) for the screens to read. No Textual here.
"""
from __future__ import annotations

import shlex
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from strata_plan.errors import UserError
from strata_plan.planner.problem import DEFAULT_CHUNK, DEFAULT_CONTEXT, DEFAULT_TRIALS

DEFAULT_PROFILE = "rtx-4090"
DEFAULT_MODEL = "mixtral-8x7b"
OBJECTIVES = {"decode": "decode", "prefill": "prefill", "both": "mix"}   # wizard label -> --objective


@dataclass(frozen=True)
class Choices:
    profile: str = DEFAULT_PROFILE      # a shipped profile name or a profile YAML path
    gpu_preset: str = ""                # a shipped profile whose GPU a host-only profile borrows
    vram_gb: float | None = None        # None: the planner's default (whole card, pinnable RAM, drive size)
    ram_gb: float | None = None
    nvme_gb: float | None = None
    model: str = DEFAULT_MODEL          # a shipped spec name or a config.json path
    stats: str = ""                     # routing statistics YAML or trace .npz ...
    prior: str = ""                     # ... or a named prior ("": the planner's default, uniform)
    context: int = DEFAULT_CONTEXT
    chunk: int = DEFAULT_CHUNK
    trials: int = DEFAULT_TRIALS
    objective: str = "decode"           # decode, prefill or mix (the wizard calls it "both")
    mix_weight: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.stats and self.prior:
            raise ValueError("statistics and a prior are exclusive")
        if self.objective not in OBJECTIVES.values():
            raise ValueError(f"objective {self.objective!r}")

    def with_(self, **changes) -> "Choices":
        return replace(self, **changes)

    def plan_call(self) -> dict:
        """Keyword arguments of `planner.make.make_plan` (profile and model included)."""
        return dict(profile=self.profile, model=self.model, stats=self.stats or None, prior=self.prior or None,
                    gpu_preset=self.gpu_preset or None, context=self.context, chunk=self.chunk, trials=self.trials,
                    objective=self.objective, mix_weight=self.mix_weight, vram_gb=self.vram_gb,
                    ram_gb=self.ram_gb, nvme_gb=self.nvme_gb, seed=self.seed)

    def plan_argv(self, out: str, profile: str | None = None) -> list[str]:
        """`strata-plan plan ...` arguments making the same plan; `profile` replaces the profile argument
        (the wizard points it at the profile YAML it saves)."""
        argv = ["plan", "--profile", profile or self.profile, "--model", self.model]
        if self.gpu_preset:
            argv += ["--gpu-preset", self.gpu_preset]
        for flag, v in (("--vram-gb", self.vram_gb), ("--ram-gb", self.ram_gb), ("--nvme-gb", self.nvme_gb)):
            if v is not None:
                argv += [flag, _num(v)]
        if self.stats:
            argv += ["--stats", self.stats]
        if self.prior:
            argv += ["--prior", self.prior]
        if self.context != DEFAULT_CONTEXT:
            argv += ["--context", str(self.context)]
        if self.chunk != DEFAULT_CHUNK:
            argv += ["--chunk", str(self.chunk)]
        argv += ["--trials", str(self.trials), "--objective", self.objective]
        if self.objective == "mix":
            argv += ["--mix-weight", _num(self.mix_weight)]
        if self.seed:
            argv += ["--seed", str(self.seed)]
        return argv + ["--out", out]


def _num(v: float) -> str:
    """A float as the shortest text that parses back to the same value (the plan must not change)."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def command(argv: list[str]) -> str:
    return shlex.join(["strata-plan", *argv])


def export_argv(plan_path: str, profile: str, out: str) -> list[str]:
    return ["export", "--format", "llama.cpp", plan_path, "--profile", profile, "--out", out]


def profile_argv(nvme_dir: str, out: str) -> list[str]:
    return ["profile", "--quick", "--nvme-dir", nvme_dir, "--out", out]


def parse_gb(text: str, what: str) -> float | None:
    """A budget field: blank for the default, else a positive number of GB (one above the machine's hardware is
    refused with the profile's figure by `Budget.from_profile`, as `strata-plan plan` refuses it)."""
    text = text.strip()
    if not text:
        return None
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise UserError(what, text, "must be a positive number of GB",
                        "type e.g. 24, or leave it blank for the default")
    return v


def parse_int(text: str, what: str, default: int, lo: int = 1) -> int:
    text = text.strip()
    if not text:
        return default
    try:
        v = int(text)
    except ValueError:
        v = lo - 1
    if v < lo:
        raise UserError(what, text, f"must be a whole number of at least {lo}", f"type e.g. {default}")
    return v


@dataclass
class Session:
    """What the wizard's steps have produced so far (mutable: the screens fill it in)."""

    choices: Choices = field(default_factory=Choices)
    measured: object | None = None          # profiler ProfileRun of "detect this machine"
    measured_path: str = ""                 # ... held in a temporary file until the Save step
    nvme_dir: str = "."                     # where the quick profile measured the disk
    plan: object | None = None              # planner Plan of the last finished search
    plan_choices: Choices | None = None     # the choices that plan was made from
    problem: object | None = None           # its planning problem (for the analysis and the export)
    whatif: object | None = None            # planner.whatif.WhatIf of that plan
    saved: tuple[str, ...] = ()             # paths written by the Save step
    _tmp: tempfile.TemporaryDirectory | None = None

    @property
    def plan_is_current(self) -> bool:
        return self.plan is not None and self.plan_choices == self.choices

    def keep_measured(self, run) -> str:
        """Hold a measured profile in a private temporary folder (removed on exit) so the planner can read it
        by path before the Save step writes it where the user wants; returns that path."""
        from strata_plan.profiles.schema import save_profile
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="strata-plan-tui-")
        self.measured = run
        self.measured_path = str(save_profile(run.profile, Path(self._tmp.name) / f"{run.profile.name}.yaml"))
        return self.measured_path

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
