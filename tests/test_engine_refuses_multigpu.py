"""The engine runs one GPU: a plan over several GPUs is refused at open with one line (and exit code 2 from
`strata-plan run`), before any file of the packed model is read."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from strata_plan.errors import UserError
from strata_plan.core.plan import GpuPlan, load_plan, save_plan

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "fixture-moe"


def two_gpu_plan(used: int = 2):
    plan = load_plan(FIXTURE / "plan-rtx-4090.yaml")
    n = len(plan.dense.resident_layers) + len(plan.dense.streamed_layers)
    cut = n // 2 if used == 2 else n
    gpus = (GpuPlan(0, "GPU 0", 0, cut, used == 1, 24 * 10**9), GpuPlan(1, "GPU 1", cut, n, used == 2, 24 * 10**9))
    return dataclasses.replace(plan, gpus=gpus)


def test_engine_refuses_a_two_gpu_plan(tmp_path):
    from strata_plan.engine.engine import Engine
    path = save_plan(two_gpu_plan(), tmp_path / "two.yaml")
    with pytest.raises(UserError) as e:
        Engine.open(tmp_path / "no-such-packed-model", path)
    assert e.value.where == str(path) and e.value.field == "gpus" and "--gpus 1" in e.value.fix


def test_run_exits_2_with_one_line(tmp_path, capsys):
    from strata_plan.cli import main
    path = save_plan(two_gpu_plan(), tmp_path / "two.yaml")
    assert main(["run", "--packed", str(tmp_path), "--plan", str(path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "gpus" in err


def test_a_two_gpu_plan_that_uses_one_gpu_is_not_refused():
    assert two_gpu_plan(used=1).n_gpus_used == 1 and two_gpu_plan().n_gpus_used == 2
