"""The frame every wizard step shares: step bar, scrolling body, error line, Back/Next, footer.

A step implements `body()` (its widgets) and `commit()` (read its widgets into the session, raising
`UserError` for bad input, which is shown on the error line instead of moving on). When a step opens, its
first control has the focus; Enter in a text field presses the step's primary button (`primary()`: Next
unless the step says otherwise); an error line goes away as soon as an edit fixes it. `Confirm` asks a
yes/no question over the step (replacing files, leaving without saving).
"""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Input, Label, RadioSet, Select, Static

from strata_plan.errors import UserError
from strata_plan.tui.widgets import StepBar


class Cancelled(Exception):
    """Raised inside a worker's progress callback when the wizard quits or the work is stopped."""


def reporter(app, report):
    """A progress callback for the current worker thread: raises `Cancelled` once the worker is cancelled
    (so the work stops at its next report), else hands `report(*args)` to the interface thread."""
    from textual.worker import get_current_worker
    worker = get_current_worker()

    def callback(*args) -> None:
        if worker.is_cancelled:
            raise Cancelled
        app.call_from_thread(report, *args)
    return callback


def rows_text(rows: list[tuple[str, str]], width: int = 13) -> Table:
    """(label, value) rows as a borderless two-column grid (long values wrap under themselves)."""
    t = Table.grid(padding=(0, 1))
    t.add_column(width=width, style="bold", no_wrap=True)
    t.add_column(ratio=1)
    for k, v in rows:
        t.add_row(k, v)
    return t


def field_row(label: str, *widgets, id: str | None = None, classes: str = "") -> Horizontal:
    return Horizontal(Label(label, classes="label"), *widgets, classes=f"row {classes}".strip(), id=id)


class Confirm(ModalScreen[bool]):
    """A question with two buttons; dismisses with True for `yes` (focused first, so Enter answers it)."""

    BINDINGS = [Binding("escape", "no", "Cancel")]

    def __init__(self, question: str, yes: str, no: str = "Cancel") -> None:
        super().__init__()
        self.question, self.yes, self.no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(self.question, id="question")
            with Horizontal(id="answers"):
                yield Button(self.yes, id="yes", variant="warning", compact=True)
                yield Button(self.no, id="no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#yes", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_no(self) -> None:
        self.dismiss(False)


class StepScreen(Screen):
    STEP = 0
    NEXT_LABEL = "Next ›"
    BINDINGS = [Binding("ctrl+n", "next", "Next", priority=True),
                Binding("ctrl+b", "back", "Back", priority=True)]
    # the first control of the body (the scrolling body itself can take the focus, and Enter does nothing
    # there); Next where the body has none
    AUTO_FOCUS = "#body Select, #body Input, #body RadioSet, #body Button, #next"

    @property
    def session(self):
        return self.app.session

    def compose(self) -> ComposeResult:
        yield StepBar(self.STEP, id="steps")
        with VerticalScroll(id="body"):
            yield from self.body()
        yield Static("", id="error")
        with Horizontal(id="nav"):
            yield Button("‹ Back", id="back", compact=True, disabled=self.STEP == 0)
            yield Button(self.NEXT_LABEL, id="next", variant="primary", compact=True)
        yield Footer()

    def body(self) -> ComposeResult:
        raise NotImplementedError

    def commit(self) -> None:
        """Store this step's inputs in the session; raise UserError when they are not usable."""

    def show_error(self, message: str) -> None:
        self._error = message
        self.query_one("#error", Static).update(Text(message, style="bold red") if message else "")

    def check(self) -> None:
        """What must hold for the error line to go (the step's own input checks; `commit` by default)."""
        self.commit()

    def recheck(self) -> None:
        """After an edit: clear the error line once the step's input is fine, else show the new error."""
        if not getattr(self, "_error", ""):
            return
        try:
            self.check()
        except UserError as e:
            self.show_error(e.line())
            return
        self.show_error("")

    def on_input_changed(self, event: Input.Changed) -> None:
        self.recheck()

    def on_select_changed(self, event: Select.Changed) -> None:
        self.recheck()

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        self.recheck()

    def primary(self) -> str:
        """The id of the button Enter in a text field presses."""
        return "next"

    def on_input_submitted(self, event: Input.Submitted) -> None:
        button = self.query_one(f"#{self.primary()}", Button)
        if not button.disabled:
            button.press()

    def action_next(self) -> None:
        try:
            self.commit()
        except UserError as e:
            self.show_error(e.line())
            return
        self.show_error("")
        self.app.goto(self.STEP + 1)

    def action_back(self) -> None:
        if self.STEP > 0:
            self.app.goto(self.STEP - 1)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "next":
            self.action_next()
        elif event.button.id == "back":
            self.action_back()
        else:
            self.pressed(event.button.id or "")

    def pressed(self, button_id: str) -> None:
        """A step's own buttons."""
