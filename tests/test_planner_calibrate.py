"""The copy path's host round trip per MoE layer in the cost model (several GPUs, by hand), `predict_plan` on
executed plans (a plan's recorded prediction, the modes' order) and `strata-plan calibrate` (the per-layer
overhead measured from synthetic device-loop runs made with known constants, the other constants left alone,
host-loop runs skipped; bad input in one line, exit code 2)."""
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
from strata_plan.planner.placement import Placement, placement_of
from strata_plan.core.plan import load_plan
from strata_plan.core.modes import MODES, baseline
from strata_plan.planner.repredict import plan_problem, predict_plan
from strata_plan.planner.testing import tiny_problem
from strata_plan.profiles.schema import Figure, load_profile
from strata_plan.schema import to_data

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"
FIXTURE_PLAN = FIXTURE / "plan-rtx-4090.yaml"
KIMI5_PLAN = ROOT / "tests" / "data" / "plan-kimi5-h200-ramrich.yaml"


def with_cal(profile, **values):
    figs = {k: Figure(v, "estimate", "test") for k, v in values.items()}
    return dataclasses.replace(profile, calibration=dataclasses.replace(profile.calibration, **figs))


# ---- the copy path's round trip (several GPUs) ------------------------------------------------------------
def two_gpus(locality: float = 0.0):
    """The tiny problem (skews 1.4, 0.5, 0) on two RTX PRO 6000s, budgets roomy."""
    p = tiny_problem(skews=(1.4, 0.5, 0.0), locality=locality, profile="rtx-pro-6000")
    return p.replace(profile=load_profile("rtx-pro-6000-x2"), budget=Budget(2 * 10**13, 10**13, 10**13, 0, (10**13, 10**13)))


def split(p, vram: int, ram: int, depth: int = 0, gpu_split=None) -> Placement:
    """`vram` static and `ram` pinned-RAM experts a layer, no cache, every dense unit resident; MoE layer 0 on the
    first GPU, the others on the second (`gpu_split=()`: all on one GPU)."""
    L = p.curves.n_layers
    cut = (p.spec.moe_layers[1],) if gpu_split is None else gpu_split
    return Placement((vram,) * L, (ram,) * L, (0,) * L, (True,) * len(p.dense_units), depth, cut)


@pytest.mark.parametrize("where", ["vram", "ram"])
def test_round_trip_adds_moe_layers_times_it_when_nothing_overlaps(where):
    """No lookahead, split over two GPUs: each MoE layer's round trip is serial with its demand fetches, so the
    token grows by exactly L_moe x rt, and a prefill chunk by the same. On one GPU (read in place) the decode token
    has no round trip; its prefill chunk still pays one a MoE layer (the router's ids reach the host)."""
    p = two_gpus()
    E = p.curves.n_experts
    n = (E, 0) if where == "vram" else (0, E)
    rt = 250.0
    zero, some = (p.replace(profile=with_cal(p.profile, moe_round_trip_us=us)) for us in (0.0, rt))
    n_rt = p.spec.n_moe_layers * rt * 1e-6
    C = p.prefill_chunk
    a, b = CostModel(zero).predict(split(p, *n)), CostModel(some).predict(split(p, *n))
    assert a.decode_seconds["token"] > a.decode_seconds["pcie_link"]              # the walk, not a link, binds
    assert 1 / b.decode_tok_s - 1 / a.decode_tok_s == pytest.approx(n_rt, rel=1e-9)
    assert b.decode_seconds["round_trip"] == pytest.approx(n_rt, rel=1e-12)
    assert C / b.prefill_tok_s - C / a.prefill_tok_s == pytest.approx(n_rt, rel=1e-9)
    one_a, one_b = (CostModel(q).predict(split(p, *n, gpu_split=())) for q in (zero, some))
    assert one_a.decode_tok_s == one_b.decode_tok_s and one_b.decode_seconds["round_trip"] == 0.0
    assert C / one_b.prefill_tok_s - C / one_a.prefill_tok_s == pytest.approx(n_rt, rel=1e-9)


def test_host_fetch_paces_a_layer_whose_copies_are_shorter():
    """Every routed expert fetched from RAM (nothing static, no cache, no lookahead), split over two GPUs: once
    issuing a fetch on the host takes longer than its copy, each MoE layer waits k x host_fetch (+ the last copy),
    so the token grows by exactly L_moe x k per extra microsecond; below that the links hide it. One GPU reads in
    place: no fetch to issue."""
    p = two_gpus()
    place = split(p, 0, p.curves.n_experts)

    def token(us, where=place):
        return 1 / CostModel(p.replace(profile=with_cal(p.profile, host_fetch_us=us))).predict(where).decode_tok_s
    k, n_moe = p.curves.top_k, p.spec.n_moe_layers
    assert token(0.0) == token(1e-3)                                      # hidden behind the copies
    assert token(20000.0) - token(10000.0) == pytest.approx(n_moe * k * 10000e-6, rel=1e-9)
    one = split(p, 0, p.curves.n_experts, gpu_split=())
    assert token(0.0, one) == token(20000.0, one)


def test_round_trip_also_delays_the_lookahead():
    """The copy path with lookahead: the demand part still pays every round trip, and a prefetch cannot land
    before its source layer's hints have made their round trip: the token grows by at least L_moe x rt."""
    p = two_gpus(locality=0.4)
    place = split(p, 0, p.curves.n_experts, depth=1)
    rt = 400.0

    def walk(us):               # the walk's critical path: the sum of its per-resource seconds
        pred = CostModel(p.replace(profile=with_cal(p.profile, moe_round_trip_us=us))).predict(place)
        return sum(pred.decode_seconds.get(r, 0.0) for r in (*RESOURCES, "peer")), 1 / pred.decode_tok_s
    (w0, t0), (w1, t1) = walk(0.0), walk(rt)
    assert w1 - w0 >= p.spec.n_moe_layers * rt * 1e-6 * (1 - 1e-9)
    assert t1 >= t0 and t1 == pytest.approx(max(w1, t1), rel=1e-12)


def test_prefetch_overlap_charges_the_unhidden_share_of_the_prefetch():
    """`prefetch_overlap` < 1 on the copy path: the share of each layer's prefetch link time the engine does not
    hide is serial with the layer, so the walk grows as the overlap falls (by less than the prefetch time where
    the layer waited for its prefetch anyway); without lookahead it changes nothing; at the default (1) the
    prediction is as before. One GPU (read in place) does not use it."""
    p = two_gpus(locality=0.4)
    E = p.curves.n_experts
    ahead, plain = split(p, 0, E, depth=1), split(p, 0, E)

    def walk(place, ov=None):
        prof = p.profile if ov is None else with_cal(p.profile, prefetch_overlap=ov)
        pred = CostModel(p.replace(profile=prof)).predict(place)
        return sum(pred.decode_seconds.get(r, 0.0) for r in (*RESOURCES, "peer")), pred
    assert walk(ahead)[1] == walk(ahead, 1.0)[1]
    assert walk(plain, 0.0)[1] == walk(plain, 1.0)[1]
    w1, pred1 = walk(ahead, 1.0)
    w0, pred0 = walk(ahead, 0.0)
    wh, _ = walk(ahead, 0.5)
    assert w0 > wh >= w1 and pred0.decode_tok_s < pred1.decode_tok_s
    assert w0 - w1 <= pred0.decode_seconds["pcie"] + pred0.decode_seconds["nvme"]
    one = split(p, 0, E, depth=1, gpu_split=())
    assert walk(one, 0.0)[1] == walk(one, 1.0)[1]


def test_default_round_trip_is_an_estimate_and_old_profiles_keep_their_hash():
    prof = load_profile("rtx-4090")
    assert prof.calibration.moe_round_trip_us is None                    # shipped profiles: not written
    assert prof.calibration.round_trip.value == 75.0 and prof.calibration.round_trip.provenance == "estimate"
    assert "moe_round_trip_us" not in to_data(prof)["calibration"]


# ---- predict_plan --------------------------------------------------------------------------------------
def test_predict_plan_reproduces_a_plans_recorded_prediction(tmp_path):
    """A plan of the fixture in three tiers (README's budgets: VRAM, pinned RAM, NVMe behind a staging cache),
    saved and loaded: re-predicted from its recorded sources, every recorded figure comes back."""
    from strata_plan.core.plan import save_plan
    from strata_plan.planner.make import make_plan
    made = make_plan("rtx-4090", str(FIXTURE / "config.json"), stats=str(FIXTURE.parent / "fixture-moe.trace.npz"),
                     vram_gb=1.016, ram_gb=0.003, context=1024, trials=20)
    path = save_plan(made, tmp_path / "plan.yaml")
    plan = load_plan(path)
    assert any(l.nvme for l in plan.layers) and any(l.ram for l in plan.layers)
    rec = plan.predicted
    got = predict_plan(plan, "rtx-4090", where=str(path))
    assert got.decode_tok_s == pytest.approx(rec.decode_tok_s, rel=1e-12)
    assert got.prefill_tok_s == pytest.approx(rec.prefill_tok_s, rel=1e-12)
    assert got.decode_binding == rec.decode_binding and got.prefill_binding == rec.prefill_binding
    for k, v in rec.bytes_per_token.items():
        assert got.bytes_per_token[k] == pytest.approx(v, rel=1e-12, abs=1e-9)
    for k, v in rec.seconds_per_token.items():
        assert got.decode_seconds[k] == pytest.approx(v, rel=1e-12, abs=1e-15)


def test_modes_order_and_baselines():
    """LRU-only is never slower than on-demand; the kimi5 plan at lookahead depth 2 (guesses of precision ~0.78, copies
    of up to 8 experts a layer against ~0.5 ms of non-MoE time) is slower than LRU-only, as the H200 measured it
    (75.8 against 85.4 tok/s, engine-20261205T031403Z.json): its copies of layer j+2 share the link with layer j+1's
    in-place reads (`cost.LinkCopies`), so only the link's idle windows can hide them, and its wrong guesses cost link
    time."""
    plan = dataclasses.replace(load_plan(KIMI5_PLAN), prefetch_depth=2)
    prob = plan_problem(plan, "h200", str(KIMI5_PLAN))
    tok = {m: predict_plan(plan, None, m, problem=prob).decode_tok_s for m in MODES}
    assert tok["lru"] >= tok["on-demand"] and tok["plan"] < tok["lru"]
    lru, od = baseline(plan, "lru"), baseline(plan, "on-demand")
    assert lru.prefetch_depth == 0 and lru.cache.total_slots == plan.cache.total_slots > 0
    assert od.prefetch_depth == 0 and od.cache.total_slots == 0 and all(l.cache_slots == 0 for l in od.layers)
    assert [l.vram for l in od.layers] == [l.vram for l in plan.layers]


# ---- calibrate -----------------------------------------------------------------------------------------
# the machine the synthetic runs ran on: the H200 profile with these constants; only the per-layer overhead
# moves a one-GPU decode token (the rest price the copy path), so only it can be measured back
TRUE = {"layer_overhead_us": 42.0, "moe_round_trip_us": 180.0, "host_fetch_us": 400.0, "prefetch_overlap": 0.45}


def _run(plan_path: Path, mode: str, profile, record: str, loop: str = "device") -> dict:
    """A bench run as strata_plan/engine/bench.py measure() returns it, its figures predicted with `profile`: a
    device-loop run times its step without the MoE calls (the cost model's non-MoE seconds plus every decoder
    layer's overhead); a host-loop run has no such step."""
    plan = load_plan(plan_path)
    pred = predict_plan(plan, profile, mode, where=str(plan_path))
    rec = {"path": str(plan_path), "sha256": hashlib.sha256(plan_path.read_bytes()).hexdigest()}
    if record == "data":
        rec = {"path": "/elsewhere/plan.yaml", "sha256": "0" * 64, "data": to_data(plan)}
    step = None
    if loop == "device":
        prob = plan_problem(plan, profile, str(plan_path))
        free = CostModel(prob).non_moe_seconds(placement_of(baseline(plan, mode)))
        over = profile.calibration.layer_overhead_us.value * 1e-6
        step = {"without_moe_s": free + prob.spec.n_layers * over, "step_s": 1 / pred.decode_tok_s}
    return {"mode": mode, "loop": loop, "measured": {"decode_tok_s": pred.decode_tok_s,
                                                     "decode_s_per_token": {"median": 1 / pred.decode_tok_s}},
            "time_per_token": {"router_round_trip_s": 0.0, "store_and_launch_host_s": 0.0, "store_wait_s": 0.0},
            "device_step": step,
            "plan": {"n_moe_layers": len(plan.layers), "prefetch_depth": plan.prefetch_depth, **rec}}


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


def test_calibrate_measures_the_layer_overhead_and_leaves_the_rest(bench_files, capsys):
    d, files = bench_files
    out = d / "fitted.yaml"
    assert main(["calibrate", *map(str, files), "--profile", "h200", "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    cal, h200 = load_profile(str(out)).calibration, load_profile("h200").calibration
    fig = cal.layer_overhead_us
    assert fig.value == pytest.approx(TRUE["layer_overhead_us"], rel=1e-9) != h200.layer_overhead_us.value
    assert fig.provenance == "measured" and "measured directly" in fig.source and files[0].name in fig.source
    for name in ("hbm_efficiency", "round_trip", "host_fetch", "overlap", "compute_efficiency", "copy_overlap",
                 "dense_stream_efficiency", "stager_wake", "stager_read", "stager_publish"):
        assert getattr(cal, name) == getattr(h200, name), name                 # not fitted, not measured
    how = {c["name"]: c for c in res["constants"]}
    assert how["layer_overhead_us"]["measured"] and len(how) == 11
    assert all(not c["measured"] and c["how"].startswith("left alone") for n, c in how.items() if n != "layer_overhead_us")
    assert "not fitted" in how["hbm_efficiency"]["how"] and "not fitted" in how["prefetch_overlap"]["how"]
    runs = res["runs"]
    assert len(runs) == 5 and res["skipped"] == []
    assert all(abs(r["residual"]) < 1e-9 for r in runs)                             # the overhead was all that differed
    assert any(abs(r["predicted_before_s"] / r["measured_s_per_token"] - 1) > 1e-3 for r in runs)   # ... and mattered
    assert [r["layer_overhead_us"] for r in runs] == pytest.approx([TRUE["layer_overhead_us"]] * 5, rel=1e-9)


def test_the_overhead_is_measured_at_the_profiles_hbm_efficiency(tmp_path, capsys):
    """Runs of a machine whose kernels reach 55 % of HBM, measured against the H200 profile (70 %): hbm_efficiency
    stays 0.7, and the overhead is what each step without its MoE calls leaves beyond the non-MoE seconds at 0.7."""
    true = with_cal(load_profile("h200"), layer_overhead_us=42.0, hbm_efficiency=0.55)
    runs = {m: _run(FIXTURE_PLAN, m, true, "path") for m in ("plan", "lru")}
    f = tmp_path / "engine-slow-hbm.json"
    f.write_text(json.dumps({"runs": runs}))
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", str(f), "--profile", "h200", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "not fitted" in text and "residual" in text
    cal = load_profile(str(out)).calibration
    assert cal.hbm_efficiency == load_profile("h200").calibration.hbm_efficiency
    plan = load_plan(FIXTURE_PLAN)
    prob = plan_problem(plan, "h200", str(FIXTURE_PLAN))
    want = [(r["device_step"]["without_moe_s"] - CostModel(prob).non_moe_seconds(placement_of(baseline(plan, m))))
            / prob.spec.n_layers * 1e6 for m, r in runs.items()]
    assert cal.layer_overhead_us.value == pytest.approx(np.mean(want), rel=1e-9) and min(want) > 42.0


def test_calibrate_skips_host_loop_runs_with_a_note(bench_files, tmp_path, capsys):
    """A file with host-loop runs beside device-loop ones: the host-loop runs (`loop: host`, or an older run that
    records neither `loop` nor `device_step`) are skipped with a note naming the file, and change nothing; a
    file of host-loop runs only, given with others, is a note too."""
    d, files = bench_files
    true = with_cal(load_profile("h200"), **TRUE)
    old = _run(FIXTURE_PLAN, "lru", true, "path", loop="host")
    del old["loop"], old["device_step"]
    mixed = tmp_path / "engine-mixed.json"
    mixed.write_text(json.dumps({"runs": {"a/lru": _run(FIXTURE_PLAN, "lru", true, "path"),
                                          "a-host/lru": _run(FIXTURE_PLAN, "lru", true, "path", loop="host"),
                                          "old/lru": old}}))
    host = tmp_path / "engine-host.json"
    host.write_text(json.dumps({"run": _run(FIXTURE_PLAN, "plan", true, "path", loop="host")}))
    args = ["calibrate", str(mixed), str(host), str(files[0]), "--profile", "h200", "--out", str(tmp_path / "f.yaml")]
    assert main([*args, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in res["runs"]] == ["engine-mixed.json:a/lru", files[0].name]
    assert len(res["skipped"]) == 2
    assert str(mixed) in res["skipped"][0] and "2 host-loop runs" in res["skipped"][0]
    assert "a-host/lru" in res["skipped"][0] and "old/lru" in res["skipped"][0]
    assert str(host) in res["skipped"][1] and "1 host-loop run " in res["skipped"][1]
    assert load_profile(str(tmp_path / "f.yaml")).calibration.layer_overhead_us.value == pytest.approx(42.0, rel=1e-9)
    assert main([*args, "--force"]) == 0
    text = capsys.readouterr().out
    assert "skipped 2 host-loop runs" in text and "skipped 1 host-loop run" in text


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
    del r["measured"]["decode_s_per_token"]["median"]
    assert "bad.json: measured.decode_s_per_token.median: missing" in _bad(tmp_path, capsys, r)
    r = json.loads(json.dumps(good))
    r["device_step"]["without_moe_s"] = -1.0
    assert "bad.json: device_step.without_moe_s:" in _bad(tmp_path, capsys, r)
    r = json.loads(json.dumps(good))
    r["device_step"] = None                       # a device-loop run that did not time its step (eager, a CPU)
    err = _bad(tmp_path, capsys, r)
    assert "bad.json: device_step.without_moe_s: no run timed its step" in err and "on a GPU" in err
    r = json.loads(json.dumps(good))
    r["loop"] = "host"                            # host-loop runs only: nothing left to measure from
    err = _bad(tmp_path, capsys, {"runs": {"a/plan": r, "b/plan": r}})
    assert "bad.json: loop: every run is a host-loop run" in err
    r = json.loads(json.dumps(good))
    r["loop"] = "gpu"
    assert "bad.json: loop: 'gpu' is not a decode loop" in _bad(tmp_path, capsys, r)
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


def test_check_predicts_held_out_runs_with_the_measured_constants(bench_files, capsys):
    """--check re-predicts runs it was not measured on with the measured constants and the check profile's
    measured figures: runs made with the true constants come out as measured."""
    d, files = bench_files
    rc = main(["calibrate", str(files[0]), str(files[2]), "--profile", "h200", "--out", str(d / "fit-some.yaml"),
               "--json", "--check", str(files[1]), "--check-profile", "h200"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in res["check"]] == ["lru"] and res["check"][0]["run"].startswith(files[1].name)
    fitted = {c["name"]: c["after"] for c in res["constants"]}
    assert fitted["layer_overhead_us"] == pytest.approx(TRUE["layer_overhead_us"], rel=1e-9)
    assert abs(res["check"][0]["predicted_over_measured"]) < 1e-9


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
    # the device loop (PCIe-bound on the A100) charges the layers' overhead on its critical path
    dev = [predict_plan(plan, prof, "plan").decode_seconds["overhead"] for prof in (got, "a100-80g")]
    assert dev[0] > dev[1]


def test_the_stagers_host_time_is_measured_from_its_counters_by_turn(tmp_path, capsys):
    """Runs whose stager counted its demand reads by their turn in a request: wake = the first read's queue time
    plus half the poller's mean gap, read = the slope over turns weighted by the reads of each (here exact); publish
    = a read's time to its ready word less its time to its last part in, weighted by the runs' reads."""
    runs = {}
    for m, (gap, counts, read, land) in {"lru": (0.02, [100, 80, 50, 20], 0.5, 0.45),
                                          "on-demand": (0.04, [60, 60, 30], 0.6, 0.52)}.items():
        r = _run(FIXTURE_PLAN, m, load_profile("h200"), "path")
        r["stager"] = {"demand_queue_ms_by_rank": [0.1 + 0.07 * k for k in range(len(counts))],
                       "demand_reads_by_rank": counts, "poll_gap_ms_mean": gap,
                       "demand_read_ms_mean": read, "demand_land_ms_mean": land}
        runs[m] = r
    f = tmp_path / "engine-nvme.json"
    f.write_text(json.dumps({"runs": runs}))
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", str(f), "--profile", "h200", "--out", str(out), "--json"]) == 0
    how = {c["name"]: c for c in json.loads(capsys.readouterr().out)["constants"]}
    cal = load_profile(str(out)).calibration
    assert cal.stager_wake_us.value == pytest.approx(100 + (100 * 10 + 60 * 20) / 160, rel=1e-9)
    assert cal.stager_read_us.value == pytest.approx(70.0, rel=1e-9)
    assert cal.stager_read_us.provenance == "measured" and how["stager_read_us"]["measured"]
    assert cal.stager_publish_us.value == pytest.approx((250 * 50 + 150 * 80) / 400, rel=1e-9)
    assert how["stager_publish_us"]["measured"]
