"""The wizard app: five step screens over one `Session`, keyboard first (Tab moves, Enter presses,
Ctrl+N / Ctrl+B go forward and back, Ctrl+C quits). Styles live in wizard.tcss."""
from __future__ import annotations

from textual.app import App
from textual.binding import Binding

from strata_plan.tui.hardware import HardwareScreen, quick_profile
from strata_plan.tui.model import ModelScreen
from strata_plan.tui.result import ResultScreen
from strata_plan.tui.save import SaveScreen
from strata_plan.tui.search import SearchScreen
from strata_plan.tui.state import Session

SCREENS = (("hardware", HardwareScreen), ("model", ModelScreen), ("search", SearchScreen),
           ("result", ResultScreen), ("save", SaveScreen))


class WizardApp(App):
    CSS_PATH = "wizard.tcss"
    TITLE = "strata-plan"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [Binding("ctrl+c", "quit", "Quit", priority=True)]

    def __init__(self, session: Session | None = None, profile_fn=None) -> None:
        """`profile_fn(nvme_dir, on_progress)` measures this machine (a quick profile by default)."""
        super().__init__()
        self.session = session or Session()
        self.profile_fn = profile_fn or quick_profile
        self.step = 0

    def on_mount(self) -> None:
        for name, cls in SCREENS:
            self.install_screen(cls(), name=name)
        self.push_screen(SCREENS[0][0])

    def goto(self, step: int) -> None:
        """Show step `step` (0-based); past the last step the wizard ends."""
        if step >= len(SCREENS):
            self.exit()
            return
        self.step = step
        self.switch_screen(SCREENS[step][0])

    async def action_quit(self) -> None:
        """Stop the workers (each checks between trials or measurements) and leave; files are only ever
        written whole (temporary file, then rename), so nothing half-written remains."""
        self.workers.cancel_all()
        self.exit()

    def on_unmount(self) -> None:
        self.session.cleanup()
