"""Estimated inputs (strata_plan/planner/estimated.py): which inputs of a prediction are estimates, which one binds it,
the same plan at a typical alternative; what-if lists them first."""
from __future__ import annotations

import json

import pytest

from strata_plan.planner.capacity import Budget
from strata_plan.planner.cost import CostModel
from strata_plan.planner.estimated import at_alternative, binding_estimate, estimated_inputs, estimated_table
from strata_plan.planner.placement import Placement
from strata_plan.planner.testing import tiny_problem


@pytest.fixture(scope="module")
def pro():
    return tiny_problem(profile="rtx-pro-6000")


def test_estimated_inputs_name_the_profile_estimates(pro):
    est = {e.name: e for e in estimated_inputs(pro)}
    assert est["NVMe random reads"].link == "nvme" and "2.6" in est["NVMe random reads"].value
    assert est["pinned H2D"].link == "pcie"
    assert "calibration layer_overhead_us" in est and "prefill expansion rate" in est
    h200 = {e.name for e in estimated_inputs(tiny_problem(profile="h200"))}
    assert "NVMe random reads" not in h200 and "pinned H2D" not in h200          # measured there


def test_alternative_predicts_the_same_plan_with_a_gen4_drive(pro):
    L, E = pro.curves.n_layers, pro.curves.n_experts
    p = pro.replace(budget=Budget(pro.budget.vram, pro.budget.ram, 10**13, 0))
    place = Placement((0,) * L, (0,) * L, (0,) * L, (True,) * len(p.dense_units), 0)     # everything on NVMe
    pred = CostModel(p).predict(place)
    assert pred.decode_binding == "nvme" and binding_estimate(p, "nvme").name == "NVMe random reads"
    alt, what = at_alternative(p, place, "nvme")
    assert "7 GB/s" in what and 2.0 < alt.decode_tok_s / pred.decode_tok_s < 7.0 / 2.6 + 1e-9
    assert at_alternative(p, place, "hbm") is None


def test_table_lists_binding_estimates_first(pro):
    L, E = pro.curves.n_layers, pro.curves.n_experts
    place = Placement((0,) * L, (0,) * L, (0,) * L, (True,) * len(pro.dense_units), 0)
    pred = CostModel(pro).predict(place)
    rows = estimated_table(pro, pred)
    assert rows[0]["link"] == pred.decode_binding and rows[0]["binds"]
    assert all(not r["binds"] for r in rows if r["link"] not in (pred.decode_binding, pred.prefill_binding))


def test_what_if_lists_estimated_inputs_first(tmp_path, capsys):
    from strata_plan.cli import main
    out = tmp_path / "plan.yaml"
    assert main(["plan", "--profile", "rtx-pro-6000", "--model", "qwen3-30b-a3b", "--trials", "3",
                 "--prior", "olmoe-like", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    assert main(["what-if", str(out), "--trials", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data)[0] == "estimated_inputs" and data["estimated_inputs"][0]["binds"]
    assert main(["what-if", str(out), "--trials", "2"]) == 0
    text = " ".join(capsys.readouterr().out.split())        # titles wrap between words at 80 columns
    assert text.index("estimates, not measurements") < text.index("what would help most")
