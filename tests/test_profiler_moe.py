"""The fused MoE rates of the profiler (strata_plan/profiler/moe.py): run on CPU at tiny shapes through the kernels'
plain-torch reference path with a host clock, turned into the profile's fused_moe_decode / fused_moe_prefill,
and skipped with a note where the kernels cannot run."""
from __future__ import annotations

import pytest

from strata_plan.kernels.formats import expert_bytes, tier_mix
from strata_plan.profiler import gpu, moe
from strata_plan.profiler.run import fused_moe_entries
from strata_plan.profiles.schema import MoEDecodeRate, MoEPrefillRate

TINY = moe.MoESettings(decode_shapes=((64, 32), (128, 64)), top_k=4, prefill_shape=(64, 32), prefill_experts=8,
                       prefill_tokens=(20, 40), repeats=2, l2_bytes=1)


@pytest.fixture(scope="module")
def result():
    return moe.measure(TINY, "cpu", graph_timer=moe.host_seconds, timer=moe.host_seconds)


def test_decode_points_count_the_tier_mix_layer(result):
    assert [(h, i, k) for h, i, k, _, _ in result.decode] == [(64, 32, 4), (128, 64, 4)]
    for h, i, k, b, gbps in result.decode:
        assert b == sum(expert_bytes(f, h, i) for f in tier_mix().names(k))
        us = result.decode_us[(h, i)]
        assert gbps == pytest.approx(b / (us * 1e-6) / 1e9, rel=1e-2) and gbps > 0


def test_prefill_points_count_touched_experts_once(result):
    assert [(p[3], p[4]) for p in result.prefill] == [(8, 20), (8, 40)]
    for h, i, k, e, m, g in result.prefill:
        ms = result.prefill_ms[m]
        touched = g * 1e9 * ms * 1e-3 / (3 * h * i)
        assert touched == pytest.approx(round(touched), abs=0.05) and 1 <= round(touched) <= e


def test_profile_entries_are_measured_and_load(result):
    e = fused_moe_entries(result)
    dec, pre = e["fused_moe_decode"], e["fused_moe_prefill"]
    assert isinstance(dec, MoEDecodeRate) and isinstance(pre, MoEPrefillRate)
    assert dec.provenance == pre.provenance == "measured" and dec.date and "fused_moe" in dec.source
    assert fused_moe_entries(None) == {}


def test_arena_blobs_are_aligned_and_scales_finite():
    import torch
    from strata_plan.kernels.formats import EXPERT_ALIGN, expert_layout
    names = tier_mix().names(5)
    arena, offsets = moe.random_arena(names, 64, 32, "cpu")
    assert all(int(o) % EXPERT_ALIGN == 0 for o in offsets)
    for f, off in zip(names, offsets.tolist()):
        for s in expert_layout(f, 64, 32).segments:
            if s.dtype != "uint8":
                v = arena[off + s.offset: off + s.offset + s.nbytes].view(getattr(torch, s.dtype))
                assert torch.isfinite(v.float()).all() and float(v.float().abs().max()) < 0.02


def test_a_kernel_failure_is_a_note_not_a_lost_profile(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("triton: out of resources")
    monkeypatch.setattr(moe, "measure", boom)
    notes: list[str] = []
    assert gpu.fused_moe_rates(TINY, notes) is None
    assert len(notes) == 1 and "out of resources" in notes[0]
    assert gpu.fused_moe_rates(None, notes) is None and len(notes) == 1


def test_profile_with_the_rates_round_trips(result, tmp_path):
    import dataclasses
    from strata_plan.profiles.schema import load_profile, save_profile
    prof = load_profile("h200")
    gpu = dataclasses.replace(prof.gpu, **fused_moe_entries(result))
    path = save_profile(dataclasses.replace(prof, gpus=(gpu,)), tmp_path / "h200.yaml")
    back = load_profile(str(path))
    assert back.gpu.fused_moe_decode == gpu.fused_moe_decode and back.gpu.fused_moe_prefill == gpu.fused_moe_prefill
    b = result.decode[0][3]
    assert back.gpu.fused_moe_decode.at(b) == pytest.approx(result.decode[0][4])


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_fused_moe_rates_on_the_gpu():
    """The real kernels, CUDA graphs and events, at two small shapes: rates below the card's read bandwidth."""
    import torch
    s = moe.MoESettings(decode_shapes=((1024, 512), (2048, 768)), prefill_shape=(1024, 512), prefill_experts=32,
                        prefill_tokens=(64, 256), repeats=3)
    r = moe.measure(s, "cuda")
    props = torch.cuda.get_device_properties(0)
    assert all(0 < v < 20000 for *_, v in r.decode) and all(0 < v < 1e5 for *_, v in r.prefill)
    assert props.total_memory > 0 and set(r.prefill_ms) == {64, 256}
