"""SVG snapshots of every wizard step at 80x24 (pytest-textual-snapshot). Refresh with
`python -m pytest tests/test_tui_snapshots.py --snapshot-update`, then look at every changed SVG (render it
to PNG, e.g. `rsvg-convert -w 1100 file.svg -o file.png`) before committing it."""
from __future__ import annotations

import dataclasses

import pytest

from strata_plan.tui.app import WizardApp
from strata_plan.tui.state import Choices, Session

SIZE = (80, 24)
CHOICES = Choices(vram_gb=10, ram_gb=4, prior="olmoe-like", trials=12)   # Mixtral across all three tiers


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def planned():
    """A finished search and its analysis, shared by the Result and Save snapshots."""
    from strata_plan.planner.make import problem_for_plan
    from strata_plan.planner.make import make_plan
    from strata_plan.tui.result import WHATIF_TRIALS
    from strata_plan.planner.whatif import what_if
    plan = make_plan(**CHOICES.plan_call())
    problem = problem_for_plan(plan, "plan", CHOICES.profile)
    return plan, problem, what_if(plan, problem, trials=WHATIF_TRIALS)


async def steady(pilot) -> None:
    """A focused text field blinks its cursor: stop the blinking so the picture does not depend on when it
    is taken."""
    from textual.widgets import Input
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False
    await pilot.pause()


def session_at(planned) -> Session:
    plan, problem, whatif = planned
    return Session(CHOICES, plan=plan, plan_choices=CHOICES, problem=problem, whatif=whatif)


def fake_quick_profile(nvme_dir, on_progress):
    from strata_plan.profiler.run import ProfileRun
    from strata_plan.profiles.schema import load_profile
    on_progress("disk: random reads", 0.5)
    on_progress("done", 1.0)
    return ProfileRun(dataclasses.replace(load_profile("rtx-4090"), name="host-test", gpus=()), {}, (), 12.0, False)


def test_hardware(snap_compare):
    async def run_before(pilot):
        pilot.app.screen.query_one("#vram").value = "10"
        pilot.app.screen.query_one("#ram").value = "4"
    assert snap_compare(WizardApp(), terminal_size=SIZE, run_before=run_before)


def test_hardware_measured_host_only(snap_compare):
    async def run_before(pilot):
        screen = pilot.app.screen
        screen.query_one("#source").value = "detect"
        await pilot.pause()
        screen.pressed("measure")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        screen.query_one("#preset").value = "rtx-5090"
    assert snap_compare(WizardApp(profile_fn=fake_quick_profile), terminal_size=SIZE, run_before=run_before)


def test_model(snap_compare):
    async def run_before(pilot):
        pilot.app.goto(1)
        await pilot.pause()
    assert snap_compare(WizardApp(Session(CHOICES)), terminal_size=SIZE, run_before=run_before)


def test_search_finished(snap_compare):
    async def run_before(pilot):
        pilot.app.goto(2)
        await pilot.pause()
        pilot.app.screen.start(CHOICES)
        await pilot.app.workers.wait_for_complete()
        await steady(pilot)
    assert snap_compare(WizardApp(Session(CHOICES)), terminal_size=SIZE, run_before=run_before)


def test_result(snap_compare, planned):
    async def run_before(pilot):
        pilot.app.goto(3)
        await pilot.pause()
    assert snap_compare(WizardApp(session_at(planned)), terminal_size=SIZE, run_before=run_before)


def test_result_scrolled_to_the_vram_plot(snap_compare, planned):
    async def run_before(pilot):
        pilot.app.goto(3)
        await pilot.pause()
        pilot.app.screen.query_one("#body").scroll_end(animate=False)
        await pilot.pause()
    assert snap_compare(WizardApp(session_at(planned)), terminal_size=SIZE, run_before=run_before)


def test_save(snap_compare, planned):
    async def run_before(pilot):
        pilot.app.goto(4)
        await pilot.pause()
        pilot.app.screen.save()
        await steady(pilot)
    assert snap_compare(WizardApp(session_at(planned)), terminal_size=SIZE, run_before=run_before)


def test_save_scrolled_to_the_llama_cpp_export(snap_compare, planned):
    async def run_before(pilot):
        pilot.app.goto(4)
        await pilot.pause()
        pilot.app.screen.save()
        pilot.app.screen.query_one("#body").scroll_end(animate=False)
        await steady(pilot)
    assert snap_compare(WizardApp(session_at(planned)), terminal_size=SIZE, run_before=run_before)
