"""Step 2, Model: a shipped spec or a config.json; measured routing statistics or a named prior; the context
and prefill chunk. Leaving the step builds the planning problem once (`make_problem`), so every mismatch
(statistics of another model, a working set larger than the VRAM budget) shows here, in one line."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Input, Label, Select, Static

from strata_plan.errors import UserError
from strata_plan.tui.base import StepScreen, field_row, rows_text
from strata_plan.tui.describe import model_rows
from strata_plan.tui.state import DEFAULT_CHUNK, DEFAULT_CONTEXT, parse_int

FILE = "file"


class ModelScreen(StepScreen):
    STEP = 1

    def body(self) -> ComposeResult:
        from strata_plan.core.routing import shipped_priors
        from strata_plan.core.spec import shipped_models
        ch = self.session.choices
        models = shipped_models()
        model = ch.model if ch.model in models else FILE
        priors = shipped_priors()
        routing = ch.prior or ("" if not ch.stats else FILE) or "uniform"
        yield field_row("model", Select([(m, m) for m in models] + [("a config.json file", FILE)], value=model,
                                        allow_blank=False, id="model", compact=True))
        yield field_row("config.json", Input(ch.model if model == FILE else "", placeholder="path/to/config.json",
                                             id="config", compact=True), id="config-row")
        yield Static("", id="model-figures")
        yield Label("Routing: which experts tokens use", classes="section")
        yield field_row("routing", Select([(f"prior: {p}", p) for p in priors] +
                                          [("measured statistics (strata-plan stats) or a trace .npz", FILE)],
                                          value=routing if routing in priors or routing == FILE else "uniform",
                                          allow_blank=False, id="routing", compact=True))
        yield field_row("statistics", Input(ch.stats, placeholder="path/to/stats.yaml or trace.npz", id="stats",
                                            compact=True), id="stats-row")
        yield Static("", id="routing-figures")
        yield field_row("context", Input(str(ch.context), id="context", compact=True, classes="gb"),
                        Label("tokens of KV cache;  prefill chunk", classes="label-l"),
                        Input(str(ch.chunk), id="chunk", compact=True, classes="gb"))

    def on_mount(self) -> None:
        self.refresh_model()

    def on_select_changed(self, event: Select.Changed) -> None:
        self.refresh_model()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "config":
            self.refresh_model()

    def model_arg(self) -> str:
        v = str(self.query_one("#model", Select).value)
        if v != FILE:
            return v
        path = self.query_one("#config", Input).value.strip()
        if not path:
            raise UserError("Model", "config.json", "no path given", "type the path of a Hugging Face config.json")
        return path

    def routing_args(self) -> tuple[str, str]:
        """(stats, prior): exactly one is set."""
        v = str(self.query_one("#routing", Select).value)
        if v != FILE:
            return "", v
        path = self.query_one("#stats", Input).value.strip()
        if not path:
            raise UserError("Model", "statistics", "no path given",
                            "type the path of a statistics YAML or trace .npz, or pick a prior")
        return path, ""

    def refresh_model(self) -> None:
        from strata_plan.core.spec import load_spec
        self.query_one("#config-row").display = self.query_one("#model", Select).value == FILE
        self.query_one("#stats-row").display = self.query_one("#routing", Select).value == FILE
        figures = self.query_one("#model-figures", Static)
        try:
            figures.update(rows_text(model_rows(load_spec(self.model_arg()))))
        except UserError as e:
            figures.update(e.line() if self.query_one("#config", Input).value else "")
        prior = self.query_one("#routing", Select).value
        text = ""
        if prior != FILE:
            from strata_plan.core.routing import load_prior
            pr = load_prior(str(prior))
            text = f"{pr.description} (Zipf s = {pr.zipf_s:g}, locality {pr.locality:g})"
        self.query_one("#routing-figures", Static).update(text)

    def commit(self) -> None:
        from strata_plan.planner.make import make_problem
        stats, prior = self.routing_args()
        ch = self.session.choices.with_(
            model=self.model_arg(), stats=stats, prior=prior,
            context=parse_int(self.query_one("#context", Input).value, "context", DEFAULT_CONTEXT),
            chunk=parse_int(self.query_one("#chunk", Input).value, "prefill chunk", DEFAULT_CHUNK))
        call = ch.plan_call()
        make_problem(call["profile"], call["model"], call["stats"], call["prior"], call["gpu_preset"],
                     call["context"], call["chunk"], call["vram_gb"], call["ram_gb"], call["nvme_gb"])
        self.session.choices = ch
