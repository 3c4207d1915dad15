"""A two-GPU plan through the command line: `plan` over both GPUs of a shipped two-GPU profile (and per-GPU
budgets), `export` to llama.cpp with --tensor-split and -ot to CUDA0/CUDA1, `what-if` with VRAM on each GPU,
and the wizard's summaries of a two-GPU machine and plan."""
from __future__ import annotations

import json
import re

import pytest

from strata_plan.cli import main
from strata_plan.core.plan import load_plan


@pytest.fixture(scope="module")
def two_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("two") / "plan.yaml"
    assert main(["plan", "--profile", "rtx-4090-x2", "--model", "kimi-k3.1-pro", "--moe-layers", "3", "--trials", "6",
                 "--vram-gb", "20,22", "--out", str(out), "--json"]) == 0
    return out


def test_plan_over_two_gpus(two_plan, capsys):
    plan = load_plan(two_plan)
    assert [g.vram_budget_bytes for g in plan.gpus] == [20 * 10**9, 22 * 10**9]
    assert plan.memory.budgets.vram_bytes == 42 * 10**9
    for g in plan.gpus:
        assert sum(g.vram.values()) <= g.vram_budget_bytes


def test_export_splits_layers_over_cuda0_and_cuda1(two_plan, capsys):
    assert main(["export", "--format", "llama.cpp", str(two_plan), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    plan = load_plan(two_plan)
    split = data["tensor_split"]
    assert split == [g.end_layer - g.first_layer for g in plan.gpus] and sum(split) == 4
    cmd = " ".join(data["command"])
    assert f"--tensor-split {split[0]},{split[1]}" in cmd
    named = []
    for regex, buffer in (a.split("=") for a in data["override_args"][1::2]):
        layers = [int(x) for x in re.search(r"\(([\d|]+)\)", regex).group(1).split("|")]
        named += layers
        for layer in layers:
            if buffer.startswith("CUDA"):
                g = int(buffer[4:])
                assert plan.gpus[g].first_layer <= layer < plan.gpus[g].end_layer
    assert sorted(named) == [l.layer for l in plan.layers]          # every MoE layer exactly once


def test_what_if_adds_vram_on_each_gpu(two_plan, capsys):
    assert main(["what-if", str(two_plan), "--trials", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    labels = [c["label"] for c in data["changes"]]
    assert "+16 GB VRAM on each GPU" in labels
    base = data["base"]["score"]
    assert all(c["score"] >= base * (1 - 1e-9) for c in data["changes"])     # warm-started: never worse


def test_wizard_summaries_of_two_gpus(two_plan):
    from strata_plan.profiles.schema import load_profile
    from strata_plan.tui.describe import plan_rows, profile_rows
    rows = dict(profile_rows(load_profile("rtx-4090-x2")))
    assert rows["GPU"].startswith("2x NVIDIA GeForce RTX 4090") and "no peer-to-peer" in rows["GPU links"]
    assert "GPU 1: layers" in dict(plan_rows(load_plan(two_plan)))["GPUs"]
    assert "GPU links" not in dict(profile_rows(load_profile("rtx-4090")))
