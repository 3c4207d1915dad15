"""Implausible input gets one line, exit code 2, before any work (issue 44), each held by a test: budgets the
profile's machine cannot have (what-if still explores them), a prompt longer than the model's positions, messages
that name the real cause (a context too long for any VRAM, a two-GPU budget, 1e308, calibrate with a profile
without a GPU) and a device this build of torch lacks. In-process (`strata_plan.cli.main`) on the committed
fixture, CPU only; the work each command would start is replaced by a failure, so a refusal after it shows."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from strata_plan.cli import main

DATA = Path(__file__).parent / "data"
FIXTURE = str(DATA / "fixture-moe")
FIXTURE_PLAN = str(DATA / "fixture-moe" / "plan-rtx-4090.yaml")


def one_line_error(capsys, code: int, *words: str, absent: tuple[str, ...] = ()) -> str:
    """The command returned 2 and printed one line naming `words` (and none of `absent`), no traceback."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("strata-plan: error:") and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    for w in absent:
        assert w not in err, (w, err)
    return err


@pytest.fixture
def no_work(monkeypatch):
    """The search, the engine's loading and the calibration fail the test: refusals come before them."""
    def forbidden(*a, **k):
        raise AssertionError("the work started before the input was refused")
    import strata_plan.engine.engine as engine
    import strata_plan.engine.eval as eval_
    import strata_plan.planner.calibrate as calibrate
    import strata_plan.planner.make as make
    monkeypatch.setattr(make, "search_ladder", forbidden)
    monkeypatch.setattr(engine, "host_units", forbidden)             # Engine.open's first work, after the device
    monkeypatch.setattr(engine.ExpertStore, "open", forbidden)
    monkeypatch.setattr(eval_, "evaluate", forbidden)
    monkeypatch.setattr(calibrate, "read_runs", forbidden)


def plan_argv(tmp_path, *extra: str, profile: str = "rtx-4090", model: str = FIXTURE) -> list[str]:
    return ["plan", "--profile", profile, "--model", model, "--trials", "2", "--out", str(tmp_path / "p.yaml"), *extra]


# ---- budgets the machine cannot have -----------------------------------------------------------------------
@pytest.mark.parametrize("extra,words", [
    (["--vram-gb", "1000"], ["--vram-gb: 1000", "exceeds the 24 GB of VRAM of profile rtx-4090", "24 or less"]),
    (["--ram-gb", "500"], ["--ram-gb: 500", "exceeds the 128 GB of RAM of profile rtx-4090"]),
    (["--nvme-gb", "5000"], ["--nvme-gb: 5000", "exceeds the 2000 GB of NVMe of profile rtx-4090"]),
    (["--vram-gb", "1e308"], ["--vram-gb: 1e+308", "exceeds the 24 GB of VRAM"]),       # not "not a positive number"
])
def test_plan_refuses_budgets_above_the_profiles_hardware(tmp_path, capsys, no_work, extra, words):
    one_line_error(capsys, main(plan_argv(tmp_path, *extra)), *words, absent=("positive",))
    assert not (tmp_path / "p.yaml").exists()


def test_two_gpus_each_budget_is_held_to_its_gpu(tmp_path, capsys, no_work):
    one_line_error(capsys, main(plan_argv(tmp_path, "--vram-gb", "20,30", profile="rtx-4090-x2")),
                   "--vram-gb: GPU 1: 30", "exceeds the 24 GB of VRAM on GPU 1 of profile rtx-4090-x2")


def test_budgets_up_to_the_hardware_are_taken_and_the_wizard_refuses_the_same(tmp_path):
    from strata_plan.errors import UserError
    from strata_plan.planner.capacity import Budget
    from strata_plan.profiles.schema import load_profile
    prof = load_profile("rtx-4090")
    b = Budget.from_profile(prof, 24.0, 128.0, 2000.0)                    # the whole machine: fine
    assert (b.vram, b.ram, b.nvme) == (24 * 10**9, 128 * 10**9, 2000 * 10**9)
    with pytest.raises(UserError, match="exceeds the 24 GB of VRAM"):     # what the wizard's Hardware step calls
        Budget.from_profile(prof, 24.5, None, None, gpus=1)
    from strata_plan.tui.state import parse_gb
    assert parse_gb("1e308", "VRAM budget") == 1e308                      # then refused as above, not "not positive"


def test_what_if_still_explores_hardware_the_machine_does_not_have():
    from strata_plan.planner.make import make_plan, problem_for_plan
    from strata_plan.planner.whatif import Change, what_if
    plan = make_plan("rtx-4090", FIXTURE, trials=2)                       # the whole 24 GB card
    problem = problem_for_plan(plan, "plan")
    res = what_if(plan, problem, trials=2, changes=(Change("+16 GB VRAM", vram_gb=16),), factors=(1.0, 3.0))
    assert [p.vram_gb for p in res.sweep] == [24.0, 72.0] and all(p.fits for p in res.sweep)
    assert res.changes[0].decode_tok_s > 0


# ---- a prompt longer than the model's positions -------------------------------------------------------------
@pytest.mark.parametrize("prompt,max_tokens,words", [
    ("hello world " * 1400, "2", ["--prompt:", "exceed the context of 1024 tokens", "max_position_embeddings",
                                  "the plan's context is 8192", "at most 1023 tokens"]),
    ("hello", "100000", ["--max-tokens: 100000", "exceed the context of 1024 tokens", "max_position_embeddings"]),
], ids=["8401-token-prompt", "max-tokens-100000"])
def test_run_refuses_a_prompt_past_the_models_positions_before_opening_the_engine(capsys, no_work, prompt,
                                                                                   max_tokens, words):
    """The fixture's plan holds 8192 tokens of context, its model 1024 positions: the smaller is the limit.
    (The checkpoint folder has what the check reads: config.json and the tokenizer; the engine never opens.)"""
    one_line_error(capsys, main(["run", "--packed", FIXTURE, "--plan", FIXTURE_PLAN, "--prompt", prompt,
                                 "--max-tokens", max_tokens, "--device", "cpu"]), *words)


def test_the_limit_is_the_plans_context_when_that_is_smaller():
    from strata_plan.engine.generate import check_length
    from strata_plan.errors import UserError
    check_length(60, 5, 64, 1024)                                         # 60 + 5 - 1 = 64 positions: fits
    with pytest.raises(UserError, match=r"--max-tokens: 6: .*context of 64 tokens \(the plan's context; the model "
                                        r"has 1024 positions\).*--max-tokens 5 or fewer.*--context \(at most 1024\)"):
        check_length(60, 6, 64, 1024)


# ---- messages that name the real cause -----------------------------------------------------------------------
def test_a_context_no_vram_could_hold_names_the_context(tmp_path, capsys, no_work):
    err = one_line_error(capsys, main(plan_argv(tmp_path, "--context", "100000000")),
                         "--context: 100000000", "KV cache", "more than the 24 GB of VRAM of the GPU",
                         "lower --context to at most", absent=("--vram-gb", "raise"))
    most = int(re.search(r"at most (\d+) tokens", err)[1])
    one_line_error(capsys, main(plan_argv(tmp_path, "--context", str(most + 1))), "--context")
    capsys.readouterr()
    from strata_plan.planner.make import make_problem
    make_problem("rtx-4090", FIXTURE, context=most)                        # the figure it names passes the check


def test_a_two_gpu_budget_is_never_called_below_a_smaller_figure(tmp_path, capsys, no_work):
    """Each GPU's 1.010 GB holds its own working set (1.008 GB); the two together do not also hold the KV cache:
    the message compares the sum with the sum."""
    err = one_line_error(capsys, main(plan_argv(tmp_path, "--vram-gb", "1.01,1.01", profile="rtx-4090-x2")),
                         "--vram-gb", "over 2 GPUs", "KV cache")
    have, need = (float(x) for x in re.search(r"([\d.]+) GB over 2 GPUs: below the working set of ([\d.]+) GB", err).groups())
    assert have == 2.02 and have < need
    one_line_error(capsys, main(plan_argv(tmp_path, "--vram-gb", "1.005,1.005", profile="rtx-4090-x2")),
                   "--vram-gb: GPU 0: 1.00 GB: below the working set of a GPU, 1.01 GB")


def test_calibrate_with_a_profile_without_a_gpu_names_the_profile(tmp_path, capsys, no_work):
    import dataclasses
    from strata_plan.profiles.schema import load_profile, save_profile
    host = save_profile(dataclasses.replace(load_profile("rtx-4090"), name="host-test", gpus=()), tmp_path / "host.yaml")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"mode": "lru", "plan": {"path": FIXTURE_PLAN}}))
    one_line_error(capsys, main(["calibrate", str(bench), "--profile", str(host), "--out", str(tmp_path / "o.yaml")]),
                   "--profile: host-test", "has no GPU", "one with a GPU", absent=("NAME=PATH",))
    one_line_error(capsys, main(["calibrate", str(bench), "--profile", "h200", "--check", str(bench), "--check-profile",
                                 str(host), "--out", str(tmp_path / "o.yaml")]), "--check-profile: host-test", "no GPU")


# ---- a device this torch lacks -------------------------------------------------------------------------------
@pytest.fixture
def cpu_build(monkeypatch):
    """torch as a CPU build is (the CI's wheel), wherever the test runs."""
    import torch
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("command", [
    ["run", "--packed", FIXTURE, "--plan", FIXTURE_PLAN, "--prompt", "hi"],
    ["bench", "--packed", FIXTURE, "--plan", FIXTURE_PLAN],
    ["eval", "--packed", FIXTURE, "--reference", FIXTURE],
])
def test_a_cuda_device_on_a_cpu_build_of_torch_is_one_line(capsys, no_work, cpu_build, command):
    one_line_error(capsys, main([*command, "--device", "cuda"]), "--device: cuda", "CPU build", "--device cpu")


def test_other_devices_are_named(capsys, no_work, monkeypatch):
    import torch
    run = ["run", "--packed", FIXTURE, "--plan", FIXTURE_PLAN, "--prompt", "hi", "--device"]
    one_line_error(capsys, main([*run, "gpu"]), "--device: gpu", "not a device")
    one_line_error(capsys, main([*run, "mps"]), "--device: mps", "cuda or cpu")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    one_line_error(capsys, main([*run, "cuda:3"]), "--device: cuda:3", "1 CUDA GPU(s)", "cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    one_line_error(capsys, main([*run, "cuda"]), "--device: cuda", "no CUDA GPU is visible")


def test_bench_sampling_out_of_range_is_one_line_before_the_benchmark(capsys, no_work):
    one_line_error(capsys, main(["bench", "--packed", FIXTURE, "--plan", FIXTURE_PLAN, "--device", "cpu",
                                 "--temperature", "0.7", "--top-p", "1.5"]), "--top-p", "outside (0, 1]")


def test_bench_results_at_a_file_is_refused_before_the_benchmark(tmp_path, capsys, no_work):
    existing = tmp_path / "bench.json"
    existing.write_text("keep me\n")
    one_line_error(capsys, main(["bench", "--packed", FIXTURE, "--plan", FIXTURE_PLAN, "--device", "cpu",
                                 "--results", str(existing)]), "--results", "is a file, not a folder")
    assert existing.read_text() == "keep me\n"
