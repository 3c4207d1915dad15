"""benchmarks/_plans.py: the hand-tiered plans the benchmarks run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _plans import own_vram_budget, tiers_by_hand  # noqa: E402

from strata_plan.cli import main  # noqa: E402
from strata_plan.core.plan import load_plan, save_plan  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "fixture-moe"


def test_a_hand_tiered_plans_export_keeps_to_the_vram_it_places(tmp_path, capsys):
    """A third of each layer's experts in VRAM: with the machine's budget the export put every layer's experts on
    the GPU (more VRAM than the plan uses); with the plan's own footprint as its budget, two thirds of the layers'
    expert tensors stay on the CPU (llama.cpp places whole layers; no layer is free to take)."""
    plan = load_plan(FIXTURE / "plan-rtx-4090.yaml")
    hand = tiers_by_hand(plan, 1 / 3, 0)
    got = {}
    for name, p in (("machine", hand), ("own", own_vram_budget(hand, plan.sources.profile.name))):
        path = tmp_path / f"{name}.yaml"
        save_plan(p, path)
        assert main(["export", str(path), "--format", "llama.cpp", "--json"]) == 0
        got[name] = json.loads(capsys.readouterr().out)["cpu_layers"]
    L = len(plan.layers)
    assert got["machine"] == []
    assert L - round(L / 3) <= len(got["own"]) < L
