"""Step 4, Result: the plan's predictions (labelled predicted, with bounds and binding resources), the
per-layer tier heat strip, bytes per token per tier, what would help most and predicted decode tok/s
against the VRAM budget. The last two come from `whatif.what_if` in a worker thread."""
from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.widgets import Label, ProgressBar, Static

from strata_plan.errors import UserError
from strata_plan.tui.base import Cancelled, StepScreen, reporter, rows_text
from strata_plan.tui.describe import fmt_tok, plan_rows
from strata_plan.tui.widgets import Bar, BarPlot, LayerTiers, TierMap

WHATIF_TRIALS = 16      # per change and per VRAM point: warm-started, so a few trials suffice


class ResultScreen(StepScreen):
    STEP = 3

    def body(self) -> ComposeResult:
        yield Static("", id="headline")
        yield Label("Experts of each MoE layer per tier (heat strip)", classes="section")
        yield TierMap(id="tiers")
        yield Label("What would help most (predicted, re-planned per change)", classes="section")
        yield ProgressBar(total=1, show_eta=False, id="whatif-bar")
        yield Static("", id="whatif")
        yield Label("Predicted decode tok/s against the VRAM budget (GB)", classes="section")
        yield BarPlot(rows=8, id="sweep")
        yield Label("green: the plan's budget · ×: the working set alone does not fit", classes="hint")

    def on_screen_resume(self) -> None:
        s = self.session
        if s.plan is None or getattr(self, "_shown", None) is s.plan:
            return
        self._shown = s.plan
        self.query_one("#headline", Static).update(self.headline(s.plan, s.plan_choices))
        self.query_one("#tiers", TierMap).set_layers(
            LayerTiers(l.layer, len(l.vram), len(l.ram), len(l.nvme)) for l in s.plan.layers)
        if s.whatif is None:
            self.query_one("#whatif-bar", ProgressBar).display = True
            self.query_one("#whatif", Static).update(Text("re-planning with bigger budgets and faster links…",
                                                          style="dim"))
            self.query_one("#sweep", BarPlot).set_bars(())
            self.analyse(s.plan, s.plan_choices)
        else:
            self.show_whatif(s.whatif)

    @staticmethod
    def headline(plan, choices) -> Group:
        b = plan.memory.budgets
        title = Text(f"{plan.model} on {plan.sources.profile.name}, {plan.sources.statistics.name}", style="bold")
        budgets = ("budgets", f"VRAM {b.vram_bytes / 1e9:g} · RAM {b.ram_bytes / 1e9:g} · NVMe "
                              f"{b.nvme_bytes / 1e9:g} GB")
        return Group(title, rows_text([budgets, *plan_rows(plan)]))

    @work(thread=True, exclusive=True, group="whatif")
    def analyse(self, plan, choices) -> None:
        from strata_plan.planner.make import problem_for_plan
        from strata_plan.planner.whatif import what_if
        try:
            problem = problem_for_plan(plan, "the plan", choices.profile, choices.stats or None)
            result = what_if(plan, problem, trials=WHATIF_TRIALS, on_step=reporter(self.app, self._step))
        except Cancelled:
            return
        except UserError as e:
            self.app.call_from_thread(self.query_one("#whatif", Static).update, e.line())
            return
        self.app.call_from_thread(self._analysed, plan, problem, result)

    def _step(self, done: int, total: int) -> None:
        self.query_one("#whatif-bar", ProgressBar).update(total=total, progress=done)

    def _analysed(self, plan, problem, result) -> None:
        if self.session.plan is not plan:            # a newer search finished meanwhile
            return
        self.session.problem, self.session.whatif = problem, result
        self.show_whatif(result)

    def show_whatif(self, result) -> None:
        self.query_one("#whatif-bar", ProgressBar).display = False
        t = Table.grid(padding=(0, 2))
        t.add_column(width=24, no_wrap=True)
        t.add_column(min_width=11, justify="right", no_wrap=True)
        for i, c in enumerate(result.ranked):
            after = f"→ {fmt_tok(c.decode_tok_s)} tok/s decode ({c.decode_binding})" if c.score else "nothing fits"
            t.add_row(Text(c.label, style="bold" if i == 0 else ""), c.gain_text(result.base, result.objective),
                      Text(after, style="dim"))
        best = result.best
        note = Text("")
        if best is None or best.score <= result.base.score * (1 + 1e-6):
            note = Text(f"None of these helps: decode is bound by {result.base.decode_binding}, which no budget "
                        "or link here changes.", style="italic")
        self.query_one("#whatif", Static).update(Group(t, note))
        self.query_one("#sweep", BarPlot).set_bars(
            Bar(f"{p.vram_gb:.3g}", p.decode_tok_s if p.fits else None, p.is_plan) for p in result.sweep)
