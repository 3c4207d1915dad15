"""The wizard driven headless at 80x24 (Textual's Pilot): every step by keyboard, the saved files against
the command lines the wizard prints, a measured host-only machine, bad input, Stop and Ctrl-C."""
from __future__ import annotations

import asyncio
import dataclasses
import shlex
import time
from pathlib import Path

import pytest

from strata_plan.cli import main
from strata_plan.tui.app import WizardApp
from strata_plan.tui.state import Choices, Session

SIZE = (80, 24)


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


async def wait_for(pilot, cond, timeout: float = 60.0) -> None:
    """Let the app run until `cond()` holds (plain sleeps: Pilot's own waits also wait for an idle CPU,
    which never comes while a search thread works)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the wizard")
        await asyncio.sleep(0.02)


async def focus(pilot, widget_id: str) -> None:
    """Move the focus with Tab only (keyboard use) until `#widget_id` has it."""
    for _ in range(40):
        if pilot.app.focused is not None and pilot.app.focused.id == widget_id:
            return
        await pilot.press("tab")
    raise AssertionError(f"Tab never reaches #{widget_id}")


async def type_into(pilot, widget_id: str, text: str) -> None:
    await focus(pilot, widget_id)
    value = pilot.app.focused.value
    await pilot.press("end", *["backspace"] * len(value), *text)


def asking(app) -> bool:
    """A Confirm question is up and has the focus."""
    return type(app.screen).__name__ == "Confirm" and app.focused is not None


def plain(widget) -> str:
    """What a Static shows, as plain text (Rich renderables printed on a wide console)."""
    import io

    from rich.console import Console
    con = Console(width=200, file=io.StringIO(), color_system=None)
    con.print(widget.content)
    return con.file.getvalue()


def error_line(app) -> str:
    return plain(app.screen.query_one("#error")).strip()


def without_created(path: Path) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if not line.startswith("created:"))


def run_printed(command: str, out: str) -> None:
    """Run a printed `strata-plan ...` line in-process with its --out replaced."""
    argv = shlex.split(command.removeprefix("$ ").split("   #")[0])
    assert argv[0] == "strata-plan"
    argv = argv[1:]
    argv[argv.index("--out") + 1] = out
    assert main(argv) == 0


def check_same_as_cli(app, tmp: Path) -> None:
    """The files the wizard saved equal what its printed commands write."""
    save = app.screen
    profile_out, plan_out, export_out = save.paths()
    lines = save.commands(profile_out, plan_out, export_out)
    plan_cmd = next(line for line in lines if line.startswith("strata-plan plan "))
    export_cmd = next(line for line in lines if line.startswith("strata-plan export "))
    run_printed(plan_cmd, "cli.plan.yaml")
    assert without_created(tmp / "cli.plan.yaml") == without_created(tmp / plan_out)
    run_printed(export_cmd, "cli.llama-cpp.sh")
    assert (tmp / "cli.llama-cpp.sh").read_text() == (tmp / export_out).read_text()


def test_every_step_by_keyboard_and_the_files_match_the_printed_commands(in_tmp, capsys):
    async def drive():
        app = WizardApp()
        async with app.run_test(size=SIZE) as pilot:
            await type_into(pilot, "vram", "13")
            await type_into(pilot, "ram", "16")
            await pilot.press("ctrl+n")
            assert type(app.screen).__name__ == "ModelScreen", error_line(app)
            assert (app.session.choices.vram_gb, app.session.choices.ram_gb) == (13, 16)

            await focus(pilot, "routing")                   # prior: uniform -> olmoe-like (one up)
            await pilot.press("enter", "up", "enter")
            await pilot.press("ctrl+n")
            assert type(app.screen).__name__ == "SearchScreen", error_line(app)
            assert app.session.choices.prior == "olmoe-like"

            await pilot.press("ctrl+n")                     # no plan yet: refused, in one line
            assert "no plan for these choices yet" in error_line(app)
            await type_into(pilot, "trials", "12")
            await focus(pilot, "start")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.session.plan_is_current)
            assert app.session.plan.search.trials == 12
            assert "done: 12 trials" in plain(app.screen.query_one("#search-status"))
            await pilot.press("ctrl+n")

            assert type(app.screen).__name__ == "ResultScreen"
            await wait_for(pilot, lambda: app.session.whatif is not None)
            await pilot.pause()
            plan = app.session.plan
            tiers = app.screen.query_one("#tiers").tiers
            assert [(t.layer, t.vram, t.ram, t.nvme) for t in tiers] == \
                   [(l.layer, len(l.vram), len(l.ram), len(l.nvme)) for l in plan.layers]
            bars = app.screen.query_one("#sweep").bars
            assert [b.highlight for b in bars].count(True) == 1
            assert next(b.value for b in bars if b.highlight) == plan.predicted.decode_tok_s
            headline = plain(app.screen.query_one("#headline"))
            assert "predicted" in headline and plan.predicted.decode_binding in headline
            await pilot.press("ctrl+n")

            assert type(app.screen).__name__ == "SaveScreen"
            await focus(pilot, "save")
            await pilot.press("enter")
            assert len(app.session.saved) == 3, error_line(app)
            check_same_as_cli(app, in_tmp)
            await pilot.press("ctrl+n")                     # Finish
            await pilot.pause()
            assert app.return_code == 0
    asyncio.run(drive())
    names = sorted(p.name for p in in_tmp.iterdir())
    assert names == ["cli.llama-cpp.sh", "cli.plan.yaml", "mixtral-8x7b-rtx-4090.llama-cpp.sh",
                     "mixtral-8x7b-rtx-4090.plan.yaml", "rtx-4090.yaml"]
    from strata_plan.profiles.schema import load_profile
    from strata_plan.schema import to_data
    assert to_data(load_profile(str(in_tmp / "rtx-4090.yaml"))) == to_data(load_profile("rtx-4090"))


def fake_quick_profile(nvme_dir: str, on_progress):
    """A host-only machine (no GPU), reported through the same progress callback as the real profiler."""
    from strata_plan.profiler.run import ProfileRun
    from strata_plan.profiles.schema import load_profile
    for i, phase in enumerate(("host RAM copy", "disk: write test file", "disk: random reads")):
        on_progress(phase, i / 3)
    prof = dataclasses.replace(load_profile("rtx-4090"), name="host-test", gpus=())
    return ProfileRun(prof, {}, ("no GPU found",), 0.25, False)


def test_a_measured_host_only_machine_borrows_a_shipped_gpu(in_tmp):
    async def drive():
        app = WizardApp(Session(Choices(trials=6)), profile_fn=fake_quick_profile)
        async with app.run_test(size=SIZE) as pilot:
            app.screen.query_one("#source").value = "detect"
            await pilot.pause()
            await pilot.press("ctrl+n")
            assert "not measured yet" in error_line(app)
            await focus(pilot, "measure")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.session.measured is not None)
            await pilot.pause()
            assert "measured host-test" in plain(app.screen.query_one("#measure-phase"))
            assert app.screen.query_one("#preset-row").display
            await pilot.press("ctrl+n")
            assert "has no GPU" in error_line(app)
            app.screen.query_one("#preset").value = "rtx-5090"
            await pilot.press("ctrl+n")
            ch = app.session.choices
            assert (ch.profile, ch.gpu_preset) == (app.session.measured_path, "rtx-5090")
            tmp_profile = Path(ch.profile)
            assert tmp_profile.is_file() and in_tmp not in tmp_profile.parents
            await pilot.press("ctrl+n")
            app.screen.start(app.session.choices)
            await wait_for(pilot, lambda: app.session.plan_is_current)
            for _ in range(2):
                await pilot.press("ctrl+n")
                await pilot.pause()
            assert type(app.screen).__name__ == "SaveScreen"
            assert app.screen.query_one("#profile-out").value == "host-test.yaml"
            app.screen.save()
            commands = app.screen.commands(*app.screen.paths())
            assert commands[0].startswith("strata-plan profile --quick --nvme-dir . --out host-test.yaml")
            assert "--gpu-preset rtx-5090" in commands[1]
            check_same_as_cli(app, in_tmp)
            await pilot.press("ctrl+c")
        return tmp_profile
    tmp_profile = asyncio.run(drive())
    assert not tmp_profile.exists(), "the measured profile's temporary copy outlives the wizard"
    from strata_plan.profiles.schema import load_profile
    assert load_profile(str(in_tmp / "host-test.yaml")).gpu is None


def test_bad_input_stays_on_the_step_with_one_line(in_tmp):
    async def drive():
        app = WizardApp()
        async with app.run_test(size=SIZE) as pilot:
            await type_into(pilot, "vram", "lots")
            await pilot.press("ctrl+n")
            assert type(app.screen).__name__ == "HardwareScreen"
            assert error_line(app) == "VRAM budget: lots: must be a positive number of GB; fix: type e.g. 24, or " \
                                      "leave it blank for the default"
            await type_into(pilot, "vram", "1000")          # more than the card has: refused as `plan` refuses it
            await pilot.press("ctrl+n")
            assert type(app.screen).__name__ == "HardwareScreen"
            assert "1000: exceeds the 24 GB of VRAM of profile rtx-4090" in error_line(app)
            await type_into(pilot, "vram", "2")
            await pilot.press("ctrl+n")                     # fine as a number; too small for Mixtral's working set
            await pilot.press("ctrl+n")
            assert type(app.screen).__name__ == "ModelScreen"
            assert "below the working set" in error_line(app)
            app.screen.query_one("#model").value = "file"
            await type_into(pilot, "config", "nowhere/config.json")
            await pilot.press("ctrl+n")
            assert "nowhere/config.json: file not found" in error_line(app)
    asyncio.run(drive())
    assert list(in_tmp.iterdir()) == []


def test_the_search_runs_in_the_background_and_stops(in_tmp):
    async def drive():
        app = WizardApp(Session(Choices(trials=100_000)))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("ctrl+n", "ctrl+n")
            screen = app.screen
            await focus(pilot, "start")
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen.trials_done >= 5)
            status = plain(screen.query_one("#search-status"))
            app.simulate_key("shift+tab")                   # the interface answers keys while trials run ...
            await wait_for(pilot, lambda: app.focused is not None and app.focused.id != "start", timeout=2)
            await wait_for(pilot, lambda: plain(screen.query_one("#search-status")) != status, timeout=2)
            assert screen.searching                         # ... and redraws the progress as they do
            screen.query_one("#stop").press()
            await wait_for(pilot, lambda: not screen.searching, timeout=5)
            assert "stopped" in plain(screen.query_one("#search-status"))
            assert app.session.plan is None
    asyncio.run(drive())


def test_ctrl_c_quits_mid_search_without_files(in_tmp):
    async def drive():
        app = WizardApp(Session(Choices(trials=100_000)))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("ctrl+n", "ctrl+n")
            app.screen.start(app.session.choices)
            await wait_for(pilot, lambda: app.screen.trials_done >= 3)
            t0 = time.monotonic()
            await pilot.press("ctrl+c")
        return time.monotonic() - t0
    assert asyncio.run(drive()) < 10
    assert list(in_tmp.iterdir()) == []


@pytest.fixture(scope="module")
def finished():
    """A finished search (Mixtral across all three tiers), to start the wizard at its later steps."""
    from strata_plan.planner.make import make_plan
    choices = Choices(vram_gb=10, ram_gb=4, prior="olmoe-like", trials=8)
    return choices, make_plan(**choices.plan_call())


def test_each_step_opens_on_its_first_control_and_enter_presses_its_primary_button(in_tmp):
    async def drive():
        app = WizardApp(Session(Choices(trials=6)))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert app.focused.id == "source"                  # Enter works at once: no Tab first
            await type_into(pilot, "vram", "13")
            await pilot.press("enter")                         # Enter in a field: Next
            await pilot.pause()
            assert type(app.screen).__name__ == "ModelScreen" and app.focused.id == "model"
            await pilot.press("ctrl+n")
            await pilot.pause()
            assert type(app.screen).__name__ == "SearchScreen" and app.focused.id == "trials"
            await pilot.press("enter")                         # no plan yet: Enter starts the search
            await wait_for(pilot, lambda: app.session.plan_is_current)
            await pilot.pause()
            assert app.screen.primary() == "next"
            app.screen.query_one("#trials").focus()
            await pilot.press("enter")                         # a plan for these choices: Enter goes on
            await pilot.pause()
            assert type(app.screen).__name__ == "ResultScreen" and app.focused.id == "next"
    asyncio.run(drive())


def test_an_error_line_goes_as_soon_as_the_input_is_fixed(in_tmp):
    async def drive():
        app = WizardApp()
        async with app.run_test(size=SIZE) as pilot:
            await type_into(pilot, "vram", "lots")
            await pilot.press("ctrl+n")
            assert "must be a positive number" in error_line(app)
            await focus(pilot, "vram")
            await pilot.press("backspace")
            assert "lot: must be a positive number" in error_line(app)   # still wrong: the error follows
            await type_into(pilot, "vram", "13")
            await pilot.pause()
            assert error_line(app) == "" and type(app.screen).__name__ == "HardwareScreen"
    asyncio.run(drive())


def test_replacing_files_and_leaving_without_saving_are_asked_first(in_tmp, finished):
    choices, plan = finished

    async def drive():
        app = WizardApp(Session(choices, plan=plan, plan_choices=choices))
        async with app.run_test(size=SIZE) as pilot:
            app.goto(4)
            await pilot.pause()
            assert app.focused.id == "profile-out"
            await pilot.press("ctrl+n")                        # Finish without saving: asked
            await wait_for(pilot, lambda: asking(app))
            assert "without saving" in plain(app.screen.query_one("#question"))
            await pilot.press("escape")                        # stay
            await pilot.pause()
            assert type(app.screen).__name__ == "SaveScreen"
            plan_out = app.screen.query_one("#plan-out").value
            (in_tmp / plan_out).write_text("mine\n")
            await focus(pilot, "save")
            await pilot.press("enter")                         # the plan file exists: asked
            await wait_for(pilot, lambda: asking(app))
            assert plan_out in plain(app.screen.query_one("#question"))
            app.screen.query_one("#no").press()
            await pilot.pause()
            assert (in_tmp / plan_out).read_text() == "mine\n" and not app.session.saved
            await focus(pilot, "save")
            # Enter is ignored while a button still shows its last press (`-active`, 0.2 s): wait it out
            await wait_for(pilot, lambda: not app.screen.query_one("#save").has_class("-active"))
            await pilot.press("enter")
            # the question, then the save, land a few frames later on a busy machine
            await wait_for(pilot, lambda: asking(app) and app.focused.id == "yes")
            await pilot.press("enter")                         # Replace (focused first)
            await wait_for(pilot, lambda: bool(app.session.saved))
            assert len(app.session.saved) == 3 and (in_tmp / plan_out).read_text() != "mine\n"
            await pilot.press("ctrl+n")                        # saved: Finish leaves at once
            await pilot.pause()
            assert app.return_code == 0
    asyncio.run(drive())
