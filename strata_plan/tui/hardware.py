"""Step 1, Hardware: a shipped profile, a profile YAML, or this machine measured by a quick profile (in a
worker thread, with progress); a shipped GPU for host-only profiles; the VRAM / RAM / NVMe budgets."""
from __future__ import annotations

import io
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.widgets import Button, Input, Label, ProgressBar, Select, Static

from strata_plan.errors import UserError
from strata_plan.tui.base import Cancelled, StepScreen, field_row, reporter, rows_text
from strata_plan.tui.describe import profile_rows
from strata_plan.tui.state import parse_gb

DETECT, FILE = "detect", "file"


def quick_profile(nvme_dir: str, on_progress):
    """`strata-plan profile --quick --nvme-dir DIR`, reporting progress instead of drawing a bar."""
    from rich.console import Console

    from strata_plan.profiler.run import Options, profile_machine
    return profile_machine(Options(quick=True, nvme_dir=Path(nvme_dir)), Console(file=io.StringIO()),
                           show_progress=False, on_progress=on_progress)


class HardwareScreen(StepScreen):
    STEP = 0

    def body(self) -> ComposeResult:
        from strata_plan.profiles.schema import load_profile, shipped_profiles
        ch = self.session.choices
        shipped = shipped_profiles()
        self._gpus = [n for n in shipped if load_profile(n).gpu is not None]
        source = ch.profile if ch.profile in shipped else (DETECT if ch.profile == self.session.measured_path
                                                          and ch.profile else FILE)
        options = [(n, n) for n in shipped] + [("this machine: measure it (quick profile)", DETECT),
                                               ("a profile YAML file", FILE)]
        yield field_row("machine", Select(options, value=source, allow_blank=False, id="source", compact=True))
        yield field_row("profile YAML", Input(ch.profile if source == FILE else "", placeholder="path/to/profile.yaml",
                                              id="profile-path", compact=True), id="file-row")
        yield field_row("disk to test", Input(self.session.nvme_dir, id="nvme-dir", compact=True),
                        Button("Measure", id="measure", compact=True), id="detect-row")
        yield field_row("", ProgressBar(total=1.0, show_eta=False, id="measure-bar"),
                        Label("", id="measure-phase"), id="progress-row")
        yield field_row("borrow GPU", Select([(n, n) for n in self._gpus], value=ch.gpu_preset or Select.NULL,
                                      prompt="host-only profile: borrow a shipped GPU", id="preset", compact=True),
                        id="preset-row")
        yield Static("", id="figures")
        yield Label("Budgets in GB (GB = 1e9 bytes)", classes="section")
        for key, label, value in (("vram", "VRAM", ch.vram_gb), ("ram", "pinned RAM", ch.ram_gb),
                                  ("nvme", "NVMe", ch.nvme_gb)):
            yield field_row(label, Input(_text(value), id=key, compact=True, classes="gb"),
                            Label("", id=f"{key}-default", classes="hint label-s"), classes="budget")

    def on_mount(self) -> None:
        self.query_one("#progress-row").display = False
        self.refresh_source()

    # ---- reading the widgets ---------------------------------------------------------------------
    @property
    def source(self) -> str:
        return str(self.query_one("#source", Select).value)

    def profile_arg(self) -> str:
        """The profile argument the planner gets: shipped name, YAML path, or the measured profile's file."""
        src = self.source
        if src == DETECT:
            if not self.session.measured_path:
                raise UserError("Hardware", "this machine", "not measured yet",
                                "press Measure, or pick a shipped profile")
            return self.session.measured_path
        if src == FILE:
            path = self.query_one("#profile-path", Input).value.strip()
            if not path:
                raise UserError("Hardware", "profile YAML", "no path given", "type the path of a profile YAML")
            return path
        return src

    def preset(self) -> str:
        v = self.query_one("#preset", Select).value
        return "" if v is Select.NULL else str(v)

    def load(self):
        """The profile as chosen (HardwareProfile), or a UserError."""
        from strata_plan.profiles.schema import load_profile
        return load_profile(self.profile_arg())

    # ---- reacting ------------------------------------------------------------------------------
    def on_select_changed(self, event: Select.Changed) -> None:
        self.refresh_source()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "profile-path":
            self.refresh_source()

    def refresh_source(self) -> None:
        src = self.source
        self.query_one("#file-row").display = src == FILE
        self.query_one("#detect-row").display = src == DETECT
        figures = self.query_one("#figures", Static)
        try:
            prof = self.load()
        except UserError as e:
            self.query_one("#preset-row").display = False
            figures.update(e.line() if src == FILE and self.query_one("#profile-path", Input).value else
                           "measure this machine first" if src == DETECT else "")
            return
        self.show_error("")
        self.query_one("#preset-row").display = prof.gpu is None
        gpu, shown = prof.gpu, prof
        if gpu is None and self.preset():
            from strata_plan.planner.make import load_machine
            shown = load_machine(self.profile_arg(), self.preset())
            gpu = shown.gpu
        rows = profile_rows(shown, borrowed=self.preset() if prof.gpu is None else "")
        run = self.session.measured
        if src == DETECT and run is not None and run.notes:
            rows.append(("notes", " ".join(run.notes)))
        figures.update(rows_text(rows))
        n = len(shown.gpus)
        whole = f"{gpu.vram_gb.value:.4g} on each of the {n} GPUs" if n > 1 else f"{gpu.vram_gb.value:.4g}, the whole card" if gpu else ""
        defaults = {"vram": whole if gpu else "the borrowed GPU's VRAM",
                    "ram": f"{prof.host.pinnable_gb.value:.4g}, what the profile can pin",
                    "nvme": f"{prof.nvme[0].capacity_gb.value:.4g}, the drive" if prof.nvme else "0, no drive"}
        for key, text in defaults.items():
            self.query_one(f"#{key}-default", Label).update(f"blank: {text}")

    # ---- the quick profile -----------------------------------------------------------------------
    def pressed(self, button_id: str) -> None:
        if button_id == "measure":
            self.session.nvme_dir = self.query_one("#nvme-dir", Input).value.strip() or "."
            self.query_one("#progress-row").display = True
            self.query_one("#measure", Button).disabled = True
            self.query_one("#measure-bar", ProgressBar).update(progress=0.0)
            self.query_one("#measure-bar", ProgressBar).display = True
            self.query_one("#measure-phase", Label).update("starting")
            self.measure(self.session.nvme_dir)

    @work(thread=True, exclusive=True, group="profile")
    def measure(self, nvme_dir: str) -> None:
        try:
            run = self.app.profile_fn(nvme_dir, reporter(self.app, self._progress))
        except Cancelled:
            return
        except UserError as e:
            self.app.call_from_thread(self._measured, None, e.line())
            return
        self.app.call_from_thread(self._measured, run, "")

    def _progress(self, phase: str, fraction: float) -> None:
        self.query_one("#measure-bar", ProgressBar).update(progress=fraction)
        self.query_one("#measure-phase", Label).update(phase)

    def _measured(self, run, error: str) -> None:
        self.query_one("#measure", Button).disabled = False
        if run is None:
            self.query_one("#progress-row").display = False
            self.show_error(error)
            return
        self.session.keep_measured(run)
        self.query_one("#measure-bar", ProgressBar).display = False
        self.query_one("#measure-phase", Label).update(f"measured {run.profile.name} in {run.seconds:.0f} s")
        self.refresh_source()

    # ---- leaving the step -----------------------------------------------------------------------
    def commit(self) -> None:
        from strata_plan.planner.capacity import Budget
        from strata_plan.planner.make import load_machine
        profile = self.profile_arg()
        prof = self.load()
        preset = self.preset() if prof.gpu is None else ""
        if prof.gpu is None and not preset:
            raise UserError("Hardware", "GPU", f"profile {prof.name} has no GPU", "pick a shipped GPU to borrow")
        machine = load_machine(profile, preset or None)
        vram, ram, nvme = (parse_gb(self.query_one(f"#{k}", Input).value, f"{k.upper()} budget")
                           for k in ("vram", "ram", "nvme"))
        Budget.from_profile(machine, vram, ram, nvme, gpus=max(1, machine.n_gpus))   # the planner's own checks
        self.session.choices = self.session.choices.with_(profile=profile, gpu_preset=preset, vram_gb=vram,
                                                          ram_gb=ram, nvme_gb=nvme)


def _text(v: float | None) -> str:
    return "" if v is None else f"{v:g}"
