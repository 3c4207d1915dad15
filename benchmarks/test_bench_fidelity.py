"""The pieces of benchmarks/bench_fidelity.py that decide what is compared: the tier assignments (popularity
and random keep the same counts per tier), the HQQ settings matched to each tier's bits per weight, the bits
per weight counted from the formats' bytes, and the targets' verdicts. The whole benchmark runs on the CPU
with `python benchmarks/bench_fidelity.py --smoke` (about 1.7 minutes on 2 shared cores, not part of CI)."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]

import bench_fidelity as B  # noqa: E402

from strata_plan.kernels import formats as F  # noqa: E402
from strata_plan.core.spec import load_spec  # noqa: E402

FIXTURE = ROOT / "tests" / "data" / "fixture-moe"


def test_popularity_order_is_most_routed_first_ties_by_id():
    counts = torch.tensor([[3, 9, 3, 0], [0, 0, 5, 1]])
    assert B.popularity_orders(counts) == [[1, 0, 2, 3], [2, 3, 0, 1]]


def test_random_assignment_keeps_the_popularity_split_counts():
    mix = F.tier_mix(F.SEED_TARGET_BPW)
    counts = torch.arange(9 * 64).reshape(9, 64) % 7
    pop = [mix.assign(o) for o in B.popularity_orders(counts)]
    rnd = [mix.assign(o) for o in B.random_orders(9, 64, seed=0)]
    assert B.tier_counts(pop) == B.tier_counts(rnd) == {f: 9 * c for f, c in zip(F.TIER_FORMATS, mix.counts(64))}
    assert rnd != pop and rnd == [mix.assign(o) for o in B.random_orders(9, 64, seed=0)]     # seeded
    assert all(sorted(layer) == list(range(64)) for layer in rnd)


def test_hqq_settings_are_the_nearest_bit_rates():
    # bench-moe (hidden 512, expert width 256): 2.81 -> 2-bit g32 (3.0), 2.56 -> 2-bit g64 (2.5), 1.44 -> 1-bit g64 (1.5)
    s = B.hqq_settings(F.TIER_FORMATS, 512, 256)
    assert [(s[f]["nbits"], s[f]["group_size"], s[f]["hqq_bpw"]) for f in F.TIER_FORMATS] == [(2, 32, 3.0), (2, 64, 2.5), (1, 64, 1.5)]
    mix = F.tier_mix(F.SEED_TARGET_BPW)
    split = [mix.assign(list(range(64)))] * 9                          # 13 / 12 / 39 experts a layer
    assert B.hqq_mix_bpw(s, split)["bpw_stored"] == pytest.approx((13 * 3.0 + 12 * 2.5 + 39 * 1.5) / 64)
    for f, v in B.hqq_settings(F.TIER_FORMATS, 256, 32).items():      # the fixture: groups must divide K = 32
        assert 32 % v["group_size"] == 0 and v["group_size"] % 8 == 0
        assert all(abs(v["hqq_bpw"] - v["format_bpw"]) <= abs(B.hqq_bpw(b, g) - v["format_bpw"])
                   for b in B.HQQ_BITS for g in B.HQQ_GROUPS if 32 % g == 0)


def test_bits_per_weight_from_the_stored_bytes():
    spec = load_spec(str(FIXTURE))
    one = [{e: F.NATIVE_FORMAT for e in range(spec.n_routed)} for _ in spec.moe_layers]
    b = B.bpw(spec, one)
    per_expert = 3 * spec.hidden * spec.moe_intermediate
    assert b["bpw_stored"] == F.expert_bytes(F.NATIVE_FORMAT, spec.hidden, spec.moe_intermediate) * 8 / per_expert
    assert b["bpw_format"] == F.get_format(F.NATIVE_FORMAT).bpw and b["bpw_stored"] > b["bpw_format"]   # K = 32 padded


def test_targets_compare_mean_kl():
    rows = {B.MIX: {"kl_mean": 0.02}, "mix.popularity": {"kl_mean": 0.03}, "mix.popularity.rtn": {"kl_mean": 0.025},
            "mix.random.calib": {"kl_mean": 0.05}}
    t = B.targets(rows)
    assert set(t) == {"quantizer_beats_rtn", "quantizer_calib_beats_rtn", "popularity_beats_random"}   # no HQQ row
    assert not t["quantizer_beats_rtn"]["met"] and t["quantizer_calib_beats_rtn"]["met"]
    assert t["popularity_beats_random"]["kl_ratio_measured"] == pytest.approx(0.4)


def test_hqq_error_falls_with_bits():
    pytest.importorskip("hqq")
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    err = [float((B.hqq_dequantized(w, b, 32, "cpu").float() - w).pow(2).mean()) for b in (1, 2, 4)]
    assert err[0] > err[1] > err[2] > 0
