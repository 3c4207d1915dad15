"""The frame every wizard step shares: step bar, scrolling body, error line, Back/Next, footer.

A step implements `body()` (its widgets) and `commit()` (read its widgets into the session, raising
`UserError` for bad input, which is shown on the error line instead of moving on).
"""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Label, Static

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


class StepScreen(Screen):
    STEP = 0
    NEXT_LABEL = "Next ›"
    BINDINGS = [Binding("ctrl+n", "next", "Next", priority=True),
                Binding("ctrl+b", "back", "Back", priority=True)]

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
        self.query_one("#error", Static).update(Text(message, style="bold red") if message else "")

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
