"""The pieces of benchmarks/bench_trained.py that decide what is compared: the budgets' byte arithmetic (a
plan made under them puts the seed's proportions where they say), the whole-layer offload map a transformers
user gets, and that accelerate's offload computes what the resident model computes. The whole benchmark
runs on the CPU with `python benchmarks/bench_trained.py --smoke` (about 1.5 minutes, not part of CI)."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"
TRACE = ROOT / "tests" / "data" / "fixture-moe.trace.npz"

from trained import hf  # noqa: E402
from trained.budgets import SEED_RAM_SHARE, VRAM_SHARE, achieved, budgets  # noqa: E402


def test_expert_tiers_place_whole_layers_by_share():
    assert set(hf.expert_tiers(9, VRAM_SHARE, None).values()) == {"cpu"}           # one layer is 11% > 8%
    seed = hf.expert_tiers(9, VRAM_SHARE, SEED_RAM_SHARE)
    assert [seed[i] for i in range(9)] == ["cpu"] * 3 + ["disk"] * 6                 # 33% / 67%
    big = hf.expert_tiers(50, VRAM_SHARE, SEED_RAM_SHARE)
    assert sum(v == "gpu" for v in big.values()) == 4 and sum(v == "cpu" for v in big.values()) == 12


def test_first_divergence():
    assert hf.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert hf.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert hf.first_divergence([1, 2], [1, 2, 3]) == 2


@pytest.mark.parametrize("name", ["ramrich", "seed"])
def test_a_plan_under_the_budget_holds_its_shares(name, tmp_path):
    pytest.importorskip("optuna")
    from strata_plan.cli import main
    from strata_plan.core.plan import load_plan
    b = budgets(str(FIXTURE), str(TRACE), "h200", 256, 32)[name]
    assert b.expert_vram_share == pytest.approx(VRAM_SHARE, abs=1e-6)
    out = tmp_path / "plan.yaml"
    assert main(["plan", "--model", str(FIXTURE), "--stats", str(TRACE), "--profile", "h200", "--context", "256",
                 "--chunk", "32", "--trials", "8", *b.flags(), "--out", str(out), "--json"]) == 0
    plan = load_plan(out)
    got = achieved(plan)
    mem = plan.memory
    # every routed byte is placed once, at the formats the budget counted
    assert mem.vram["static_experts"] + mem.ram["ram_experts"] + mem.nvme["nvme_experts"] == b.routed
    assert mem.vram_total <= b.vram and mem.ram_total <= b.ram and mem.nvme_total <= b.nvme
    assert got["vram_experts_share"] <= VRAM_SHARE + 1e-9
    if name == "ramrich":
        assert got["nvme_share"] == 0.0
    else:
        assert got["ram_share"] <= SEED_RAM_SHARE + 1e-9 and got["nvme_share"] >= 1 - VRAM_SHARE - SEED_RAM_SHARE


def test_the_plans_can_take_the_guesses_at_the_router(tmp_path):
    """`--lookahead-point attention`: the budget's plan is searched with the NVMe guesses taken at each layer's
    router and records it (the engine rows follow the plan)."""
    pytest.importorskip("optuna")
    import types
    from bench_trained import Run, plan_budget
    from strata_plan.core.plan import load_plan
    a = types.SimpleNamespace(work=str(tmp_path), out_dir=str(tmp_path / "out"), profile="h200", context=256,
                              chunk=32, trials=8, lookahead_point="attention")
    run = Run(a)
    path = plan_budget(run, a, "seed", FIXTURE, TRACE)
    assert load_plan(path).staging.point == "attention" and run.metrics["seed.plan.lookahead_point"] == "attention"
    assert "--lookahead-point attention --out" in run.extra["commands"][-1]


@pytest.fixture
def one_torch_thread():
    """A tiny model on a busy 2-core runner: a second torch thread only spins."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_accelerate_offload_computes_what_the_resident_model_computes(tmp_path, one_torch_thread):
    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    tiers = hf.expert_tiers(5, VRAM_SHARE, SEED_RAM_SHARE)
    assert set(tiers.values()) == {"cpu", "disk"}
    offloaded = hf.load(FIXTURE, torch.float32, "cpu", tiers, tmp_path)
    assert len(list(tmp_path.iterdir())) > 0                 # the disk share went to the offload folder
    resident = hf.load(FIXTURE, torch.float32, "cpu")
    prompt = [0, 5, 17, 99, 3, 250, 1024, 7]
    a, b = hf.greedy(offloaded, prompt, 6, timed_from=2), hf.greedy(resident, prompt, 6)
    assert a.tokens == b.tokens and len(a.step_s) == 4


def nvme_plan(tmp_path, depth: int, **args):
    """The fixture packed in bf16, its plan with an NVMe tier at lookahead `depth` (saved), and the bench's arguments
    for a CPU run: (packed folder, plan path, plan, args)."""
    import sys
    import types
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_engine_run import FIXTURE, bf16_plan
    from strata_plan.cli import main as cli
    from strata_plan.core.plan import save_plan
    packed = tmp_path / "packed"
    assert cli(["pack", str(FIXTURE), "--out", str(packed), "--format", "bf16", "--json"]) == 0
    path = tmp_path / "plan.yaml"
    plan = bf16_plan(4, 10, 0, depth, chunk=1)
    save_plan(plan, path)
    a = types.SimpleNamespace(**{"tokens": 4, "warmup": 2, "device": "cpu", "sample": "1.0,0.95", "seed": 0,
                                 "work": str(tmp_path), "out_dir": str(tmp_path / "out"), **args})
    return packed, path, plan, a


def test_measure_one_reports_the_stager_beside_the_cost_model(tmp_path, one_torch_thread):
    """A trained-model row of a plan with an NVMe tier (the device loop's stager): every figure the bench writes is
    there, labelled measured or predicted (the fixture model on the CPU), and the row is predicted again on the
    routing of its own text."""
    import dataclasses
    packed, path, plan, a = nvme_plan(tmp_path, 1)
    from test_engine_run import FIXTURE, PROMPT
    from bench_trained import Run, measure_one, run_routing_stage, stager_stage
    from trained.predict import Predictor
    run = Run(a)
    out = measure_one(run, a, "seed.plan", packed, plan, "plan", Predictor(path), PROMPT)
    for key in ("stage_wait_ms_per_token_measured", "nvme_wait_ms_per_token_predicted", "staging_hit_rate_measured",
                "nvme_read_gb_per_token_predicted", "page_cache_after", "host_ms_per_token_measured"):
        assert key in out and f"seed.plan.{key}" in run.metrics
    assert out["nvme_gb_per_token_measured"] > 0
    assert out["stager_queue_ms_rank0_measured"] >= 0 and "stager_queue_ms_measured" in out
    stager_stage(run, {"seed": path})          # the stager's host measured by the row, the row predicted again
    m = run.metrics
    assert m["seed.stager_wake_us_measured"] > 0 and m["seed.stager_read_us_measured"] >= 0
    assert m["seed.stager_publish_us_measured"] >= 0          # the rows timed their reads' landing
    assert m["seed.plan.decode_tok_s_predicted_stager_measured"] > 0
    assert m["seed.plan.measured_over_predicted_stager_measured"] == pytest.approx(
        m["seed.plan.decode_tok_s_measured"] / m["seed.plan.decode_tok_s_predicted_stager_measured"])
    run_routing_stage(run, a, FIXTURE)         # the row predicted again on its own text's routing
    from strata_plan.core.routing import load_trace
    trace = load_trace(tmp_path / "run-routing" / "seed.plan.npz")
    ctx = run.extra["runs"]["seed.plan"]["context"]
    assert trace.n_tokens == len(ctx["fed"]) and trace.depth == 4
    for suffix in ("run_routing", "run_routing_stager_measured"):
        assert m[f"seed.plan.measured_over_predicted_{suffix}"] == pytest.approx(
            m["seed.plan.decode_tok_s_measured"] / m[f"seed.plan.decode_tok_s_predicted_{suffix}"])
    # no cache slots: the VRAM hits are the plan's static experts on the row's own text, which the engine counted
    # (its routing equals the float32 reference's here), not on the held-out text's statistics
    own = m["seed.plan.vram_hit_rate_predicted_run_routing"]
    assert own == pytest.approx(m["seed.plan.resident_hit_rate_measured"])
    assert own != pytest.approx(m["seed.plan.vram_hit_rate_predicted"])
    # a later row (the depth sweep's): both stages again predict it alone, with the figures measured first
    first = dict(m)
    measure_one(run, a, "seed.depth2", packed, dataclasses.replace(plan, prefetch_depth=2), "plan", Predictor(path),
                PROMPT)
    stager_stage(run, {"seed": path})
    run_routing_stage(run, a, FIXTURE)
    assert m["seed.depth2.decode_tok_s_predicted_stager_measured"] > 0
    assert m["seed.depth2.vram_hit_rate_predicted_run_routing"] == pytest.approx(
        m["seed.depth2.resident_hit_rate_measured"])
    assert {k: m[k] for k in first} == first


def test_the_depth_sweep_predicts_the_depth_it_runs(tmp_path):
    """Predictor.for_plan predicts the placement the engine ran (the depth sweep runs the plan at other depths)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_engine_run import bf16_plan
    from strata_plan.core.plan import save_plan
    from _plans import forced_depth
    from trained.predict import Predictor
    plan = bf16_plan(4, 10, 2, 0, chunk=1)
    save_plan(plan, tmp_path / "plan.yaml")
    p = Predictor(tmp_path / "plan.yaml")
    at0, at2 = p.for_plan(plan)["decode_tok_s"], p.for_plan(forced_depth(plan, 2))["decode_tok_s"]
    assert at0 > 0 and at2 > 0 and at0 != at2


def test_the_lookahead_margin_interleaves_its_runs(tmp_path, one_torch_thread):
    """`--lookahead-repeats`: an NVMe plan without lookahead runs forced at `--lookahead-depth` against on-demand,
    the two interleaved ABBA, and the measured ratio is the medians' (the fixture model on the CPU)."""
    import numpy as np
    packed, path, plan, a = nvme_plan(tmp_path, 0, tokens=3, warmup=1, lookahead_repeats=2, lookahead_depth=2)
    from test_engine_run import PROMPT
    from bench_trained import Run, lookahead_margin
    from trained.predict import Predictor
    run = Run(a)
    lookahead_margin(run, a, "seed", packed, plan, Predictor(path), PROMPT)
    m, runs = run.metrics, run.extra["runs"]
    assert list(runs) == ["seed.lookahead_r0", "seed.on-demand_r0", "seed.on-demand_r1", "seed.lookahead_r1"]
    assert m["seed.lookahead_depth"] == 2 and m["seed.lookahead_forced"] is True
    assert all(runs[k]["mode"] == "plan" for k in ("seed.lookahead_r0", "seed.lookahead_r1"))
    assert m["seed.lookahead_r0.lookahead_d2.precision_measured"] >= 0      # the forced depth ran
    tok = m["seed.lookahead_runs_measured"]
    assert tok["lookahead"] == [m[f"seed.lookahead_r{k}.decode_tok_s_measured"] for k in (0, 1)]
    assert m["seed.lookahead_over_ondemand_measured"] == pytest.approx(
        float(np.median(tok["lookahead"])) / float(np.median(tok["on-demand"])))
    assert m["seed.lookahead_over_ondemand_predicted"] == pytest.approx(
        m["seed.lookahead_r0.decode_tok_s_predicted"] / m["seed.on-demand_r0.decode_tok_s_predicted"])


def test_the_lookahead_point_ab_adds_the_router_row_interleaved(tmp_path, one_torch_thread):
    """`--lookahead-point-ab`: the same lookahead with its guesses taken at each layer's router runs beside the two,
    ABC then CBA; its ratios are the medians', beside the cost model's for that point (labelled: the layer's end's
    precision)."""
    import numpy as np
    packed, path, plan, a = nvme_plan(tmp_path, 1, tokens=3, warmup=1, lookahead_repeats=2, lookahead_depth=1,
                                      lookahead_point_ab=True)
    from test_engine_run import PROMPT
    from bench_trained import Run, lookahead_margin
    from trained.predict import Predictor
    run = Run(a)
    lookahead_margin(run, a, "seed", packed, plan, Predictor(path), PROMPT)
    m, runs = run.metrics, run.extra["runs"]
    assert list(runs) == ["seed.lookahead_r0", "seed.on-demand_r0", "seed.lookahead_router_r0",
                          "seed.lookahead_router_r1", "seed.on-demand_r1", "seed.lookahead_r1"]
    tok = m["seed.lookahead_runs_measured"]
    assert m["seed.lookahead_router_over_lookahead_measured"] == pytest.approx(
        float(np.median(tok["lookahead_router"])) / float(np.median(tok["lookahead"])))
    assert m["seed.lookahead_router_over_lookahead_predicted"] == pytest.approx(
        m["seed.lookahead_router_r0.decode_tok_s_predicted"] / m["seed.lookahead_r0.decode_tok_s_predicted"])
    assert "seed.lookahead_router_r0.prediction_note" in m and "seed.lookahead_r0.prediction_note" not in m
    assert "seed.lookahead_router_r0" not in run.executed and "seed.lookahead_r0" in run.executed   # not re-predicted
    assert [runs[f"seed.{r}_r0"]["lookahead_point"] for r in ("lookahead", "lookahead_router")] == ["output",
                                                                                                   "attention"]
