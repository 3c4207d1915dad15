"""Issue 26's cost model: a layer's NVMe misses read together at the store's queue depth, the prefill
expansion term, the fused MoE decode rate, each against a hand computation; the envelope of the drive's
surface; the plan's record of how to read."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from strata_plan.planner.capacity import Budget
from strata_plan.planner.cost import CostModel
from strata_plan.planner.placement import Placement
from strata_plan.planner.rates import REFERENCE_EXPANSION, decode_rates, expansion_rate, layer_bytes
from strata_plan.planner.reads import NVME_SPLITS, batch_seconds, envelope_rates, expert_read
from strata_plan.planner.testing import tiny_problem
from strata_plan.profiles.schema import MoEDecodeRate, MoEPrefillRate, Surface, load_profile

# a drive of 1 GB/s at queue depth 1 and 8 GB/s at 64, whatever the block size: R(q) = 1 + 7 (q - 1) / 63
FLAT = Surface(((4096, 1, 1.0), (2**30, 1, 1.0), (4096, 64, 8.0), (2**30, 64, 8.0)), "estimate", "test drive")


def _rate(q):
    return (1.0 + 7.0 * (min(q, 64) - 1) / 63.0) * 1e9


@pytest.fixture(scope="module")
def flat():
    p = tiny_problem(skews=(1.4, 0.5, 0.0), vram_experts=4, ram_experts=4, locality=0.4)
    prof = p.profile
    drive = dataclasses.replace(prof.nvme[0], rand_read=FLAT, seq_read=None)
    return p.replace(profile=dataclasses.replace(prof, nvme=(drive,)), budget=Budget(10**13, 10**13, 10**13, 0))


def test_envelope_is_monotone_and_little_capped():
    bumpy = Surface(((2**20, 1, 1.2), (2**20, 4, 1.0), (2**20, 8, 4.0), (2**20, 32, 3.0)), "measured", "x", "2026-12-02")
    r = envelope_rates(lambda b, q: bumpy.at(b, q) * 1e9, bumpy.queue_depths, 2**20, 64)[1:]
    assert np.all(np.diff(r) >= -1e-6)                          # never falls with depth (the store holds fewer)
    assert np.all(np.diff(r / np.arange(1, 65)) <= 1e-9)       # per-request rate never rises
    # depth 4 measured no faster than depth 1 (the running max keeps 1.2), so depth 8 is held to 4 x 1.2 / 4 x 8
    # requests' worth by Little's law (2.4 of the measured 4.0); past the last depth, its running max
    assert r[0] == pytest.approx(1.2e9) and r[3] == pytest.approx(1.2e9)
    assert r[7] == pytest.approx(2.4e9) and r[-1] == pytest.approx(4.0e9)
    assert np.all(envelope_rates(None, (), 4096, 4)[1:] == 1.0)     # no drive


def test_batch_times_by_hand(flat):
    """T(i) = i b / R(min over splits...): with a block-independent drive the deepest split wins."""
    cm = CostModel(flat)
    k = flat.spec.top_k
    for f, r in cm.nvme_reads(k).items():
        b = flat.spec.routed_expert_bytes(f)
        for i in range(1, k + 1):
            assert r.times[i] == pytest.approx(i * b / _rate(i * max(NVME_SPLITS)), rel=1e-9)
        assert r.splits == (max(NVME_SPLITS),) * k and r.queue_depth == k * max(NVME_SPLITS)
        assert float(r.seconds(np.array(0.5))) == pytest.approx(0.5 * r.times[1], rel=1e-12)


def test_mixed_batch_takes_the_longer_of_own_and_stream(flat):
    reads = list(CostModel(flat).nvme_reads(2).values())
    counts = np.array([[1.0], [0.0], [1.0]])[: len(reads)]
    own = max(float(r.seconds(c)[0]) for r, c in zip(reads, counts))
    stream = sum(float(c[0]) * r.times[-1] / 2 for r, c in zip(reads, counts))
    assert batch_seconds(reads, counts)[0] == pytest.approx(max(own, stream), rel=1e-12)


def test_all_on_nvme_decode_is_the_hand_computation(flat):
    """Every expert on NVMe, no cache, no lookahead, split over two GPUs (the copy path: no staging cache): each
    layer waits for its k expected misses read together (per format, the batch of its expected count) plus one
    cold expert's copy, over the all-VRAM token."""
    two = load_profile("rtx-4090-x2")
    p = flat.replace(profile=dataclasses.replace(two, nvme=flat.profile.nvme),
                     budget=Budget(2 * 10**13, 10**13, 10**13, 0, (10**13, 10**13)))
    assert p.profile.gpus[1].h2d_pinned == p.profile.gpus[0].h2d_pinned       # the hand computation's one curve
    E, L, k = p.curves.n_experts, p.curves.n_layers, p.spec.top_k
    dense = (True,) * len(p.dense_units)
    split = (p.spec.moe_layers[1],)
    cm = CostModel(p)
    t_res = 1 / cm.predict(Placement((E,) * L, (0,) * L, (0,) * L, dense, 0, split)).decode_tok_s
    t_nvme = 1 / cm.predict(Placement((0,) * L, (0,) * L, (0,) * L, dense, 0, split)).decode_tok_s
    h2d = lambda b: b / (p.profile.gpu.h2d_pinned.at(b) * 1e9)  # noqa: E731
    want = 0.0
    fmts = p.mix.formats
    for l in range(L):
        pop = p.curves.pop[l]
        n = {f: k * sum(pop[r] for r in range(E) if p.rank_formats[r] == f) for f in fmts}
        T = {f: np.interp(n[f], range(k + 1), [0.0] + [i * p.spec.routed_expert_bytes(f) / _rate(16 * i)
                                                     for i in range(1, k + 1)]) for f in fmts}
        stream = sum(n[f] * p.spec.routed_expert_bytes(f) / _rate(16 * k) for f in fmts)
        nvme = max(max(T.values()), stream)
        pcie = k * sum(pop[r] * h2d(p.rank_bytes[r]) for r in range(E))
        assert nvme > pcie                               # the drive binds each layer's stall
        want += nvme + pcie / k                          # + one cold expert's copy (k misses a layer)
    assert t_nvme - t_res == pytest.approx(want, rel=1e-9)


def test_concurrent_reads_are_faster_than_one_at_a_time(flat):
    """The old model (one expert in flight) is the batch of one, repeated: never faster."""
    cm = CostModel(flat)
    k = flat.spec.top_k
    for r in cm.nvme_reads(k).values():
        assert r.times[k] < k * r.times[1]


def test_prefill_expansion_term_by_hand():
    """All experts resident, no links: a prefill chunk costs each layer max(FLOPs, HBM, touched experts x
    3 H I / expansion rate) + overhead; with a slow expansion rate the expansion binds every MoE layer."""
    p = tiny_problem(skews=(1.4, 0.5, 0.0)).replace(budget=Budget(10**13, 10**13, 10**13, 0))
    gpu = p.profile.gpu
    slow = MoEPrefillRate(((p.spec.hidden, p.spec.moe_intermediate, 2, 8, 64, 0.5),
                           (p.spec.hidden, p.spec.moe_intermediate, 2, 8, 4096, 1.0)), "measured", "test", "2026-12-03")
    q = p.replace(profile=dataclasses.replace(p.profile, gpus=(dataclasses.replace(gpu, fused_moe_prefill=slow),)))
    E, L, C, k = q.curves.n_experts, q.curves.n_layers, q.prefill_chunk, q.spec.top_k
    place = Placement((E,) * L, (0,) * L, (0,) * L, (True,) * len(q.dense_units), 0)
    cm = CostModel(q)
    rate = 1e9 * (0.5 + 0.5 * np.log(C / 64) / np.log(4096 / 64))
    assert cm.expansion_rate == pytest.approx(rate, rel=1e-12)
    touched = 1 - (1 - np.minimum(1, k * q.curves.pop)) ** C             # [L, E]
    expand = touched.sum(axis=1) * q.spec.expert_params / rate
    lay, cal = cm._layers, q.profile.calibration
    T = 0.0
    for i in range(q.spec.n_layers):
        j = q.spec.moe_layers.index(i) if i in q.spec.moe_layers else None
        w = lay["dense"][i] + (float((touched[j] * q.rank_bytes).sum()) if j is not None else 0.0)
        fl = C * (lay["flops_pre"][i] + (2 * k * q.spec.expert_params if j is not None else 0.0))
        gpu_t = max(fl / cm.flop_rate, w / cm.hbm_rate, expand[j] if j is not None else 0.0)
        assert j is None or gpu_t == expand[j]                            # the expansion binds
        T += gpu_t + cal.layer_overhead_us.value * 1e-6 + (cal.round_trip.value * 1e-6 if j is not None else 0.0)
    u = q.dense_units[-1]
    T += max(u / cm.hbm_rate, 2 * q.head_params / cm.flop_rate)
    pred = cm.predict(place)
    assert pred.prefill_tok_s == pytest.approx(C / T, rel=1e-9) and pred.prefill_binding == "compute"
    assert pred.prefill_tok_s < CostModel(p).predict(place).prefill_tok_s


def test_expansion_estimate_without_a_measurement_says_so():
    p = tiny_problem()
    assert p.profile.gpu.fused_moe_prefill is None
    r = expansion_rate(p)
    ref = REFERENCE_EXPANSION
    assert r.estimated and "scaled by bf16 TFLOPS" in r.source
    want = np.interp(np.log(256), np.log(ref["tokens"]), ref["gweights_s"])     # chunk 256: clamped at 512
    assert r.value == pytest.approx(want * 1e9 * p.profile.gpu.bf16_tflops.value / ref["bf16_tflops"], rel=1e-12)


def test_decode_rate_from_the_fused_moe_call_interpolates_over_layer_bytes():
    p = tiny_problem()
    b = layer_bytes(p)
    fm = MoEDecodeRate(((1024, 512, 2, int(b / 4), 500.0), (4096, 8192, 2, int(b * 4), 900.0)), "measured", "test",
                       "2026-12-03")
    q = p.replace(profile=dataclasses.replace(p.profile, gpus=(dataclasses.replace(p.profile.gpu, fused_moe_decode=fm),)))
    rates = decode_rates(q)
    want = 500.0 + (np.log(b) - np.log(int(b / 4))) / (np.log(int(b * 4)) - np.log(int(b / 4))) * 400.0
    assert all(r.value == pytest.approx(want * 1e9, rel=1e-6) and not r.estimated for r in rates.values())
    # without it: the profile's GEMV figures (h200), else HBM x hbm_efficiency (rtx-4090), each an estimate
    assert not p.profile.gpu.kernel_gbps
    assert all(r.estimated and "hbm_efficiency" in r.source for r in decode_rates(p).values())
    h = tiny_problem(profile="h200")              # its measured fused MoE figure taken out: the GEMV fallback
    h = h.replace(profile=dataclasses.replace(h.profile, gpus=(dataclasses.replace(h.profile.gpu, fused_moe_decode=None),)))
    assert all(r.estimated and "kernel_gbps" in r.source for r in decode_rates(h).values())
    # the kernel time of a fully resident token follows the rate
    E, L = p.curves.n_experts, p.curves.n_layers
    place = Placement((E,) * L, (0,) * L, (0,) * L, (True,) * len(p.dense_units), 0)
    assert CostModel(q).predict(place).decode_tok_s != CostModel(p).predict(place).decode_tok_s


def test_plan_records_how_to_read(flat):
    from strata_plan.planner.build import build_plan
    assert callable(build_plan)                       # the module (and the plan's fields) import
    cm = CostModel(flat)
    k = flat.spec.top_k
    assert cm.decode_in_flight == k
    for f, r in cm.nvme_reads(k).items():
        assert len(r.splits) == k and r.queue_depth == k * r.split
    one = expert_read(lambda b, q: _rate(q), FLAT.queue_depths, "q1_g32_s8m4", 10**7, 1)
    assert one.in_flight == 1 and one.times[1] == pytest.approx(1e7 / _rate(16))


def test_no_split_reads_below_the_smallest_measured_block():
    """A drive faster with depth at every block size would have a 113 KiB blob read as 16 sub-reads of 8 KiB; the
    profile measured nothing below 128 KiB, so the blob is read whole (the stager's requests below a measured size
    have no measured cost), and a 16 MiB blob may still split into 1 MiB sub-reads."""
    rate = lambda b, q: _rate(q)                                # noqa: E731
    small = 113 * 1024
    assert set(expert_read(rate, FLAT.queue_depths, "f", small, 6).splits) == {16}      # no floor: split 16 ways
    assert set(expert_read(rate, FLAT.queue_depths, "f", small, 6, min_block=128 * 1024).splits) == {1}
    assert set(expert_read(rate, FLAT.queue_depths, "f", 16 * 2**20, 6, min_block=2**20).splits) == {16}
