"""Several GPUs in one host: the pipeline split in the cost model, held to hand calculations; host-link
contention (x8/x8 on one root complex against two x16 links); peer-to-peer present or absent; a one-GPU
placement predicts on a two-GPU machine exactly what it predicts on one GPU."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from strata_plan.planner.capacity import Budget
from strata_plan.planner.cost import CostModel
from strata_plan.planner.placement import Placement, footprint, placement_of, split_points
from strata_plan.planner.testing import tiny_problem
from strata_plan.profiles.schema import Figure, PeerLink, load_profile

BIG = 10**15


def two_gpu(profile, problem=None):
    """The tiny problem on `profile` (a profile object or name), budgets roomy, planned over both GPUs."""
    p = problem or tiny_problem(profile="rtx-pro-6000")
    prof = load_profile(profile) if isinstance(profile, str) else profile
    return p.replace(profile=prof, budget=Budget(2 * BIG, BIG, BIG, 0, (BIG, BIG)))


def placement(p, where: str, split=(1,)):
    """Every expert in VRAM (`vram`) or pinned RAM (`ram`), every dense unit resident, no lookahead."""
    E, L = p.curves.n_experts, p.curves.n_layers
    full, none = (E,) * L, (0,) * L
    v, r = (full, none) if where == "vram" else (none, full)
    return Placement(v, r, none, (True,) * len(p.dense_units), 0, split)


def test_split_points():
    assert split_points(93, 1, 0.5) == () and split_points(93, 2, None) == ()
    assert split_points(93, 2, 0.5) == (46,) and split_points(93, 2, 1.0) == () and split_points(93, 2, 0.0) == ()
    assert split_points(10, 3, 0.4) == (4, 7)


def test_unit_gpus_put_the_head_with_the_last_layer():
    pl = Placement((0,), (0,), (0,), (True,) * 4, 0, (2,))
    assert pl.unit_gpus().tolist() == [0, 0, 1, 1] and pl.moe_gpus([0, 2]).tolist() == [0, 1]
    assert Placement((0,), (0,), (0,), (True,) * 4, 0).unit_gpus().tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("name", ["rtx-pro-6000-x2", "h100-nvl-x2", "rtx-4090-x2"])
def test_resident_split_is_one_gpu_plus_the_hop(name):
    """Fully resident, identical GPUs: the split token takes the one-GPU token plus one crossing of the hidden
    state (2 x hidden BF16 bytes): over the peer link (latency + bytes / rate), or without one through host
    memory (two latencies, bytes over D2H then H2D at their plateaus); and, the split taking the copy path, a
    round trip at every MoE layer (the one-GPU token reads in place, without; it counts its routed ids on the device
    instead, `residency_gpu`). Prefill pays the round trips in both."""
    p2 = two_gpu(name)
    prof = p2.profile
    one = CostModel(p2).predict(placement(p2, "vram", ()))
    two = CostModel(p2).predict(placement(p2, "vram", (1,)))
    rts = p2.spec.n_moe_layers * prof.calibration.round_trip.value * 1e-6
    nbytes = 2 * p2.spec.hidden
    peer = prof.peer
    if peer.kind == "none":
        g = prof.gpus[0]
        hop = (2 * 10e-6 + nbytes / (max(v for _, v in g.d2h_pinned.points) * 1e9)
               + nbytes / (max(v for _, v in g.h2d_pinned.points) * 1e9))
    else:
        hop = peer.latency.value * 1e-6 + nbytes / (peer.gbps.value * 1e9)
    use = one.decode_seconds["residency_gpu"]
    assert use == pytest.approx(p2.spec.n_moe_layers * CostModel(p2).launch, rel=1e-12)
    assert 1 / two.decode_tok_s == pytest.approx(1 / one.decode_tok_s - use + hop + rts, rel=1e-12)
    assert two.decode_seconds["peer"] == pytest.approx(hop, rel=1e-12)
    assert two.decode_seconds["round_trip"] == pytest.approx(rts, rel=1e-12) and one.decode_seconds["round_trip"] == 0
    assert two.bytes_per_token["peer"] == nbytes
    C = p2.prefill_chunk
    chunk_hop = (CostModel(p2).hop_seconds(C * nbytes, 0, 1))
    assert C / two.prefill_tok_s == pytest.approx(C / one.prefill_tok_s + chunk_hop, rel=1e-12)


def test_peer_link_present_or_absent():
    """The same split placement with PCIe P2P and with none: the token differs by exactly the two hops."""
    p = two_gpu("rtx-pro-6000-x2")
    none = dataclasses.replace(p.profile, topology=dataclasses.replace(p.profile.topology, peer=PeerLink("none")))
    pn = p.replace(profile=none)
    pl = placement(p, "vram")
    t_p2p = 1 / CostModel(p).predict(pl).decode_tok_s
    t_host = 1 / CostModel(pn).predict(pl).decode_tok_s
    nbytes = 2 * p.spec.hidden
    g = p.profile.gpus[0]
    via_host = 2 * 10e-6 + nbytes / (max(v for _, v in g.d2h_pinned.points) * 1e9) + nbytes / (
        max(v for _, v in g.h2d_pinned.points) * 1e9)
    via_peer = 10e-6 + nbytes / 45e9
    assert t_host - t_p2p == pytest.approx(via_host - via_peer, rel=1e-9)
    assert t_host > t_p2p


def test_each_gpu_streams_its_own_layers_misses():
    """Every expert in pinned RAM, no lookahead: each MoE layer stalls for its k misses over its own GPU's
    link; with the x8 curve on one GPU and the x16 curve on the other, each layer pays its own link's rate."""
    p = two_gpu("rtx-4090-x2")
    x8, x16 = p.profile.gpus[0], load_profile("rtx-4090").gpu
    mixed = dataclasses.replace(p.profile, gpus=(x8, dataclasses.replace(x8, h2d_pinned=x16.h2d_pinned)))
    pm = p.replace(profile=mixed)
    k, L = p.spec.top_k, p.curves.n_layers
    split = (p.spec.moe_layers[1],)             # MoE layer 0 on GPU 0, layers 1.. on GPU 1

    def stall(gpu, l):
        return k * float(np.dot(p.curves.pop[l], [b / (gpu.h2d_pinned.at(b) * 1e9) for b in p.rank_bytes]))
    cm = CostModel(pm)
    t_ram = 1 / cm.predict(placement(pm, "ram", split)).decode_tok_s
    t_vram = 1 / cm.predict(placement(pm, "vram", split)).decode_tok_s
    hand = stall(x8, 0) + sum(stall(x16, l) for l in range(1, L))
    assert t_ram - t_vram == pytest.approx(hand, rel=1e-9)


def _ram_pred(profile, budget_gpus=True):
    p = two_gpu(profile)
    return p, CostModel(p).predict(placement(p, "ram", (p.spec.moe_layers[1],)))


def test_shared_x8_links_against_two_x16_links():
    """x8/x8 on one root complex (the shipped 2x RTX 4090) against the same GPUs on two x16 links with their
    own root complexes: the x16 pair is faster; the host side of the shared pair is busy for every PCIe byte
    of the token over the concurrent H2D (23.9 GB/s), the x16 pair's over twice the x16 plateau."""
    x8 = load_profile("rtx-4090-x2")
    g16 = load_profile("rtx-4090").gpu
    topo16 = dataclasses.replace(x8.topology, host_links=dataclasses.replace(
        x8.topology.host_links, shared_root_complex=False, concurrent_h2d_gbps=Figure(47.8, "estimate", "2 x 23.9")))
    x16 = dataclasses.replace(x8, gpus=(dataclasses.replace(x8.gpus[0], h2d_pinned=g16.h2d_pinned,
                                                            d2h_pinned=g16.d2h_pinned, pcie_width=g16.pcie_width),) * 2,
                              topology=topo16)
    p8, pred8 = _ram_pred(x8)
    p16, pred16 = _ram_pred(x16)
    assert pred16.decode_tok_s > pred8.decode_tok_s
    # without a peer link (a 4090 has none) the hidden state's H2D half crosses PCIe too
    assert pred8.decode_seconds["host_link"] == pytest.approx(
        (pred8.bytes_per_token["pcie"] + pred8.bytes_per_token["peer"]) / 23.9e9, rel=1e-9)
    assert pred16.decode_seconds["host_link"] == pytest.approx(
        (pred16.bytes_per_token["pcie"] + pred16.bytes_per_token["peer"]) / 47.8e9, rel=1e-9)


def test_a_choked_host_side_binds_the_token():
    """Concurrent H2D far below each GPU's own link: the token is the host side's busy time, binding pcie."""
    p = two_gpu("rtx-pro-6000-x2")
    topo = p.profile.topology
    slow = dataclasses.replace(p.profile, topology=dataclasses.replace(topo, host_links=dataclasses.replace(
        topo.host_links, concurrent_h2d_gbps=Figure(0.5, "estimate", "test"))))
    ps = p.replace(profile=slow)
    pred = CostModel(ps).predict(placement(ps, "ram", (ps.spec.moe_layers[1],)))
    assert 1 / pred.decode_tok_s == pytest.approx(pred.bytes_per_token["pcie"] / 0.5e9, rel=1e-9)
    assert pred.decode_binding == "pcie"


@pytest.mark.parametrize("name", ["rtx-pro-6000-x2", "rtx-4090-x2"])
def test_one_gpu_placement_on_two_gpus_is_the_one_gpu_prediction(name):
    """Everything on the first GPU (no split) predicts on the two-GPU machine exactly what the machine's first
    GPU alone predicts: a second GPU can only add options."""
    p2 = two_gpu(name)
    p1 = p2.replace(profile=p2.profile.first_gpus(1), budget=Budget(BIG, BIG, BIG, 0))
    for where in ("vram", "ram"):
        a = CostModel(p1).predict(placement(p1, where, ()))
        b = CostModel(p2).predict(placement(p2, where, ()))
        assert a == b


def test_footprint_per_gpu():
    """Each GPU used holds the reserve, a workspace, its staging, its layers' KV cache and weights."""
    p = two_gpu("rtx-pro-6000-x2").replace(budget=Budget(2 * BIG, BIG, BIG, 10**9, (BIG, BIG)))
    split = (p.spec.moe_layers[1],)
    fp = footprint(p, placement(p, "vram", split))
    one = footprint(p, placement(p, "vram", ()))
    assert len(fp.per_gpu_vram) == 2 and sum(fp.per_gpu_vram) == fp.vram
    assert fp.vram == one.vram + fp.reserve // 2 + fp.workspace // 2 + fp.staging // 2     # one more of each
    assert fp.kv_cache == one.kv_cache and fp.static_experts == one.static_experts
    small = dataclasses.replace(p.budget, gpus=(fp.per_gpu_vram[0], fp.per_gpu_vram[1] - 1))
    assert fp.overflow(small)[0] == 1


def _random_split_placements(p, n, seed=0):
    rng = np.random.default_rng(seed)
    E, L = p.curves.n_experts, p.curves.n_layers
    out = []
    for _ in range(n):
        v = rng.integers(0, E + 1, L)
        r = np.array([rng.integers(0, E - x + 1) for x in v])
        c = np.array([rng.integers(0, E - x + 1) for x in v])
        res = tuple(bool(x) for x in rng.integers(0, 2, len(p.dense_units)))
        split = (int(rng.integers(1, p.spec.n_layers + 1)),)
        out.append(Placement(tuple(map(int, v)), tuple(map(int, r)), tuple(map(int, c)), res,
                             int(rng.integers(0, p.curves.max_depth + 1)), split))
    return out


@pytest.mark.parametrize("name", ["rtx-pro-6000-x2", "h100-nvl-x2", "rtx-4090-x2"])
def test_split_predictions_stay_within_the_split_bound(name):
    from strata_plan.planner.bound import check_within, physical_bound, ranked_bound
    p = two_gpu(name)
    cm = CostModel(p)
    for pl in _random_split_placements(p, 25):
        b = physical_bound(p, pl)
        check_within(cm.predict(pl), b, name)
        assert ranked_bound(p, pl) == pytest.approx((b.decode_tok_s, b.prefill_tok_s), rel=1e-9)


def test_split_bound_by_hand():
    """Fully resident over two GPUs with PCIe P2P: decode is bound by the GPUs' HBM times added (a token
    cannot overlap them), prefill by the slower GPU's (chunks can)."""
    from strata_plan.planner.bound import physical_bound
    p = two_gpu("rtx-pro-6000-x2")
    pl = placement(p, "vram")
    b = physical_bound(p, pl)
    spec, k = p.spec, p.spec.top_k
    hbm = p.profile.gpus[0].hbm_gbps.value * 1e9
    routed = sum(k * float(np.dot(p.curves.pop[l], p.rank_bytes)) for l in range(p.curves.n_layers))
    total = sum(p.dense_units) + spec.kv_cache_bytes(p.context) + routed
    assert b.decode_binding == "hbm" and 1 / b.decode_tok_s == pytest.approx(total / hbm, rel=1e-9)
    assert b.decode_bytes["hbm_gpu0"] + b.decode_bytes["hbm_gpu1"] == pytest.approx(total, rel=1e-12)
    assert b.decode_bytes["peer"] == 2 * spec.hidden


def test_machine_bound_of_two_gpus_is_at_least_one_gpus():
    from strata_plan.planner.bound import first_gpu_problem, machine_bound
    p = tiny_problem(profile="rtx-pro-6000", vram_experts=3.0, ram_experts=3.0)
    prof = load_profile("rtx-pro-6000-x2")
    b = p.budget
    p2 = p.replace(profile=prof, budget=Budget(2 * b.vram, b.ram, b.nvme, b.reserve, (b.vram, b.vram)))
    p1 = first_gpu_problem(p2)
    m1, m2 = machine_bound(p1), machine_bound(p2)
    assert m2.decode_tok_s >= m1.decode_tok_s * (1 - 1e-12) and m2.prefill_tok_s >= m1.prefill_tok_s * (1 - 1e-12)


# ---- search and the plan file ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def searched():
    """A two-GPU search (24 trials; half of them on the first GPU alone, as `plan` does) and the one-GPU
    search it starts from, run alone with the same trials and seed."""
    from strata_plan.planner.bound import first_gpu_problem
    from strata_plan.planner.search import search_ladder
    p = tiny_problem(profile="rtx-pro-6000", vram_experts=3.0, ram_experts=3.0)
    b = p.budget
    p2 = p.replace(profile=load_profile("rtx-4090-x2"), budget=Budget(2 * b.vram, b.ram, b.nvme, b.reserve,
                                                                      (b.vram, b.vram)))
    one = search_ladder(first_gpu_problem(p2), trials=12, seed=3)
    two = search_ladder(p2, trials=24, seed=3)
    return p2, one, two


def test_a_second_gpu_never_predicts_slower(searched):
    p2, one, two = searched
    assert two.best.prediction.decode_tok_s >= one.best.prediction.decode_tok_s * (1 - 1e-12)
    assert two.best.footprint.fits(p2.budget) and two.trials == 24


def test_two_gpu_plan_file_says_which_gpu_holds_what(searched, tmp_path):
    from strata_plan.planner.bound import machine_bound, physical_bound
    from strata_plan.core.plan import Sources, SourceRef, load_plan, save_plan
    from strata_plan.planner.build import build_plan
    p2, _, two = searched
    cost = CostModel(p2)
    src = Sources(SourceRef("tiny", "0" * 64), SourceRef(p2.profile.name, "0" * 64), SourceRef("trace", "0" * 64))
    plan = build_plan(p2, two, physical_bound(p2, two.best.placement), src, cost,
                      machine_bound(p2, extra=(two.best.placement,)))
    g = plan.gpus
    assert [x.index for x in g] == [0, 1] and g[0].first_layer == 0 and g[-1].end_layer == p2.spec.n_layers
    assert sum(x.lm_head for x in g) == 1 and all(x.vram_budget_bytes == b for x, b in zip(g, p2.budget.gpus))
    assert sum(sum(x.vram.values()) for x in g) == plan.memory.vram_total
    back = load_plan(save_plan(plan, tmp_path / "two.yaml"))
    assert back == plan and placement_of(back) == two.best.placement


def test_bad_gpus_section_is_one_line(searched, tmp_path):
    import yaml

    from strata_plan.errors import UserError
    from strata_plan.planner.bound import physical_bound
    from strata_plan.core.plan import Sources, SourceRef, load_plan
    from strata_plan.planner.build import build_plan
    from strata_plan.schema import to_data
    p2, _, two = searched
    src = Sources(SourceRef("tiny", "0" * 64), SourceRef(p2.profile.name, "0" * 64), SourceRef("trace", "0" * 64))
    data = to_data(build_plan(p2, two, physical_bound(p2, two.best.placement), src, CostModel(p2)))
    data["gpus"][1]["lm_head"] = not data["gpus"][1]["lm_head"]
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError) as e:
        load_plan(f)
    assert e.value.where == str(f) and "lm_head" in e.value.problem


@pytest.mark.parametrize("name", ["plan-kimi5-h200-seed.yaml", "plan-kimi-k3.1-pro-5moe-h200.yaml"])
def test_a_shipped_one_gpu_plan_is_unchanged(name, tmp_path):
    """A committed one-GPU plan loads and writes back the same YAML (no `gpus` section, nothing reordered)."""
    from pathlib import Path

    from strata_plan.core.plan import load_plan, save_plan
    from strata_plan.yamlio import read_yaml
    src = Path(__file__).resolve().parents[1] / "tests" / "data" / name
    plan = load_plan(src)
    assert plan.gpus is None and plan.gpu_split == () and placement_of(plan).gpu_split == ()
    out = save_plan(plan, tmp_path / name)
    a, b = read_yaml(src), read_yaml(out)
    assert a == b and list(a) == list(b)
    assert save_plan(load_plan(out), tmp_path / "again.yaml").read_bytes() == out.read_bytes()


def test_vram_budgets_per_gpu_on_the_command_line():
    from strata_plan.cli._common import gb_list
    from strata_plan.errors import UserError
    prof = load_profile("rtx-4090-x2")
    b = Budget.from_profile(prof, gb_list("20,22", "--vram-gb"))
    assert b.gpus == (20 * 10**9, 22 * 10**9) and b.vram == 42 * 10**9 and b.n_gpus == 2
    assert Budget.from_profile(prof, gpus=2).gpus == (24 * 10**9, 24 * 10**9)
    assert Budget.from_profile(prof).gpus == () and Budget.from_profile(prof, 20.0, gpus=2).gpus == (20 * 10**9,) * 2
    for bad, field in (("20,x", "--vram-gb"), ("20,20,20", "--vram-gb"), ("-1,20", "--vram-gb")):
        with pytest.raises(UserError) as e:
            Budget.from_profile(prof, gb_list(bad, "--vram-gb"))
        assert e.value.where == field
    with pytest.raises(UserError) as e:
        Budget.from_profile(load_profile("rtx-4090"), gpus=2)
    assert e.value.where == "--gpus"


def test_estimated_links_of_two_gpus_are_named():
    """what-if and compare-tables name the estimated inputs behind a binding: on two GPUs also the host side's
    concurrent H2D (pcie) and the peer link (peer); a one-GPU problem lists neither."""
    from strata_plan.planner.estimated import estimated_inputs
    p2 = two_gpu("rtx-4090-x2")
    names = {(e.link, e.name) for e in estimated_inputs(p2)}
    assert ("pcie", "concurrent H2D to all GPUs") in names and ("peer", "peer latency (none)") in names
    nv = {(e.link, e.name) for e in estimated_inputs(two_gpu("h100-nvl-x2"))}
    assert ("peer", "peer latency (nvlink)") in nv and not any(n.startswith("peer link") for _, n in nv)  # datasheet
    one = {e.name for e in estimated_inputs(tiny_problem(profile="rtx-4090"))}
    assert not any("concurrent" in n or "peer" in n for n in one)


# ---- one layer's experts over two GPUs (remote experts) ----------------------------------------------
def test_remote_experts_by_hand():
    """Fully resident on GPU 0, no split; layer 0's r least used static experts held and run by GPU 1. A token
    routes to one of them with chance p = 1 - (1 - q)^k (q their access share); then the hidden state goes
    over and the partial output back (two hops) while GPU 0 reads the rest: the layer takes
    (1 - p) t_local + p max(t_local, t_hit), t_hit = 2 hops + their kernel seconds / p."""
    import dataclasses as dc
    p = two_gpu("rtx-pro-6000-x2")
    base = placement(p, "vram", ())             # one GPU: read in place; with remote experts: the copy path
    r = 3
    rem = dc.replace(base, remote=(r,) + (0,) * (p.curves.n_layers - 1))
    cm = CostModel(p)
    t0, t1 = 1 / cm.predict(base).decode_tok_s, 1 / cm.predict(rem).decode_tok_s
    E, k = p.curves.n_experts, p.spec.top_k
    pop = p.curves.pop[0]
    kern = cm._rank_times["kern"]
    far = np.arange(E) >= E - r
    q = float(pop[far].sum())
    hit = 1 - (1 - q) ** k
    t_all = k * float(np.dot(pop, kern))
    t_far = k * float(np.dot(pop * far, kern))
    t_loc = max(t_all - t_far, 2.0 * k * p.spec.expert_params / cm.flop_rate)
    hop = cm.hop_seconds(2 * p.spec.hidden, 0, 1)
    t_hit = 2 * hop + t_far / hit
    t_layer = (1 - hit) * t_loc + hit * max(t_loc, t_hit)
    rts = p.spec.n_moe_layers * p.profile.calibration.round_trip.value * 1e-6      # the copy path's round trips
    use = p.spec.n_moe_layers * cm.launch                                          # the in-place use count
    assert t1 - t0 == pytest.approx(t_layer - max(t_all, 2.0 * k * p.spec.expert_params / cm.flop_rate) + rts - use,
                                    rel=1e-9)
    pred = cm.predict(rem)
    assert pred.bytes_per_token["peer"] == pytest.approx(2 * 2 * p.spec.hidden * hit)
    fp = footprint(p, rem)
    moved = float(sum(p.rank_bytes[E - r:]))
    assert fp.per_gpu_vram[1] == pytest.approx(fp.reserve // 2 + fp.workspace // 2 + moved)
    assert fp.static_experts == footprint(p, base).static_experts


def test_remote_placements_stay_within_the_bound():
    import dataclasses as dc

    from strata_plan.planner.bound import check_within, physical_bound, ranked_bound
    for name in ("rtx-pro-6000-x2", "rtx-4090-x2"):
        p = two_gpu(name)
        cm = CostModel(p)
        rng = np.random.default_rng(1)
        for pl in _random_split_placements(p, 12, seed=2) + [placement(p, "vram", ())]:
            rem = tuple(int(rng.integers(0, v + 1)) for v in pl.vram)
            pl = dc.replace(pl, remote=rem, gpu_split=pl.gpu_split if rng.random() < 0.5 else ())
            b = physical_bound(p, pl)
            check_within(cm.predict(pl), b, name)
            assert ranked_bound(p, pl) == pytest.approx((b.decode_tok_s, b.prefill_tok_s), rel=1e-9)


@pytest.fixture(scope="module")
def one_layer_two_gpus():
    """One MoE layer, so no pipeline split can use the second GPU's memory for it: GPU 0 has room for no expert
    beyond its working set at depth 2 (5 experts at depth 0, where its staging shrinks), GPU 1 for 6, the rest
    comes from pinned RAM; GPUs joined by NVLink. Spilling puts the layer on the copy path, so the host's part of
    it (round trip, issuing fetches) is set to cost nothing here: at the default 75 us round trip one GPU reading
    3 experts in place is faster."""
    p = tiny_problem(skews=(0.8,), vram_experts=0.0, ram_experts=8.0, profile="h100-nvl-x2")
    b, slot = p.budget, p.slot_bytes
    from strata_plan.planner.capacity import workspace_bytes
    spare = b.reserve + workspace_bytes(p.spec, p.prefill_chunk) + 6 * slot
    free = {k: Figure(0.0, "estimate", "test: no host cost") for k in ("moe_round_trip_us", "host_fetch_us")}
    prof = dataclasses.replace(p.profile, calibration=dataclasses.replace(p.profile.calibration, **free))
    return p.replace(profile=prof, budget=Budget(b.vram + spare, b.ram, b.nvme, b.reserve, (b.vram, spare)))


def test_polish_spills_a_layers_experts_to_the_partner_gpu(one_layer_two_gpus, tmp_path):
    from strata_plan.planner.bound import physical_bound
    from strata_plan.core.plan import Sources, SourceRef, load_plan, save_plan
    from strata_plan.planner.build import build_plan
    from strata_plan.planner.polish import polish
    from strata_plan.planner.search import search
    p = one_layer_two_gpus
    cm = CostModel(p)
    start = search(p, trials=6, seed=0, polish_evals=0).best.placement
    assert not any(start.remote)
    rate = lambda pl: cm.predict(pl).decode_tok_s  # noqa: E731
    best, score, kept = polish(p, start, rate, 400)
    assert best.remote and best.remote[0] > 0 and score > rate(start) and footprint(p, best).fits(p.budget)
    r = search(p, trials=6, seed=0)                  # the search keeps what polish finds
    assert r.best.prediction.decode_tok_s >= score * (1 - 1e-12)
    src = Sources(SourceRef("tiny", "0" * 64), SourceRef(p.profile.name, "0" * 64), SourceRef("trace", "0" * 64))
    assert r.best.placement.remote[0] > 0
    plan = build_plan(p, r, physical_bound(p, r.best.placement), src, cm)
    back = load_plan(save_plan(plan, tmp_path / "remote.yaml"))
    assert placement_of(back) == r.best.placement
    lay = back.layers[0]
    assert lay.remote_gpu == 1 and lay.remote == lay.vram[len(lay.vram) - len(lay.remote):]
    assert back.n_gpus_used == 2            # the engine refuses it (one GPU)


def test_a_move_that_would_leave_fewer_static_experts_than_the_partner_holds_is_no_move(one_layer_two_gpus):
    """The partner GPU's experts (`remote`) are some of the layer's static ones: a polish move taking a static expert
    out of a layer whose every static expert is held remotely is skipped, not a placement that cannot exist."""
    from strata_plan.planner.polish import _apply, _moves
    p = one_layer_two_gpus
    start = Placement(vram=(2,), ram=(8,), cache=(0,), dense_resident=(True,) * len(p.dense_units), prefetch_depth=0,
                      remote=(2,))
    moves = [m for m in _moves(p, 1) if m[0] == "layer" and m[1][0][0] < 0]
    assert moves
    for m in moves:
        assert _apply(p, start, m) is None, m
