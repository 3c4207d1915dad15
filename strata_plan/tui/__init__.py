"""The `strata-plan` wizard: a Textual app from "this machine, that model" to a saved plan.

Importing this package is cheap (Textual is imported by `run()` and the screen modules only), so the rest
of the command line works where Textual is missing. README.md in this folder describes the steps.
"""
from __future__ import annotations


def run() -> int:
    """Open the wizard in this terminal; returns the exit code."""
    from strata_plan.tui.app import WizardApp
    WizardApp().run()
    return 0
