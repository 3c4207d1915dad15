"""The host round trip per MoE layer in the cost model (by hand), `predict_plan` on executed plans (the
fixture's recorded prediction, the modes' order) and `strata-plan calibrate` (constants recovered from
synthetic bench files predicted with known constants; bad input in one line, exit code 2)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from strata_plan.cli import main
from strata_plan.planner.capacity import Budget
from strata_plan.planner.cost import RESOURCES, CostModel
from strata_plan.planner.placement import Placement
from strata_plan.core.plan import load_plan
from strata_plan.core.modes import MODES, baseline
from strata_plan.planner.repredict import plan_problem, predict_plan
from strata_plan.planner.testing import tiny_problem
from strata_plan.profiles.schema import Figure, load_profile
from strata_plan.schema import to_data

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_PLAN = ROOT / "tests" / "data" / "fixture-moe" / "plan-rtx-4090.yaml"
KIMI5_PLAN = ROOT / "tests" / "data" / "plan-kimi5-h200-ramrich.yaml"


def with_cal(profile, **values):
    figs = {k: Figure(v, "estimate", "test") for k, v in values.items()}
    return dataclasses.replace(profile, calibration=dataclasses.replace(profile.calibration, **figs))


# ---- the cost model's round trip ----------------------------------------------------------------------
@pytest.mark.parametrize("where", ["vram", "ram"])
def test_round_trip_adds_moe_layers_times_it_when_nothing_overlaps(where):
    """No lookahead: each MoE layer's round trip is serial with its demand fetches, so the token grows by
    exactly L_moe x rt, and a prefill chunk by the same."""
    # the host loop (round trips, copies): the device loop runs this placement without them
    p = tiny_problem(skews=(1.4, 0.5, 0.0)).replace(budget=Budget(10**13, 10**13, 10**13, 0), loop="host")
    E, L = p.curves.n_experts, p.curves.n_layers
    n = (E, 0) if where == "vram" else (0, E)
    place = Placement((n[0],) * L, (n[1],) * L, (0,) * L, (True,) * len(p.dense_units), 0)
    rt = 250.0
    zero = CostModel(p.replace(profile=with_cal(p.profile, moe_round_trip_us=0.0))).predict(place)
    some = CostModel(p.replace(profile=with_cal(p.profile, moe_round_trip_us=rt))).predict(place)
    assert zero.decode_seconds["token"] > zero.decode_seconds["pcie_link"]        # the walk, not a link, binds
    assert 1 / some.decode_tok_s - 1 / zero.decode_tok_s == pytest.approx(p.spec.n_moe_layers * rt * 1e-6, rel=1e-9)
    assert some.decode_seconds["round_trip"] == pytest.approx(p.spec.n_moe_layers * rt * 1e-6, rel=1e-12)
    C = p.prefill_chunk
    assert C / some.prefill_tok_s - C / zero.prefill_tok_s == pytest.approx(p.spec.n_moe_layers * rt * 1e-6, rel=1e-9)


def test_host_fetch_paces_a_layer_whose_copies_are_shorter():
    """Every routed expert fetched from RAM (nothing static, no cache, no lookahead): once issuing a fetch
    on the host takes longer than its copy, each MoE layer waits k x host_fetch (+ the last copy), so the
    token grows by exactly L_moe x k per extra microsecond; below that the links hide it."""
    # the host loop (round trips, copies): the device loop runs this placement without them
    p = tiny_problem(skews=(1.4, 0.5, 0.0)).replace(budget=Budget(10**13, 10**13, 10**13, 0), loop="host")
    E, L = p.curves.n_experts, p.curves.n_layers
    place = Placement((0,) * L, (E,) * L, (0,) * L, (True,) * len(p.dense_units), 0)

    def token(us):
        return 1 / CostModel(p.replace(profile=with_cal(p.profile, host_fetch_us=us))).predict(place).decode_tok_s
    k, n_moe = p.curves.top_k, p.spec.n_moe_layers
    assert token(0.0) == token(1e-3)                                      # hidden behind the copies
    assert token(20000.0) - token(10000.0) == pytest.approx(n_moe * k * 10000e-6, rel=1e-9)


def test_round_trip_also_delays_the_lookahead():
    """The host loop: with lookahead the demand part still pays every round trip, and a prefetch cannot land before
    its source layer's hints have made their round trip: the token grows by at least L_moe x rt."""
    p = tiny_problem(skews=(1.4, 0.5, 0.0), locality=0.4).replace(budget=Budget(10**13, 10**13, 10**13, 0), loop="host")
    E, L = p.curves.n_experts, p.curves.n_layers
    place = Placement((0,) * L, (E,) * L, (0,) * L, (True,) * len(p.dense_units), 1)
    rt = 400.0

    def walk(us):               # the walk's critical path: the sum of its per-resource seconds
        pred = CostModel(p.replace(profile=with_cal(p.profile, moe_round_trip_us=us))).predict(place)
        return sum(pred.decode_seconds[r] for r in RESOURCES), 1 / pred.decode_tok_s
    (w0, t0), (w1, t1) = walk(0.0), walk(rt)
    assert w1 - w0 >= p.spec.n_moe_layers * rt * 1e-6 * (1 - 1e-9)
    assert t1 >= t0 and t1 == pytest.approx(max(w1, t1), rel=1e-12)


def test_prefetch_overlap_charges_the_unhidden_share_of_the_prefetch():
    """`prefetch_overlap` < 1: the share of each layer's prefetch link time the engine does not hide is serial
    with the layer, so the walk grows as the overlap falls (by less than the prefetch time where the layer
    waited for its prefetch anyway); without lookahead it changes nothing; at the default (1) the prediction
    is as before (the host loop's constant)."""
    p = tiny_problem(skews=(1.4, 0.5, 0.0), locality=0.4).replace(budget=Budget(10**13, 10**13, 10**13, 0), loop="host")
    E, L = p.curves.n_experts, p.curves.n_layers
    ahead = Placement((0,) * L, (E,) * L, (0,) * L, (True,) * len(p.dense_units), 1)
    plain = Placement((0,) * L, (E,) * L, (0,) * L, (True,) * len(p.dense_units), 0)

    def walk(place, ov=None):
        prof = p.profile if ov is None else with_cal(p.profile, prefetch_overlap=ov)
        pred = CostModel(p.replace(profile=prof)).predict(place)
        return sum(pred.decode_seconds[r] for r in RESOURCES), pred
    assert walk(ahead)[1] == walk(ahead, 1.0)[1]
    assert walk(plain, 0.0)[1] == walk(plain, 1.0)[1]
    w1, pred1 = walk(ahead, 1.0)
    w0, pred0 = walk(ahead, 0.0)
    wh, _ = walk(ahead, 0.5)
    assert w0 > wh >= w1 and pred0.decode_tok_s < pred1.decode_tok_s
    assert w0 - w1 <= pred0.decode_seconds["pcie"] + pred0.decode_seconds["nvme"]


def test_default_round_trip_is_an_estimate_and_old_profiles_keep_their_hash():
    prof = load_profile("rtx-4090")
    assert prof.calibration.moe_round_trip_us is None                    # shipped profiles: not written
    assert prof.calibration.round_trip.value == 75.0 and prof.calibration.round_trip.provenance == "estimate"
    assert "moe_round_trip_us" not in to_data(prof)["calibration"]


# ---- predict_plan --------------------------------------------------------------------------------------
def test_predict_plan_reproduces_the_fixture_plans_prediction():
    plan = load_plan(FIXTURE_PLAN)
    rec = plan.predicted
    prof = load_profile("rtx-4090")
    zero = predict_plan(plan, with_cal(prof, moe_round_trip_us=0.0), where=str(FIXTURE_PLAN), loop="host")
    assert zero.decode_tok_s == pytest.approx(rec.decode_tok_s, rel=1e-12)
    assert zero.prefill_tok_s == pytest.approx(rec.prefill_tok_s, rel=1e-12)
    assert zero.decode_binding == rec.decode_binding and zero.prefill_binding == rec.prefill_binding
    for k, v in rec.bytes_per_token.items():
        assert zero.bytes_per_token[k] == pytest.approx(v, rel=1e-12, abs=1e-9)
    for k, v in rec.seconds_per_token.items():
        assert zero.decode_seconds[k] == pytest.approx(v, rel=1e-12, abs=1e-15)
    default = predict_plan(plan, "rtx-4090", where=str(FIXTURE_PLAN), loop="host")    # the new term at its default
    n_moe = len(plan.layers)
    assert 1 / default.decode_tok_s == pytest.approx(1 / rec.decode_tok_s + n_moe * 75e-6, rel=1e-12)


def test_modes_order_and_baselines():
    plan = load_plan(KIMI5_PLAN)
    prob = plan_problem(plan, "h200", str(KIMI5_PLAN))
    tok = {m: predict_plan(plan, None, m, problem=prob).decode_tok_s for m in MODES}
    assert tok["plan"] >= tok["lru"] >= tok["on-demand"] and tok["plan"] > tok["on-demand"]
    lru, od = baseline(plan, "lru"), baseline(plan, "on-demand")
    assert lru.prefetch_depth == 0 and lru.cache.total_slots == plan.cache.total_slots > 0
    assert od.prefetch_depth == 0 and od.cache.total_slots == 0 and all(l.cache_slots == 0 for l in od.layers)
    assert [l.vram for l in od.layers] == [l.vram for l in plan.layers]


# ---- calibrate -----------------------------------------------------------------------------------------
TRUE = {"layer_overhead_us": 42.0, "moe_round_trip_us": 180.0, "hbm_efficiency": 0.55, "host_fetch_us": 400.0,
        "prefetch_overlap": 0.45}


def _run(plan_path: Path, mode: str, profile, record: str) -> dict:
    """A host-loop bench run as strata_plan/engine/bench.py measure() returns it, its figures predicted with
    `profile` (the host loop: the one with round trips to fit)."""
    plan = load_plan(plan_path)
    pred = predict_plan(plan, profile, mode, where=str(plan_path), loop="host")
    n = len(plan.layers)
    host = TRUE["moe_round_trip_us"] * 1e-6 * n
    wait = 3e-3                                          # the store's waits: not host work
    rec = {"path": str(plan_path), "sha256": hashlib.sha256(plan_path.read_bytes()).hexdigest()}
    if record == "data":
        rec = {"path": "/elsewhere/plan.yaml", "sha256": "0" * 64, "data": to_data(plan)}
    tp = {"router_round_trip_s": 0.4 * host, "store_and_launch_host_s": 0.6 * host + wait, "store_wait_s": wait,
          "round_trips": n}
    extra = {}
    if record == "data":            # a graphed run: the compute stream's waits hold the round trips and the copies,
        copy, fetches, tokens = 5e-3, 20, 10     # or the host issuing the fetches where it is slower (here)
        issue = fetches * TRUE["host_fetch_us"] * 1e-6
        tp.update(router_round_trip_s=0.9 * host, store_and_launch_host_s=issue, store_wait_s=0.0,
                  device_wait_s=host + max(copy, issue))
        extra = {"links": {"copy_busy_s_per_token": copy}, "bytes_per_token": {"nvme": 0.0},
                 "counters": {"fetches_from": {"ram": fetches * tokens}, "uses": tokens * n * plan.top_k}}
    return {"mode": mode, "loop": "host", "measured": {"decode_tok_s": pred.decode_tok_s,
                                       "decode_s_per_token": {"median": 1 / pred.decode_tok_s}},
            "time_per_token": tp, **extra,
            "plan": {"n_moe_layers": n, "prefetch_depth": plan.prefetch_depth, **rec}}


@pytest.fixture(scope="module")
def bench_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    true = with_cal(load_profile("h200"), **TRUE)
    fixture = {m: _run(FIXTURE_PLAN, m, true, "path") for m in ("plan", "lru")}
    kimi = {m: _run(KIMI5_PLAN, m, true, "data") for m in ("plan", "lru", "on-demand")}
    bare = d / "bench-fixture.json"
    bare.write_text(json.dumps(fixture["plan"]))                                       # bench --json
    results = d / "bench-20261203T000000Z.json"
    results.write_text(json.dumps({"benchmark": "bench", "metrics": {}, "run": fixture["lru"]}))   # bench --results
    engine = d / "engine-20261203T000000Z.json"
    engine.write_text(json.dumps({"benchmark": "engine", "metrics": {}, "runs": {f"ramrich/{m}": r for m, r in kimi.items()}}))
    return d, [bare, results, engine]


def test_calibrate_recovers_the_constants(bench_files, capsys):
    d, files = bench_files
    out = d / "fitted.yaml"
    rc = main(["calibrate", *map(str, files), "--profile", "h200", "--out", str(out), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    cal = load_profile(str(out)).calibration
    for name, want in TRUE.items():
        fig = ({"moe_round_trip_us": cal.round_trip, "host_fetch_us": cal.host_fetch, "prefetch_overlap": cal.overlap}
               .get(name) or getattr(cal, name))
        assert fig.value == pytest.approx(want, rel=0.01), name
        assert fig.provenance == "measured" and "calibrate" in fig.source and files[0].name in fig.source
    assert cal.compute_efficiency.provenance == "estimate"                # left alone, and says so
    assert all(abs(r["residual"]) < 0.01 for r in res["runs"]) and len(res["runs"]) == 5


def test_calibrate_leaves_hbm_alone_when_runs_cannot_separate_it(bench_files, capsys):
    d, files = bench_files
    out = d / "fitted-fixture.yaml"
    assert main(["calibrate", str(files[0]), str(files[1]), "--profile", "h200", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "left alone" in text and "residual" in text
    cal = load_profile(str(out)).calibration
    assert cal.hbm_efficiency.provenance != "measured"
    assert cal.layer_overhead_us.provenance == "measured" and cal.round_trip.value == pytest.approx(180.0, rel=1e-9)
    # with hbm_efficiency at its 0.7 the overhead absorbs the HBM difference: the fit is still exact on these runs
    t = [1 / predict_plan(load_plan(FIXTURE_PLAN), load_profile(str(out)), m, loop="host").decode_tok_s for m in ("plan", "lru")]
    want = [json.loads(f.read_text()).get("run", json.loads(f.read_text())) for f in files[:2]]
    assert t == pytest.approx([w["measured"]["decode_s_per_token"]["median"] for w in want], rel=1e-3)


def _bad(tmp_path, capsys, data, *extra) -> str:
    f = tmp_path / "bad.json"
    f.write_text(data if isinstance(data, str) else json.dumps(data))
    rc = main(["calibrate", str(f), "--profile", "h200", "--out", str(tmp_path / "o.yaml"), *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o.yaml").exists()
    return err


def test_calibrate_bad_input(bench_files, tmp_path, capsys):
    _, files = bench_files
    good = json.loads(files[0].read_text())
    assert "not JSON" in _bad(tmp_path, capsys, "{nope")
    assert "holds no engine run" in _bad(tmp_path, capsys, {"benchmark": "kernels", "metrics": {}})
    r = json.loads(json.dumps(good))
    del r["time_per_token"]["store_wait_s"]
    assert "bad.json: time_per_token.store_wait_s: missing" in _bad(tmp_path, capsys, r)
    r = json.loads(json.dumps(good))
    r["plan"]["path"] = "/nowhere/plan.yaml"
    err = _bad(tmp_path, capsys, {"runs": {"a/plan": r}})
    assert "bad.json: a/plan.plan.path:" in err and "--plan NAME=PATH" in err
    r = json.loads(json.dumps(good))
    r["mode"] = "fast"
    assert "bad.json: mode:" in _bad(tmp_path, capsys, r)
    r = json.loads(json.dumps(good))
    r["plan"]["n_moe_layers"] = 7
    assert "plan.n_moe_layers" in _bad(tmp_path, capsys, r)
    r = json.loads(json.dumps(good))                     # a plan whose statistics are gone: cannot re-predict
    data = to_data(load_plan(FIXTURE_PLAN))
    data["sources"]["statistics"]["path"] = "/nowhere/trace.npz"
    r["plan"] = {"n_moe_layers": 5, "path": "", "sha256": "", "data": data}
    err = _bad(tmp_path, capsys, r)
    assert "bad.json: plan:" in err and "sources.statistics.path" in err
    f = tmp_path / "ok.json"
    f.write_text(json.dumps(good))
    assert main(["calibrate", str(f), "--profile", "no-such-profile", "--out", str(tmp_path / "o.yaml")]) == 2
    assert "no-such-profile" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "missing.json"), "--profile", "h200", "--out", str(tmp_path / "o.yaml")]) == 2
    assert "missing.json: file not found" in capsys.readouterr().err
    assert main(["calibrate", str(f), "--profile", "h200", "--out", str(tmp_path / "o.yaml"), "--modes", "on-demand"]) == 2
    assert "--modes: on-demand: no run of these modes" in capsys.readouterr().err


def test_bench_record_holds_what_calibrate_needs():
    """strata_plan/engine/bench.py's plan record: path and sha256 of a plan file, and the plan itself."""
    pytest.importorskip("torch")
    from strata_plan.engine.bench import _plan_record
    rec = _plan_record(str(FIXTURE_PLAN))
    assert rec["sha256"] == hashlib.sha256(FIXTURE_PLAN.read_bytes()).hexdigest() and Path(rec["path"]).is_absolute()
    assert rec["data"]["schema"] == "strata-plan/plan"
    assert np.isclose(rec["data"]["predicted"]["decode_tok_s"], load_plan(FIXTURE_PLAN).predicted.decode_tok_s)


def test_check_predicts_held_out_runs_with_the_fitted_constants(bench_files, capsys):
    """--check re-predicts runs it was not fitted on with the fitted constants and the check profile's measured
    figures: runs made with the true constants come out as measured."""
    d, files = bench_files
    rc = main(["calibrate", str(files[0]), str(files[2]), "--profile", "h200", "--out", str(d / "fit-some.yaml"),
               "--json", "--check", str(files[1]), "--check-profile", "h200"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in res["check"]] == ["lru"] and res["check"][0]["run"].startswith(files[1].name)
    fitted = {c["name"]: c["after"] for c in res["constants"]}
    assert fitted["moe_round_trip_us"] == pytest.approx(TRUE["moe_round_trip_us"], rel=0.01)
    assert abs(res["check"][0]["predicted_over_measured"]) < 0.02


def test_frozen_calibration_keeps_the_machine_and_takes_the_constants(tmp_path):
    """`with_calibration_of`: the measured figures of one profile, the calibration constants of another
    (the benches predict with a same-call profile and constants committed before the run)."""
    from strata_plan.planner.repredict import with_calibration_of
    from strata_plan.profiles.schema import save_profile
    frozen = with_cal(load_profile("h200"), layer_overhead_us=250.0, prefetch_overlap=0.3)
    path = save_profile(frozen, tmp_path / "frozen.yaml")
    got = with_calibration_of("a100-80g", str(path))
    assert got.gpu == load_profile("a100-80g").gpu
    assert got.calibration.layer_overhead_us.value == 250.0 and got.calibration.overlap.value == 0.3
    plan = load_plan(KIMI5_PLAN)
    assert predict_plan(plan, got, "plan", loop="host").decode_tok_s < predict_plan(plan, "a100-80g", "plan",
                                                                                    loop="host").decode_tok_s
    # the device loop (PCIe-bound on the A100) charges the layers' overhead on its critical path too
    dev = [predict_plan(plan, prof, "plan", loop="device").decode_seconds["overhead"] for prof in (got, "a100-80g")]
    assert dev[0] > dev[1]


def test_device_loop_runs_measure_the_layer_overhead_from_their_step_without_moe(tmp_path, capsys):
    """Device-loop runs that timed their step without the MoE calls give the per-layer overhead directly: (that
    time - the cost model's non-MoE seconds without it) / decoder layers. Runs made at a known overhead give it
    back; the round trip (no host-loop run) is left alone; these PCIe-bound runs do not move hbm_efficiency."""
    from strata_plan.planner.placement import placement_of
    true = with_cal(load_profile("h200"), layer_overhead_us=37.0)
    plan = load_plan(KIMI5_PLAN)
    prob = plan_problem(plan, true, str(KIMI5_PLAN))
    runs = {}
    for mode in ("lru", "on-demand", "plan"):
        pred = predict_plan(plan, true, mode, where=str(KIMI5_PLAN), loop="device")
        free = CostModel(prob.replace(loop="device")).non_moe_seconds(placement_of(baseline(plan, mode)))
        runs[f"ramrich/{mode}"] = {
            "mode": mode, "loop": "device",
            "measured": {"decode_tok_s": pred.decode_tok_s, "decode_s_per_token": {"median": 1 / pred.decode_tok_s}},
            "time_per_token": {"router_round_trip_s": 0.0, "store_and_launch_host_s": 0.0, "store_wait_s": 0.0,
                               "round_trips": 0},
            "device_step": {"without_moe_s": free + prob.spec.n_layers * 37e-6, "step_s": 1 / pred.decode_tok_s},
            "plan": {"n_moe_layers": len(plan.layers), "prefetch_depth": plan.prefetch_depth, "path": str(KIMI5_PLAN),
                     "sha256": hashlib.sha256(KIMI5_PLAN.read_bytes()).hexdigest()}}
    f = tmp_path / "engine-device.json"
    f.write_text(json.dumps({"benchmark": "engine", "metrics": {}, "runs": runs}))
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", str(f), "--profile", "h200", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    cal = load_profile(str(out)).calibration
    assert cal.layer_overhead_us.value == pytest.approx(37.0, rel=1e-6)
    assert "measured directly" in cal.layer_overhead_us.source and cal.layer_overhead_us.provenance == "measured"
    h200 = load_profile("h200").calibration
    assert cal.round_trip == h200.round_trip and cal.hbm_efficiency == h200.hbm_efficiency      # left alone
