"""The packed-format registry: bits per weight, byte layouts, alignment, and the tier split."""
from __future__ import annotations

import pytest

from strata_plan.kernels import formats as F


@pytest.mark.parametrize("name", F.TIER_FORMATS)
def test_tier_formats_land_within_0_03_of_the_seed(name):
    f = F.get_format(name)
    assert abs(f.bpw - f.seed_bpw) <= 0.03


def test_native_and_bf16_rates():
    assert abs(F.get_format(F.NATIVE_FORMAT).bpw - 4.25) < 1e-9
    assert F.get_format("bf16").bpw == 16


@pytest.mark.parametrize("name", list(F.FORMATS))
@pytest.mark.parametrize("h,i", [(7168, 3584), (7168, 2048), (256, 32), (2880, 2880), (100, 37)])
def test_expert_layout_is_contiguous_aligned_and_counts_every_byte(name, h, i):
    lay = F.expert_layout(name, h, i)
    assert lay.nbytes % F.EXPERT_ALIGN == 0
    end = 0
    for s in lay.segments:
        assert s.offset % F.SEGMENT_ALIGN == 0 and s.offset >= end   # ordered, non-overlapping
        end = s.offset + s.nbytes
    assert end <= lay.nbytes < end + F.EXPERT_ALIGN + F.SEGMENT_ALIGN * len(lay.segments)
    fmt = F.get_format(name)
    for m, (n, k) in F.matrix_shapes(h, i).items():
        kp = -(-k // fmt.k_align) * fmt.k_align
        stored = sum(s.nbytes for s in lay.segments if s.matrix == m)
        assert stored == fmt.matrix_bytes(n, k)
        # bits per weight over the padded width equal the format's rate exactly
        assert stored * 8 == pytest.approx(fmt.bpw * n * kp)


def test_kimi_expert_bytes_worked_example():
    # gate/up [3584, 7168], down [7168, 3584]; 2.8125 bpw over 77,070,336 weights = 27,095,040 bytes
    assert F.expert_bytes("q2_g16_s8m4", 7168, 3584) == 27_095_040
    assert F.expert_bytes("q1_g32_s8m4", 7168, 3584) == 13_848_576


def test_tier_mix_reaches_the_target_and_orders_by_popularity():
    mix = F.tier_mix(1.92)
    assert sum(mix.fractions) == pytest.approx(1)
    assert mix.mean_bpw == pytest.approx(1.92)
    assert mix.fractions == pytest.approx((0.193, 0.193, 0.614), abs=1e-3)
    counts = mix.counts(384)
    assert sum(counts) == 384 and counts == (74, 74, 236)
    order = list(range(383, -1, -1))      # expert 383 is the most used
    assign = mix.assign(order)
    assert assign[383] == F.TIER_FORMATS[0] and assign[0] == F.TIER_FORMATS[2]
    skewed = F.tier_mix(1.92, hot_to_warm=2.0)
    assert skewed.mean_bpw == pytest.approx(1.92) and skewed.fractions[0] == pytest.approx(2 * skewed.fractions[1])


def test_unreachable_targets_are_refused():
    with pytest.raises(ValueError):
        F.tier_mix(3.5)
    with pytest.raises(ValueError):
        F.tier_mix(1.0)
    with pytest.raises(KeyError):
        F.get_format("q3_nope")
