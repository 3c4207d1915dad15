"""The wizard's choices as `make_plan` arguments and as `strata-plan plan` flags (they must agree), its
input parsing, the cheap import of the package, and help without a terminal."""
from __future__ import annotations

import subprocess
import sys

import pytest

from strata_plan.cli import build_parser
from strata_plan.errors import UserError
from strata_plan.tui.state import Choices, Session, parse_gb, parse_int


@pytest.mark.parametrize("choices", [
    Choices(),
    Choices(profile="host.yaml", gpu_preset="rtx-5090", vram_gb=12.5, ram_gb=0.1 + 0.2, nvme_gb=500, model="m.json",
            stats="trace.npz", context=4096, chunk=1024, trials=7, objective="mix", seed=3),
    Choices(prior="olmoe-like", objective="prefill", vram_gb=1 / 3),
])
def test_printed_flags_parse_back_to_the_same_call(choices):
    args = build_parser().parse_args(choices.plan_argv("out.yaml"))
    call = choices.plan_call()
    assert args.out == "out.yaml"
    for key in ("profile", "model", "stats", "prior", "gpu_preset", "context", "chunk", "trials", "objective",
                "vram_gb", "ram_gb", "nvme_gb", "seed"):
        assert getattr(args, key) == call[key], key
    assert (args.mix_weight if args.mix_weight is not None else 0.5) == call["mix_weight"]


def test_the_profile_argument_can_point_at_the_saved_file():
    argv = Choices(profile="/tmp/private/measured.yaml").plan_argv("p.yaml", profile="mine.yaml")
    assert argv[argv.index("--profile") + 1] == "mine.yaml"


def test_choices_refuse_statistics_and_a_prior_together():
    with pytest.raises(ValueError):
        Choices(stats="s.yaml", prior="uniform")


def test_input_fields():
    assert parse_gb("  ", "VRAM budget") is None and parse_gb("24.5", "VRAM budget") == 24.5
    for bad in ("0", "-3", "many", "nan"):
        with pytest.raises(UserError, match="VRAM budget"):
            parse_gb(bad, "VRAM budget")
    assert parse_gb("1e9", "VRAM budget") == 1e9    # a number: the Hardware step holds it to the profile's figure
    assert parse_int("", "trials", 200) == 200 and parse_int("0", "seed", 0, lo=0) == 0
    with pytest.raises(UserError, match="at least 1"):
        parse_int("0", "trials", 200)


def test_a_measured_profile_lives_in_a_private_folder_until_cleanup(tmp_path):
    import dataclasses

    from strata_plan.profiler.run import ProfileRun
    from strata_plan.profiles.schema import load_profile
    s = Session()
    run = ProfileRun(dataclasses.replace(load_profile("rtx-4090"), name="box"), {}, (), 1.0, True)
    path = s.keep_measured(run)
    assert load_profile(path).name == "box" and s.measured_path == path
    s.cleanup()
    assert not __import__("os").path.exists(path)


def test_importing_the_package_does_not_import_textual():
    code = "import sys, strata_plan.tui, strata_plan.cli; assert 'textual' not in sys.modules, 'textual imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_a_terminal_strata_plan_prints_help(cli):
    r = cli()
    assert r.returncode == 0 and "usage: strata-plan" in r.stdout and "export" in r.stdout
