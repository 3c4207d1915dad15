"""Step 5, Save: the profile YAML, the plan YAML and the llama.cpp export, written atomically, with the
command lines that write the same files without the wizard. Replacing an existing file, and finishing
without having saved, are asked first."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Button, Input, Label, Static

from strata_plan.errors import UserError
from strata_plan.tui.base import Confirm, StepScreen, field_row
from strata_plan.tui.state import command, export_argv, profile_argv


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-._" else "-" for c in name)


class SaveScreen(StepScreen):
    STEP = 4
    NEXT_LABEL = "Finish"

    def body(self) -> ComposeResult:
        yield Label("Files (written atomically; replacing an existing one is asked first)", classes="section first")
        yield field_row("profile YAML", Input(id="profile-out", compact=True))
        yield field_row("plan YAML", Input(id="plan-out", compact=True))
        yield field_row("llama.cpp", Input(id="export-out", compact=True))
        yield field_row("", Button("Save all three", id="save", variant="success", compact=True))
        yield Static("", id="saved")
        yield Label("The same without the wizard", classes="section")
        yield Static("", id="commands")
        yield Label("llama.cpp export (whole layers per tensor: see the notes)", classes="section")
        yield Static("", id="export-preview")

    def on_screen_resume(self) -> None:
        s = self.session
        if s.plan is None or getattr(self, "_for", None) is s.plan:
            return
        self._for = s.plan
        stem = f"{_slug(s.plan.model)}-{_slug(s.plan.sources.profile.name)}"
        self.query_one("#profile-out", Input).value = f"{_slug(self.profile().name)}.yaml"
        self.query_one("#plan-out", Input).value = f"{stem}.plan.yaml"
        self.query_one("#export-out", Input).value = f"{stem}.llama-cpp.sh"
        self.query_one("#saved", Static).update("")
        self.refresh_commands()
        try:
            self.query_one("#export-preview", Static).update(Text(self.export(s.plan_choices.profile, "plan")[1]))
        except UserError as e:
            self.query_one("#export-preview", Static).update(e.line())

    def export(self, profile: str, plan_path: str) -> tuple[object, str]:
        """(problem, export text) of the session's plan, its profile read from `profile`."""
        from strata_plan.planner.export import export_text
        from strata_plan.planner.make import problem_for_plan
        s = self.session
        problem = problem_for_plan(s.plan, plan_path, profile, s.plan_choices.stats or None)
        return problem, export_text(s.plan, problem, plan_path)

    def on_input_changed(self, event: Input.Changed) -> None:
        if self.session.plan is not None:
            self.refresh_commands()

    def profile(self):
        """The profile the plan was searched on, as chosen (a host-only one stays host-only)."""
        from strata_plan.profiles.schema import load_profile
        return load_profile(self.session.plan_choices.profile)

    def paths(self) -> tuple[str, str, str]:
        out = tuple(self.query_one(f"#{k}", Input).value.strip() for k in ("profile-out", "plan-out", "export-out"))
        for name, p in zip(("profile YAML", "plan YAML", "llama.cpp export"), out):
            if not p:
                raise UserError("Save", name, "no path given", "type a file name")
        if len(set(out)) < 3:
            raise UserError("Save", "paths", "two files have the same path", "give each file its own name")
        return out

    def commands(self, profile_out: str, plan_out: str, export_out: str) -> list[str]:
        s = self.session
        lines = []
        if s.measured is not None and s.plan_choices.profile == s.measured_path:
            lines.append(command(profile_argv(s.nvme_dir, profile_out)) + "   # measures again: figures vary")
        lines.append(command(s.plan_choices.plan_argv(plan_out, profile=profile_out)))
        lines.append(command(export_argv(plan_out, profile_out, export_out)))
        return lines

    def refresh_commands(self) -> None:
        try:
            lines = self.commands(*self.paths())
        except UserError as e:
            lines = [e.line()]
        self.query_one("#commands", Static).update(Text("\n".join(f"$ {line}" for line in lines)))

    def primary(self) -> str:
        return "next" if self.session.saved else "save"

    def check(self) -> None:
        self.paths()

    def pressed(self, button_id: str) -> None:
        if button_id == "save":
            try:
                paths = self.paths()
            except UserError as e:
                self.show_error(e.line())
                return
            from strata_plan.outpaths import existing
            there = existing(paths)
            if there:
                self.app.push_screen(Confirm(f"Replace {', '.join(there)}?", "Replace"),
                                     lambda yes: self._save() if yes else None)
            else:
                self._save()

    def _save(self) -> None:
        try:
            self.save()
        except UserError as e:
            self.show_error(e.line())
            return
        self.show_error("")

    def action_next(self) -> None:
        """Finish; without a save since the plan was made, ask first."""
        if self.session.saved:
            super().action_next()
            return
        self.app.push_screen(Confirm("Nothing is saved yet: leave the wizard without saving?", "Leave",
                                     "Stay and save"),
                             lambda yes: self.app.exit() if yes else None)

    def save(self) -> None:
        """Profile first (the export reads it back), then the plan, then the export."""
        from strata_plan.core.plan import save_plan
        from strata_plan.profiles.schema import save_profile
        from strata_plan.yamlio import atomic_write_text
        s = self.session
        profile_out, plan_out, export_out = self.paths()
        written = [str(save_profile(self.profile(), profile_out)), str(save_plan(s.plan, plan_out))]
        _, text = self.export(profile_out, plan_out)
        written.append(str(atomic_write_text(export_out, text)))
        s.saved = tuple(written)
        self.query_one("#saved", Static).update(Text("wrote " + ", ".join(written), style="bold green"))
        self.query_one("#export-preview", Static).update(Text(text))
