"""Step 3, Search: trials, seed and objective, then `make_plan` in a worker thread. Optuna's per-trial
callback feeds the progress bar, the best score so far and its sparkline; the interface never waits."""
from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.widgets import Button, Input, Label, ProgressBar, RadioButton, RadioSet, Sparkline, Static
from textual.worker import get_current_worker

from strata_plan.errors import UserError
from strata_plan.tui.base import Cancelled, StepScreen, field_row, rows_text
from strata_plan.tui.describe import fmt_tok, plan_rows
from strata_plan.tui.state import DEFAULT_TRIALS, OBJECTIVES, parse_int

LABELS = {"decode": "decode tok/s", "prefill": "prefill tok/s", "mix": "score √(decode × prefill)"}


class SearchScreen(StepScreen):
    STEP = 2

    def body(self) -> ComposeResult:
        ch = self.session.choices
        yield field_row("trials", Input(str(ch.trials), id="trials", compact=True, classes="gb"),
                        Label("seed", classes="label-s"), Input(str(ch.seed), id="seed", compact=True, classes="gb"))
        buttons = [RadioButton(label, value=value == ch.objective, id=f"obj-{value}", compact=True)
                   for label, value in OBJECTIVES.items()]
        yield field_row("objective", RadioSet(*buttons, id="objective", compact=True))
        yield field_row("", Button("Search", id="start", variant="success", compact=True),
                        Button("Stop", id="stop", compact=True, disabled=True))
        yield field_row("progress", ProgressBar(total=ch.trials, show_eta=False, id="search-bar"))
        yield Label("", id="search-status")
        yield Static("", id="search-result")
        yield Label("best score so far (over-budget trials drop out only at the end)", classes="hint", id="best-label")
        yield Sparkline([], id="best", summary_function=max)

    def on_screen_resume(self) -> None:
        s = self.session
        if s.plan is not None and not s.plan_is_current:
            self.query_one("#search-status", Label).update("the choices changed since the last search: search again")

    # ---- inputs ------------------------------------------------------------------------------------
    def read_inputs(self):
        objective = next((b.id.removeprefix("obj-") for b in self.query(RadioButton) if b.value), "decode")
        return self.session.choices.with_(
            trials=parse_int(self.query_one("#trials", Input).value, "trials", DEFAULT_TRIALS),
            seed=parse_int(self.query_one("#seed", Input).value, "seed", 0, lo=0), objective=objective)

    def commit(self) -> None:
        self.session.choices = self.read_inputs()
        if self.session.plan_is_current:        # (its worker may still be winding down)
            return
        if self.searching:
            raise UserError("Search", "search", "still running", "wait for it to finish, or press Stop")
        raise UserError("Search", "plan", "no plan for these choices yet", "press Search and wait for it")

    @property
    def searching(self) -> bool:
        return any(w.is_running for w in self.workers if w.group == "search")

    # ---- running ---------------------------------------------------------------------------------
    def pressed(self, button_id: str) -> None:
        if button_id == "start":
            try:
                self.session.choices = self.read_inputs()
            except UserError as e:
                self.show_error(e.line())
                return
            self.show_error("")
            self.start(self.session.choices)
        elif button_id == "stop":
            self.workers.cancel_group(self, "search")
            self._stopped("stopped")

    def start(self, choices) -> None:
        self._best: list[float] = []          # best score after each trial; the search thread appends
        self._shown = -1
        self._choices = choices
        self.query_one("#search-bar", ProgressBar).update(total=choices.trials, progress=0)
        self.query_one("#best", Sparkline).data = []
        self.query_one("#search-result", Static).update("")
        self.query_one("#search-status", Label).update(f"searching: {choices.model} on {choices.profile}")
        self.query_one("#start", Button).disabled = True
        self.query_one("#stop", Button).disabled = False
        self._timer = self.set_interval(0.1, self._show_progress)
        self.run_search(choices, self._best)

    @property
    def trials_done(self) -> int:
        return len(getattr(self, "_best", ()))

    @work(thread=True, exclusive=True, group="search")
    def run_search(self, choices, best: list[float]) -> None:
        """`make_plan` with Optuna's per-trial callback recording the best score so far (a list append, safe
        under the GIL); the interface reads it on a timer, so the search never waits for drawing."""
        from strata_plan.planner.make import make_plan
        from strata_plan.planner.optuna_log import silence
        worker = get_current_worker()
        silence()

        def on_trial(number: int, value: float) -> None:
            if worker.is_cancelled:
                raise Cancelled
            best.append(max(value, best[-1]) if best else value)
        try:
            plan = make_plan(on_trial=on_trial, **choices.plan_call())
        except Cancelled:
            return
        except UserError as e:
            self.app.call_from_thread(self._stopped, e.line())
            return
        if not worker.is_cancelled:
            self.app.call_from_thread(self._finished, plan, choices)

    def _show_progress(self) -> None:
        done, ch = len(self._best), self._choices
        if done == self._shown or not done:
            return
        self._shown = done
        self.query_one("#search-bar", ProgressBar).update(progress=done)
        self.query_one("#best", Sparkline).data = self._best[:done]
        status = f"trial {done}/{ch.trials}: best {LABELS[ch.objective]} {fmt_tok(self._best[done - 1])}"
        if done >= ch.trials:
            status += " · polishing the best placement"
        self.query_one("#search-status", Label).update(status)
        self.query_one("#best-label", Label).update(
            f"best score so far: {fmt_tok(self._best[0])} at trial 1 → {fmt_tok(self._best[done - 1])} at trial "
            f"{done} (over-budget trials drop out only at the end)")

    def _stopped(self, message: str) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.stop()
            self._show_progress()
        self.query_one("#start", Button).disabled = False
        self.query_one("#stop", Button).disabled = True
        self.query_one("#search-status", Label).update(message)

    def primary(self) -> str:
        return "next" if self.session.plan_is_current else "start"

    def _finished(self, plan, choices) -> None:
        s = self.session
        s.plan, s.plan_choices, s.problem, s.whatif, s.saved = plan, choices, None, None, ()
        self.recheck()
        self._stopped(f"done: {plan.search.trials} trials (greedy start {fmt_tok(plan.search.greedy_decode_tok_s)} "
                      f"tok/s decode); the plan, predicted:")
        self.query_one("#search-result", Static).update(rows_text(plan_rows(plan)[:2]))

