"""The cost model's device loop: on one GPU RAM experts are read in place (zero-copy).

A one-GPU placement runs without the host round trip and without copies: with no cache slots, no lookahead and no
NVMe tier each MoE layer takes max(RAM bytes / zero-copy rate, kernel time). Here that token is computed by hand
from the spec, the routing curves and the profile, and so are cache slots, lookahead and an NVMe tier in the device
loop; the zero-copy rate is the profile's `zero_copy` curve where there is one, else the pinned H2D curve. Several
GPUs take the copy path.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from strata_plan.core.modes import baseline
from strata_plan.core.plan import load_plan
from strata_plan.planner.capacity import Budget
from strata_plan.planner.cost import CostModel
from strata_plan.planner.placement import Placement, placement_of
from strata_plan.planner.rates import decode_rates
from strata_plan.planner.repredict import plan_problem, predict_plan
from strata_plan.planner.testing import tiny_problem
from strata_plan.profiles.schema import Curve, load_profile


@pytest.fixture(scope="module")
def tiny():
    """Three MoE layers of 8 experts (skews 1.4, 0.5, 0) on the RTX 4090, budgets roomy."""
    p = tiny_problem(skews=(1.4, 0.5, 0.0), vram_experts=4, ram_experts=4, locality=0.4)
    return p.replace(budget=Budget(10**13, 10**13, 10**13, 0))


def in_place_placement(p, vram=(3, 0, 1)) -> Placement:
    """`vram` static experts a layer, the rest in pinned RAM: no cache, no lookahead, no NVMe tier."""
    E = p.curves.n_experts
    return Placement(tuple(vram), tuple(E - v for v in vram), (0,) * len(vram), (True,) * len(p.dense_units), 0)


def with_zero_copy(profile, factor: float):
    """The profile with a zero_copy curve of `factor` x its pinned H2D curve, marked measured."""
    g = profile.gpu
    curve = dataclasses.replace(g.h2d_pinned.scaled(factor), provenance="measured",
                                source=f"test: {factor} x h2d_pinned", date="2026-12-01")
    return dataclasses.replace(profile, gpus=(dataclasses.replace(g, zero_copy=curve),) + profile.gpus[1:])


def by_hand(p, place: Placement, zc_gbps, warm_bytes=None) -> tuple[float, list[tuple[float, float]]]:
    """(seconds a token, [(RAM read seconds, kernel seconds)] per MoE layer) of an in-place placement, from the
    spec and the profile: every decoder layer's overhead plus its dense + KV bytes over HBM x efficiency (or its
    FLOPs, whichever is longer), every MoE layer's RAM bytes / zc_gbps(RAM bytes) + kernel time (the call's
    programs read their experts, then compute), the head; the token is that or the PCIe link's busy time (the RAM
    reads and the embedding row), whichever is longer. `warm_bytes` [L] (a placement with cache slots: the misses
    after the cache): the same sum (the device LRU's fill, then the kernel). Every MoE layer adds its residency
    kernels: the device LRU's step and fill (the profile's cache_layer) where the plan has cache slots, else the use
    count at the launch floor; with an NVMe tier (RAM and VRAM short of the experts) the stager's handshake too."""
    spec, gpu, cal = p.spec, p.profile.gpu, p.profile.calibration
    E, k, ctx = p.curves.n_experts, spec.top_k, p.context
    hbm = gpu.hbm_gbps.value * 1e9 * cal.hbm_efficiency.value
    flops = gpu.bf16_tflops.value * 1e12 * cal.compute_efficiency.value
    t = 0.0
    for i in range(spec.n_layers):
        nbytes = spec.dense_layer_bytes(i) + spec.kv_cache_layer_bytes(i, ctx)
        fl = 2 * spec.dense_layer_params(i) + spec.attention.score_flops(ctx)
        t += cal.layer_overhead_us.value * 1e-6 + max(nbytes / hbm, fl / flops)
    rates = decode_rates(p, gpu)
    layers, link = [], 0.0
    for j in range(p.curves.n_layers):
        pop = p.curves.pop[j]
        warm = k * sum(pop[r] * p.rank_bytes[r] for r in range(place.vram[j], E))       # RAM ranks, no cache
        if warm_bytes is not None:
            warm = float(warm_bytes[j])
        t_ram = warm / (zc_gbps(warm) * 1e9) if warm > 0 else 0.0
        t_exp = max(k * sum(pop[r] * p.rank_bytes[r] / rates[p.rank_formats[r]].value for r in range(E)),
                    2.0 * k * spec.expert_params / flops)
        layers.append((t_ram, t_exp))
        cached = place.cache is not None and any(c > 0 for c in place.cache)
        staged = any(v + m < E for v, m in zip(place.vram, place.ram))
        t += t_ram + t_exp + (gpu.cache_layer() if cached else gpu.launch_us()).value * 1e-6
        t += gpu.stage_layer().value * 1e-6 if staged else 0.0
        link += t_ram
    t += max(p.dense_units[-1] / hbm, 2.0 * p.head_params / flops)
    row = 2 * spec.hidden
    link += row / (gpu.h2d_pinned.at(row) * 1e9)
    return max(t, link), layers


# zero-copy reads on a Gen4 x16 link: a kernel reading 64 KiB in place takes ~10 us, so small reads cost less
# than the H2D curve's first point (a copy's latency) charges; large ones stay below the copy engine's rate
ZERO_COPY = Curve(((64 << 10, 6.0), (1 << 20, 18.0), (16 << 20, 22.0), (256 << 20, 23.0)), "measured",
                  "test: zero-copy reads of a Gen4 x16 link", "2026-12-01")


@pytest.mark.parametrize("zero_copy", [None, ZERO_COPY], ids=["h2d_pinned", "zero_copy"])
def test_in_place_token_is_the_hand_calculation(tiny, zero_copy):
    p = tiny
    if zero_copy is not None:
        g = p.profile.gpu
        p = p.replace(profile=dataclasses.replace(p.profile, gpus=(dataclasses.replace(g, zero_copy=zero_copy),)))
    place = in_place_placement(p, (7, 0, 1))
    cm = CostModel(p)
    assert cm.in_place(place)
    want, layers = by_hand(p, place, (zero_copy or p.profile.gpu.h2d_pinned).at)
    assert any(r > e for r, e in layers)                      # RAM reads outlast the kernel ...
    if zero_copy is not None:
        assert any(e > r > 0 for r, e in layers)              # ... or not: they add up either way
    pred = cm.predict(place)
    assert 1.0 / pred.decode_tok_s == pytest.approx(want, rel=1e-12)
    sec = pred.decode_seconds
    assert sec["round_trip"] == 0.0 and sec["host_fetch"] == 0.0
    assert sec["pcie_link"] == pytest.approx(sum(r for r, _ in layers)
                                             + 2 * p.spec.hidden / (p.profile.gpu.h2d_pinned.at(2 * p.spec.hidden) * 1e9),
                                             rel=1e-12)
    assert sec["pcie"] == pytest.approx(sum(r for r, _ in layers), rel=1e-12)


def test_a_cache_in_the_device_loop_is_the_fill_then_the_kernel(tiny):
    """Cache slots run in the device loop too (the LRU on the device): a layer with slots reads its misses (the
    cost model's miss bytes after static set and cache) into them at the zero-copy rate, then the kernel runs."""
    p = tiny.replace(profile=with_zero_copy(tiny.profile, 0.9))
    place = dataclasses.replace(in_place_placement(p, (3, 0, 1)), cache=(2, 0, 3))
    cm = CostModel(p)
    assert cm.in_place(place)
    warm = cm._misses(place)["warm_bytes"]
    want, layers = by_hand(p, place, p.profile.gpu.zero_copy.at, warm)
    assert 1.0 / cm.predict(place).decode_tok_s == pytest.approx(want, rel=1e-12)


def test_a_split_over_two_gpus_takes_the_copy_path():
    """A second GPU (the engine runs one): copies after a round trip per MoE layer, so a zero_copy curve changes
    nothing there, and the round trip does."""
    p = tiny_problem(profile="rtx-pro-6000").replace(profile=load_profile("rtx-pro-6000-x2"),
                                                     budget=Budget(2 * 10**13, 10**13, 10**13, 0, (10**13, 10**13)))
    place = dataclasses.replace(in_place_placement(p), gpu_split=(1,))
    cm = CostModel(p)
    assert not cm.in_place(place)
    pred = cm.predict(place)
    assert CostModel(p.replace(profile=with_zero_copy(p.profile, 0.5))).predict(place) == pred
    rt = p.profile.calibration.round_trip.value * 1e-6
    assert pred.decode_seconds["round_trip"] == pytest.approx(p.spec.n_moe_layers * rt, rel=1e-12)


def test_zero_copy_rate_is_the_curve_else_pinned_h2d(tiny):
    place = in_place_placement(tiny)
    plain = CostModel(tiny)
    for size in (4096.0, 3e6, 2.5e7, 4e8):
        assert plain.zero_copy(size) == plain.h2d(size)                 # no curve: pinned H2D (an estimate)
    slow = CostModel(tiny.replace(profile=with_zero_copy(tiny.profile, 0.5)))
    assert slow.zero_copy(2.5e7) == pytest.approx(0.5 * plain.h2d(2.5e7), rel=1e-12)
    assert slow.predict(place).decode_tok_s < plain.predict(place).decode_tok_s
    same = CostModel(tiny.replace(profile=with_zero_copy(tiny.profile, 1.0)))
    assert same.predict(place) == plain.predict(place)                # a curve equal to H2D: the fallback's figures


def test_fully_resident_runs_without_round_trips(tiny):
    """Every expert static: nothing to read from RAM, and the device loop has no round trip to pay: the token is
    the same whatever the round trip, and so is the hand calculation's (no RAM bytes)."""
    from strata_plan.profiles.schema import Figure
    E, L = tiny.curves.n_experts, tiny.curves.n_layers
    place = in_place_placement(tiny, (E,) * L)
    slow = dataclasses.replace(tiny.profile, calibration=dataclasses.replace(
        tiny.profile.calibration, moe_round_trip_us=Figure(5000.0, "estimate", "test")))
    dev, late = CostModel(tiny).predict(place), CostModel(tiny.replace(profile=slow)).predict(place)
    assert dev.decode_tok_s == late.decode_tok_s and dev.decode_seconds["round_trip"] == 0.0
    assert 1 / dev.decode_tok_s == pytest.approx(by_hand(tiny, place, tiny.profile.gpu.h2d_pinned.at)[0], rel=1e-12)


@pytest.mark.parametrize("name", ["plan-kimi5-h200-ramrich.yaml", "plan-kimi5-h200-seed.yaml",
                                  "plan-kimi-k3.1-pro-5moe-h200.yaml"])
def test_every_one_gpu_plan_is_read_in_place_and_predict_plan_is_the_cost_model(name):
    """The engine runs every one-GPU plan in its device loop: the cost model prices each mode of each plan (cache
    slots, lookahead, an NVMe tier) in place, and `predict_plan` is the cost model on the mode's placement."""
    from strata_plan.core.modes import MODES
    path = Path(__file__).resolve().parent / "data" / name
    plan = load_plan(path)
    prob = plan_problem(plan, "h200", str(path))
    cm = CostModel(prob)
    for mode in MODES:
        place = placement_of(baseline(plan, mode))
        assert cm.in_place(place), mode
        assert predict_plan(plan, None, mode, problem=prob) == cm.predict(place), mode


def test_an_nvme_tier_in_the_device_loop_reads_staged_experts_in_place(tiny):
    """NVMe experts in the device loop: staged in pinned RAM by the stager, then read in place like RAM experts. A
    staging cache that holds every NVMe expert the routing reaches reads nothing from the drive after warm-up: the
    token is the in-place model's with the NVMe bytes among the warm ones (by hand). The least staging cache the
    engine takes reads from the drive and waits for it, so it is slower; with lookahead part of the wait hides."""
    E = tiny.curves.n_experts
    p = tiny.replace(profile=with_zero_copy(tiny.profile, 0.9))
    place = dataclasses.replace(in_place_placement(p), ram=(E - 5, E - 4, E - 3))
    cm = CostModel(p)
    big = dataclasses.replace(place, staging=10 ** 6)
    assert cm.in_place(place) and cm.in_place(dataclasses.replace(place, prefetch_depth=1))
    x = cm._misses(big)
    pb = cm.predict(big)
    assert pb.bytes_per_token["nvme_read"] == 0.0 and pb.bytes_per_token["nvme"] > 0
    want, _ = by_hand(p, big, p.profile.gpu.zero_copy.at, x["warm_bytes"] + x["cold_bytes"])
    assert 1.0 / pb.decode_tok_s == pytest.approx(want, rel=1e-12)
    small = cm.predict(place)
    assert 0 < small.bytes_per_token["nvme_read"] <= small.bytes_per_token["nvme"]
    assert small.decode_tok_s < pb.decode_tok_s and small.decode_seconds["nvme"] > 0
    ahead = cm.predict(dataclasses.replace(place, prefetch_depth=1))
    assert ahead.bytes_per_token["wasted"] > 0
    # the drive reads the wrong guesses too, as the engine's measured nvme_read counts them (part of `wasted`)
    b = ahead.bytes_per_token
    assert 0 < b["nvme_wasted"] <= b["wasted"] and 0 < b["nvme_read"] - b["nvme_wasted"] <= b["nvme"]


def test_the_device_loops_lookahead_reads_landed_guesses_from_vram_and_never_waits(tiny):
    """Lookahead in the device loop: the share R of a layer's RAM misses is copied into VRAM slots from when layer
    j-d ends; landed in time, the layer reads only the rest in place (faster than depth 0 where the link binds the
    layer); a copy slower than the window is read in place for its late part, never waited for, and moves no more
    (the copy skips what its layer took): its wrong guesses cost only the little it copied."""
    p = tiny.replace(profile=with_zero_copy(tiny.profile, 0.9))
    base = in_place_placement(p, (1, 1, 1))
    cm = CostModel(p)
    d0, d1 = cm.predict(base), cm.predict(dataclasses.replace(base, prefetch_depth=1))
    assert cm.in_place(dataclasses.replace(base, prefetch_depth=1))
    assert d1.bytes_per_token["wasted"] > 0 and d1.bytes_per_token["pcie"] > d0.bytes_per_token["pcie"]
    assert 1 / d1.decode_tok_s <= 1 / d0.decode_tok_s + d1.decode_seconds["pcie_link"]
    slow = CostModel(p.replace(profile=with_zero_copy(tiny.profile, 0.01)))     # copies that never land in time
    s0, s1 = slow.predict(base), slow.predict(dataclasses.replace(base, prefetch_depth=1))
    assert 1 / s1.decode_tok_s == pytest.approx(1 / s0.decode_tok_s, rel=1e-3)   # the late part read in place
    assert s1.bytes_per_token["wasted"] < 0.05 * d1.bytes_per_token["wasted"]


def test_the_device_loops_lookahead_costs_its_slot_kernels_and_its_main_stream_gates(tiny):
    """The lookahead's slot kernels cost each MoE layer the profile's `lookahead_layer_us` (one release more at the
    token's end at the launch floor, `graph_launch_us`); without an NVMe tier the gate runs on the side stream (no
    charge), with one the gates of every depth run on the main stream: at depth 2 on three MoE layers 2 + 1 gates,
    their launches at the floor and their router bytes over HBM. A replayed routing runs no gate."""
    from strata_plan.core.lookahead import GATE_LAUNCHES
    from strata_plan.profiles.schema import Figure
    g = tiny.profile.gpu
    spec, E = tiny.spec, tiny.curves.n_experts
    gate_s = 2.0 * spec.hidden * spec.n_routed / (g.hbm_gbps.value * 1e9 * tiny.profile.calibration.hbm_efficiency.value)
    for us, slots in ((2.0, 5.0), (8.0, 11.0)):
        gpu = dataclasses.replace(g, graph_launch_us=Figure(us, "measured", "test", "2026-12-05"),
                                  lookahead_layer_us=Figure(slots, "measured", "test", "2026-12-05"))
        p = tiny.replace(profile=dataclasses.replace(tiny.profile, gpus=(gpu,)))
        cm = CostModel(p)
        base = in_place_placement(p, (1, 1, 1))
        assert cm.predict(base).decode_seconds["lookahead_gpu"] == 0.0
        got = cm.predict(dataclasses.replace(base, prefetch_depth=1)).decode_seconds["lookahead_gpu"]
        assert got == pytest.approx((3 * slots + us) * 1e-6, rel=1e-12)
        nvme = Placement((1, 1, 1), (3, 3, 3), (0, 0, 0), (True,) * len(p.dense_units), 2)      # ranks 4.. on NVMe
        assert E > 4 and cm.in_place(nvme)
        got = cm.predict(nvme).decode_seconds["lookahead_gpu"]
        assert got == pytest.approx((3 * slots + (3 * GATE_LAUNCHES + 1) * us) * 1e-6 + 3 * gate_s, rel=1e-12)
        replayed = CostModel(p.replace(lookahead_gates=False))          # the replay hands the guesses over: no gate
        got = replayed.predict(nvme).decode_seconds["lookahead_gpu"]
        assert got == pytest.approx((3 * slots + us) * 1e-6, rel=1e-12)


def test_each_moe_layer_costs_its_residency_kernels(tiny):
    """The device loop's residency kernels on each MoE layer's main stream: the device LRU's step and fill (the
    profile's `cache_layer_us`) in every layer where the plan has cache slots (the store's one LRU steps them all),
    else the use count (one launch at `graph_launch_us`); the same at any lookahead depth (resolve's part is
    `lookahead_layer_us`); with an NVMe tier the stager's handshake on top (`stage_layer_us`) in every layer."""
    from strata_plan.profiles.schema import Figure
    g = tiny.profile.gpu
    for us, lru_us, stage_us in ((2.0, 5.0, 3.0), (1.0, 9.0, 11.0)):
        gpu = dataclasses.replace(g, graph_launch_us=Figure(us, "measured", "test", "2026-12-06"),
                                  cache_layer_us=Figure(lru_us, "measured", "test", "2026-12-06"),
                                  stage_layer_us=Figure(stage_us, "measured", "test", "2026-12-06"))
        p = tiny.replace(profile=dataclasses.replace(tiny.profile, gpus=(gpu,)))
        cm = CostModel(p)
        base = dataclasses.replace(in_place_placement(p, (3, 0, 1)), cache=(2, 0, 3))
        for place in (base, dataclasses.replace(base, prefetch_depth=1)):
            got = cm.predict(place).decode_seconds["residency_gpu"]
            assert got == pytest.approx(3 * lru_us * 1e-6, rel=1e-12)
        none = dataclasses.replace(base, cache=(0, 0, 0))
        assert cm.predict(none).decode_seconds["residency_gpu"] == pytest.approx(3 * us * 1e-6, rel=1e-12)
        E = p.curves.n_experts                     # ranks 4.. on NVMe: the handshake in every layer, slots or not
        for cache, each in (((2, 0, 3), lru_us), ((0, 0, 0), us)):
            nvme = dataclasses.replace(base, vram=(1, 1, 1), ram=(3, 3, 3), cache=cache)
            assert E > 4 and cm._staged(nvme) and not cm._staged(base)
            got = cm.predict(nvme).decode_seconds["residency_gpu"]
            assert got == pytest.approx(3 * (each + stage_us) * 1e-6, rel=1e-12)
        assert 1 / cm.predict(base).decode_tok_s > 1 / CostModel(tiny.replace(profile=dataclasses.replace(
            tiny.profile, gpus=(dataclasses.replace(gpu, cache_layer_us=Figure(0.0, "measured", "t", "2026-12-06")),)))
        ).predict(base).decode_tok_s


def test_the_link_is_shared_evenly_by_a_read_and_the_queued_copies():
    """`LinkCopies`: a copy alone runs at the link's rate; beside a read the two share it evenly until one is done;
    the link never idles while work is queued (a read and copies end when all their seconds are spent)."""
    from strata_plan.planner.cost import LinkCopies
    c = LinkCopies()
    c.add(0.0, 1, 2.0)                        # layer 1's copy: 2 s alone on the link, issued at 0
    c.add(0.0, 2, 1.0)                        # layer 2's behind it
    c.run(1.0)
    assert c.left(1) == pytest.approx(1.0) and c.left(2) == pytest.approx(1.0)
    assert c.beside(1.0, 0.5) == pytest.approx(1.0)      # the read shares with 2 s of copies: twice as long
    assert c.left(1) == pytest.approx(0.5)               # ... and the copies got half the link meanwhile
    assert c.drained(2.0) == pytest.approx(3.5)          # 2 + 1 + 0.5 s of work since 0: no idle link
    c.run(4.0)
    assert c.landed[1] == pytest.approx(2.5) and c.landed[2] == pytest.approx(3.5)
    assert c.beside(5.0, 0.25) == 0.25                   # alone on the link: its own time
    c.add(6.0, 3, 1.0, start=6.5)                        # its side stream's kernels first: it starts at 6.5
    c.run(7.0)
    assert c.left(3) == pytest.approx(0.5) and c.drained(7.0) == pytest.approx(7.5)


def test_lookahead_copies_gain_only_the_links_idle_time(tiny):
    """The device loop's lookahead copies share the PCIe link with the layers' in-place reads (the H200 measured
    kimi5's depth-2 plan 13.2 ms a token against LRU-only's 11.6 with none of its guesses late: every copied byte
    took link time). The token is never shorter than LRU-only's less the link's idle time (the non-MoE seconds) nor
    than the link's busy time, wrong guesses included."""
    p = tiny.replace(profile=with_zero_copy(tiny.profile, 0.9))
    base = in_place_placement(p, (1, 1, 1))
    cm = CostModel(p)
    d0, d1 = cm.predict(base), cm.predict(dataclasses.replace(base, prefetch_depth=1))
    idle = cm.non_moe_seconds(base) + sum(cm.layer_overheads)
    assert d1.bytes_per_token["wasted"] > 0
    assert 1 / d1.decode_tok_s >= 1 / d0.decode_tok_s - idle
    assert d1.decode_seconds["pcie_link"] <= 1 / d1.decode_tok_s


def test_only_whole_experts_land_and_the_one_still_copying_is_read_in_place_in_full():
    """The guesses are copied one after another, best first; as layer j runs, those landed whole are read from VRAM,
    the one still copying is read in place in full (its copied bytes wasted) and the rest are skipped (the engine's
    `resolve` takes them): 4 experts of 100 bytes, 1 s each alone on the link; a layer without a cache."""
    import numpy as np
    inplace = {"copy": np.array([4.0]), "copy_bytes": np.array([400.0]), "expert": np.array([100.0]),
               "partial": np.array([False])}
    assert CostModel._landed(inplace, 0, 0.0) == (1.0, 1.0)          # every copy landed
    assert CostModel._landed(inplace, 0, 4.0) == (0.0, 0.0)          # none started
    moved, landed = CostModel._landed(inplace, 0, 1.5)              # 2.5 experts moved, 2 of them whole
    assert moved == pytest.approx(0.625) and landed == pytest.approx(0.5)
    moved, landed = CostModel._landed(inplace, 0, 3.5)              # half of the first: nothing lands
    assert moved == pytest.approx(0.125) and landed == 0.0
    from strata_plan.planner.cost import RAGGED_BYTES
    mb = 1e6
    inplace = {"copy": np.array([4.0]), "copy_bytes": np.array([400 * mb]), "expert": np.array([100 * mb]),
               "partial": np.array([True])}                        # a layer with a device LRU: its fill reads the
    moved, landed = CostModel._landed(inplace, 0, 3.5)              # landed part of the guess still copying: the
    assert landed == pytest.approx((50 * mb - RAGGED_BYTES) / (400 * mb))   # bytes moved but those past its prefix
    assert CostModel._landed(inplace, 0, 4.0 - 1e-7)[1] == 0.0       # a few bytes: none past the prefix yet
    assert CostModel._landed(inplace, 0, 0.0) == (1.0, 1.0)


def test_partial_landing_is_predicted_where_a_layer_has_a_cache_and_pays(tiny, monkeypatch):
    """The walk lands guesses in part only in layers with cache slots; with the copies cut short by the layers, a
    cached layer's lookahead predicts at least as fast as the same plan would with whole landing alone."""
    p = tiny.replace(profile=with_zero_copy(tiny.profile, 0.9))
    E = p.curves.n_experts
    place = Placement((1, 1, 1), (E - 1,) * 3, (0, 2, 0), (True,) * len(p.dense_units), 1)
    seen = {}
    real = CostModel._landed

    def spy(inplace, j, left):
        seen["partial"] = inplace["partial"].copy()
        return real(inplace, j, left)
    monkeypatch.setattr(CostModel, "_landed", staticmethod(spy))
    got = CostModel(p).predict(place)
    assert seen["partial"].tolist() == [False, True, False]

    def whole(inplace, j, left):
        inplace["partial"][:] = False
        return real(inplace, j, left)
    monkeypatch.setattr(CostModel, "_landed", staticmethod(whole))
    assert got.decode_tok_s >= CostModel(p).predict(place).decode_tok_s


def with_stager(profile, wake_us: float, read_us: float, publish_us: float = 0.0):
    """The profile with the stager's host constants set (calibration)."""
    from strata_plan.profiles.schema import Figure
    fig = lambda v: Figure(v, "measured", "test", "2026-12-05")    # noqa: E731
    cal = dataclasses.replace(profile.calibration, stager_wake_us=fig(wake_us), stager_read_us=fig(read_us),
                              stager_publish_us=fig(publish_us))
    return dataclasses.replace(profile, calibration=cal)


def test_the_stager_starts_a_batchs_reads_one_after_another(tiny):
    """S(n) = wake + max(T(n), (n - 1) read + T(1)) + publish for n >= 1 reads, n (wake + T(1) + publish) below one
    (a read with probability n), the drive's T alone for its busy time; nothing for no read."""
    p = tiny.replace(profile=with_stager(tiny.profile, 100.0, 70.0))
    cm = CostModel(p)
    F = len(p.mix.formats)
    counts = np.zeros((F, 4))
    counts[0] = (0.0, 0.5, 1.0, 4.0)
    got, drive = cm.staged_batch_seconds(counts)
    T = cm._cold_batch(counts)
    one = cm._cold_batch(np.where(counts > 0, counts / np.maximum(counts.sum(axis=0), 1e-30), 0.0))
    assert list(drive) == list(T)
    assert got[0] == 0.0
    assert got[1] == pytest.approx(0.5 * 100e-6 + T[1])
    assert got[2] == pytest.approx(100e-6 + T[2])
    assert got[3] == pytest.approx(100e-6 + max(T[3], 3 * 70e-6 + one[3]))
    slow = CostModel(p.replace(profile=with_stager(tiny.profile, 100.0, 10_000.0))).staged_batch_seconds(counts)[0]
    assert slow[3] == pytest.approx(100e-6 + 3 * 10e-3 + one[3])        # the host, not the drive, sets the pace
    pub, drive_pub = CostModel(p.replace(profile=with_stager(tiny.profile, 100.0, 70.0, 40.0))).staged_batch_seconds(
        counts)
    assert list(drive_pub) == list(T) and pub[0] == 0.0                  # published: the drive's time is the same
    assert pub[1] == pytest.approx(0.5 * 140e-6 + T[1]) and pub[3] == pytest.approx(got[3] + 40e-6)


def test_demand_reads_share_the_drive_with_the_lookaheads_reads_in_flight(tiny, monkeypatch):
    """A layer's demand reads land after the drive read them beside the lookahead's reads still on it: its times are
    T(n + m) and T(1 + m) (the stager's host starts only the n); the reads still on it at a layer's router are the
    batches for layers j .. j+d-1 issued when layer jj-d ended, each the part of it not yet landed. The drive's
    busy time is the same; the token is slower than with the drive to the demand reads alone (the guesses taken at
    the layer's end: at the router they go behind its demand reads, the next test)."""
    p = tiny.replace(profile=with_stager(tiny.profile, 100.0, 70.0), lookahead_point="output")
    cm = CostModel(p)
    F = len(p.mix.formats)
    counts, beside = np.zeros((F, 1)), np.zeros((F, 1))
    counts[0], beside[0] = 2.0, 3.0
    got, drive = cm.staged_batch_seconds(counts, beside)
    T, one = cm._cold_batch(counts + beside), cm._cold_batch(counts / 2.0 + beside)
    assert drive[0] == pytest.approx(T[0]) and T[0] > cm._cold_batch(counts)[0]
    assert got[0] == pytest.approx(100e-6 + max(T[0], 70e-6 + one[0]))
    pre = np.zeros((F, 4))
    pre[0] = (1.0, 2.0, 4.0, 8.0)
    # at layer 2's router (t = 3), depth 2: layer 2's batch submitted when layer 0 ended (t = 1, landed at 3: none
    # left), layer 3's when layer 1 ended (t = 2, lands at 4: half of it left)
    spans = {2: (1.0, 3.0), 3: (2.0, 4.0)}
    out = cm._reads_in_flight(pre, spans, 2, 2, 3.0)
    assert out[0] == pytest.approx(0.5 * 8.0) and not out[1:].any()
    # at layer 1's router (t = 2): layer 2's batch (t = 1 to 3, half of it on the drive); layer 3's is not
    # submitted yet (at the router it goes behind layer 1's demand reads, which it does not delay)
    assert cm._reads_in_flight(pre, {2: (1.0, 3.0)}, 1, 2, 2.0)[0] == pytest.approx(0.5 * 4.0)
    E = tiny.curves.n_experts
    place = Placement((1, 1, 1), (3, 3, 3), (0, 0, 0), (True,) * len(p.dense_units), 2)       # ranks 4.. on NVMe
    assert E > 4 and cm.in_place(place)
    with_m = cm.predict(place)
    monkeypatch.setattr(CostModel, "_reads_in_flight", staticmethod(lambda *a, **k: np.zeros(F)))   # the demand reads alone
    without = CostModel(p).predict(place)
    assert with_m.decode_seconds["nvme"] > without.decode_seconds["nvme"] and with_m.decode_tok_s < without.decode_tok_s
    assert with_m.decode_seconds["nvme_link"] == pytest.approx(without.decode_seconds["nvme_link"])


def test_guesses_taken_at_the_router_queue_behind_the_layers_demand_reads(tiny, monkeypatch):
    """The drive serves reads in the order the stager submits them. Taken at layer j's router, the guesses for
    layer j+1 go behind j's demand reads: j's demand batch is priced with only the batches submitted before it
    (not j+1's), and those guesses land with the whole queue, later than alone (at the layer's end)."""
    p = tiny.replace(profile=with_stager(tiny.profile, 100.0, 70.0))
    place = Placement((1, 1, 1), (3, 3, 3), (0, 0, 0), (True,) * len(p.dense_units), 1)     # ranks 4.. on NVMe
    seen = {}
    real = CostModel._reads_in_flight
    for point in ("output", "attention"):
        got = seen[point] = []
        monkeypatch.setattr(CostModel, "_reads_in_flight", staticmethod(
            lambda pre, spans, j, depth, t: got.append((j, dict(spans))) or real(pre, spans, j, depth, t)))
        CostModel(p.replace(lookahead_point=point)).predict(place)
        monkeypatch.undo()
    for point, calls in seen.items():
        assert [j for j, _ in calls] == [0, 1, 2]
        for j, spans in calls:             # at layer j's request: submitted so far, the guesses for layers .. j
            assert max(spans, default=j) <= j and (j == 0 or j in spans), (point, j, spans)
    end, router = seen["output"][2][1], seen["attention"][2][1]
    for jj in (1, 2):                      # the guesses for layer jj: alone at the layer's end, behind the demand at
        assert router[jj][1] - router[jj][0] > end[jj][1] - end[jj][0] > 0      # the router


def test_the_stagers_host_time_slows_a_token_but_not_the_drives_busy_time(tiny):
    E = tiny.curves.n_experts
    place = dataclasses.replace(in_place_placement(tiny), ram=(E - 5, E - 4, E - 3))
    fast = CostModel(tiny.replace(profile=with_stager(tiny.profile, 0.0, 0.0))).predict(place)
    slow = CostModel(tiny.replace(profile=with_stager(tiny.profile, 200.0, 150.0))).predict(place)
    assert slow.decode_seconds["nvme"] > fast.decode_seconds["nvme"] and slow.decode_tok_s < fast.decode_tok_s
    assert slow.decode_seconds["nvme_link"] == pytest.approx(fast.decode_seconds["nvme_link"])


def test_nvme_guesses_taken_at_the_router_are_priced_apart_only_with_an_nvme_tier():
    """`Problem.lookahead_point="attention"` (the engine's A/B): the NVMe lookahead's batch for layer j+d leaves with
    layer j's request, beside its demand batch on the drive, instead of when layer j ends. The kimi5 seed plan at
    depth 2 is priced apart; the RAM-rich plan (no NVMe tier: its lookahead copies RAM experts) the same."""
    data = Path(__file__).resolve().parent / "data"
    got = {}
    for name in ("plan-kimi5-h200-seed-depth2.yaml", "plan-kimi5-h200-ramrich.yaml"):
        plan = load_plan(data / name)
        prob = plan_problem(plan, "h200", str(data / name))
        got[name] = [predict_plan(plan, None, "plan", problem=prob.replace(lookahead_point=point)).decode_tok_s
                     for point in ("output", "attention")]
    seed, ramrich = got["plan-kimi5-h200-seed-depth2.yaml"], got["plan-kimi5-h200-ramrich.yaml"]
    assert seed[0] != pytest.approx(seed[1], rel=1e-6) and ramrich[0] == ramrich[1]
