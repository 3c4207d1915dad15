"""Measured decode layer times (`engine.layer_times`, a profile's `layer_times`) and how the cost model charges them:
a decoder layer costs its measured time (bytes over HBM at the measured context, plus the rest: its kernels'
latency) instead of the calibrated `layer_overhead_us`. On a CPU the same layers run eagerly under the wall clock
(the plumbing); the GPU's graphs are timed on the H200 (`profile --models`)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from strata_plan.core.spec import load_spec
from strata_plan.errors import UserError
from strata_plan.planner.cost import CostModel
from strata_plan.planner.placement import Placement
from strata_plan.planner.testing import tiny_problem
from strata_plan.engine.layer_times import check_model, measure_layer_times, with_layer_times
from strata_plan.profiles.schema import LayerTime, load_profile, save_profile

FIXTURE = "tests/data/fixture-moe"


def _entry(spec, head=50.0, dense=80.0, moe=120.0, context=512) -> LayerTime:
    return LayerTime(spec.layer_geometry, spec.name, context, head, dense, moe, "measured", "test entry", "2026-12-05")


def test_the_fixture_layers_time_on_a_cpu_and_round_trip_through_a_profile(tmp_path, monkeypatch):
    """The layers run eagerly on the CPU; the clock is a stand-in (50 us + 100 us a decoder layer the run went
    through), since a loaded CPU's wall clock can put a prefix below the one before it."""
    from strata_plan.engine import layer_times
    from strata_plan.engine.model import MoEModel
    ran = [0]
    real = MoEModel._layer

    def layer(self, *a, **k):
        ran[0] += 1
        return real(self, *a, **k)

    picked = [0]
    real_pick = layer_times.GumbelPick.__call__

    def pick(self, logits):
        picked[0] += 1
        return real_pick(self, logits)

    def clock(run, device):
        before, drawn = ran[0], picked[0]
        run()
        return 50.0 + 100.0 * (ran[0] - before) + 30.0 * (picked[0] - drawn)
    monkeypatch.setattr(MoEModel, "_layer", layer)
    monkeypatch.setattr(layer_times.GumbelPick, "__call__", pick)
    monkeypatch.setattr(layer_times, "_timed", clock)
    t = measure_layer_times(FIXTURE, context=64, reps=3, device="cpu")
    spec = load_spec(FIXTURE)
    assert t.geometry == spec.layer_geometry and t.model == "fixture-moe" and t.context == 64
    assert t.head_us > 0 and t.moe_layer_us > 0 and t.dense_layer_us > 0      # the fixture has one dense layer
    assert (t.head_us, t.dense_layer_us, t.moe_layer_us, t.pick_us) == (50.0, 100.0, 100.0, 30.0)
    assert "wall clock on the CPU" in t.source
    prof = with_layer_times("rtx-4090", [t])
    path = save_profile(prof, tmp_path / "p.yaml")
    back = load_profile(str(path))
    assert back.gpu.layer_time(spec.layer_geometry) == t
    again = with_layer_times(back, [dataclasses.replace(t, head_us=1.0)])          # the same geometry: replaced
    assert len(again.gpu.layer_times) == 1 and again.gpu.layer_time(spec.layer_geometry).head_us == 1.0


def test_a_profile_without_layer_times_keeps_its_bytes(tmp_path):
    prof = load_profile("h200")
    assert prof.gpu.layer_times is None
    text = save_profile(prof, tmp_path / "p.yaml").read_text()
    assert "layer_times" not in text


def test_the_geometry_key_ignores_the_layer_count_and_the_experts_size():
    assert load_spec("kimi-k3.1-pro@5moe").layer_geometry == load_spec("kimi-k3.1-pro").layer_geometry
    assert load_spec("kimi-k3.1-pro").layer_geometry != load_spec("deepseek-v3").layer_geometry


def test_check_model_refuses_in_one_line():
    check_model(FIXTURE)
    with pytest.raises(UserError, match="unknown model name"):
        check_model("no-such-model")
    with pytest.raises(UserError, match="engine runs"):
        check_model("gpt-oss-20b")                          # the planner reads it; the engine does not run it


def test_profile_models_flag_refuses_before_measuring(tmp_path):
    out = tmp_path / "p.yaml"
    r = subprocess.run([sys.executable, "-m", "strata_plan.cli", "profile", "--quick", "--models", "nope", "--out",
                        str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "--models: nope: unknown model name" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_measured_layer_times_replace_the_calibrated_overhead():
    """Everything resident, the device loop: the token is the layers' measured times (bytes over HBM at the
    measured context, plus the rest) and the head's; the calibrated overhead no longer counts."""
    p = tiny_problem()
    E, L = p.curves.n_experts, p.curves.n_layers
    place = Placement((E,) * L, (0,) * L, (0,) * L, (True,) * len(p.dense_units), 0)
    spec = p.spec
    base = CostModel(p)
    assert base.measured_layers is None
    assert np.allclose(base.layer_overheads, base.overhead) and base.head_overhead == 0.0
    t0 = 1.0 / base.predict(place).decode_tok_s
    entry = _entry(spec, head=3000.0, dense=2000.0, moe=5000.0, context=p.context)   # far above the bytes' time
    cm = CostModel(p.replace(profile=with_layer_times(p.profile, [entry])))
    assert cm.measured_layers == entry
    lay = cm._layers
    for i, kind in enumerate(spec.layer_kinds):
        us = entry.dense_layer_us if kind == "dense" else entry.moe_layer_us
        assert cm.layer_overheads[i] == pytest.approx(us * 1e-6 - (lay["dense"][i] + lay["kv"][i]) / cm.hbm_rate)
    assert cm.head_overhead == pytest.approx(3000e-6 - p.dense_units[-1] / cm.hbm_rate)
    t1 = 1.0 / cm.predict(place).decode_tok_s
    layers = sum(entry.dense_layer_us if k == "dense" else entry.moe_layer_us for k in spec.layer_kinds) * 1e-6
    routed = t0 - (base.non_moe_seconds(place) + spec.n_layers * base.overhead)      # the experts' own time
    assert t1 == pytest.approx(layers + entry.head_us * 1e-6 + routed, rel=1e-6)

    # sampled decoding: the draw's measured time beyond the argmax joins each token (greedy: not charged)
    drawn = dataclasses.replace(entry, pick_us=70.0)
    both = [CostModel(p.replace(profile=with_layer_times(p.profile, [drawn]), sampled=s)) for s in (False, True)]
    greedy, sampled = (1.0 / c.predict(place).decode_tok_s for c in both)
    assert greedy == pytest.approx(t1, rel=1e-9) and sampled - greedy == pytest.approx(70e-6, rel=1e-6)


def test_a_longer_context_than_measured_adds_its_kv_bytes():
    p = tiny_problem(context=4096)
    spec = p.spec
    at = lambda ctx: CostModel(p.replace(profile=with_layer_times(p.profile, [_entry(spec, context=ctx)])))  # noqa: E731
    short, full = at(512), at(4096)
    kv = spec.attention.kv_bytes_per_token_layer * (4096 - 512)
    assert short.layer_overheads - full.layer_overheads == pytest.approx(np.full(spec.n_layers, kv / full.hbm_rate))
