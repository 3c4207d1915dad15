"""llama.cpp export: -ot arguments cover every MoE layer once, follow the plan's per-layer majority, fit the
VRAM budget, and the command refuses plans whose inputs it cannot find or that changed."""
from __future__ import annotations

import json
import re

import pytest

from strata_plan.cli import main
from strata_plan.planner.capacity import Budget
from strata_plan.planner.export import LayerChoice, export_llama_cpp, layer_regex
from strata_plan.planner.make import problem_for_plan
from strata_plan.planner.make import make_plan
from strata_plan.core.plan import load_plan, save_plan


def _plan(tmp_path, name="p", model="mixtral-8x7b", **kw):
    kw = {"vram_gb": 13, "ram_gb": 16, "prior": "olmoe-like", "trials": 12, **kw}
    plan = make_plan(kw.pop("profile", "rtx-4090"), model, **kw)
    path = save_plan(plan, tmp_path / f"{name}.yaml")
    return load_plan(path), str(path)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    """Mixtral on a 13 GB card: 5 of 8 experts in VRAM in some layers, 4 in the others."""
    return _plan(tmp_path_factory.mktemp("mixtral"))


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """Mixtral on a 14 GB card: 7 of 8 experts in VRAM in every layer, too many whole layers for the card."""
    return _plan(tmp_path_factory.mktemp("tight"), vram_gb=14)


def overrides(args) -> list[tuple[re.Pattern, str]]:
    assert len(args) % 2 == 0 and all(a == "-ot" for a in args[::2])
    out = []
    for value in args[1::2]:
        pattern, buffer = value.rsplit("=", 1)
        out.append((re.compile(pattern), buffer))
    return out


def placement_of(args, spec) -> dict[int, str]:
    """Decoder layer -> buffer, the way llama.cpp reads -ot (regex search on tensor names); every routed-expert
    tensor of a MoE layer must match exactly one override and every other tensor none."""
    ots = overrides(args)
    where = {}
    for i in range(spec.n_layers):
        experts = [f"blk.{i}.ffn_{p}_exps.weight" for p in ("gate", "up", "down")]
        others = [f"blk.{i}.ffn_gate_shexp.weight", f"blk.{i}.ffn_gate.weight", f"blk.{i}.attn_q.weight",
                  f"blk.{i}.ffn_gate_inp.weight"]
        for name in others:
            assert not [b for p, b in ots if p.search(name)], name
        hits = {name: [b for p, b in ots if p.search(name)] for name in experts}
        if i in spec.moe_layers:
            assert all(len(h) == 1 for h in hits.values()), hits
            assert len({h[0] for h in hits.values()}) == 1
            where[i] = hits[experts[0]][0]
        else:
            assert not any(hits.values()), hits
    return where


def test_arguments_cover_every_moe_layer_once_and_a_roomy_card_takes_them_all(mixtral):
    plan, path = mixtral
    roomy = problem_for_plan(plan, path)
    roomy = roomy.replace(budget=Budget(10**12, roomy.budget.ram, roomy.budget.nvme, roomy.budget.reserve))
    ex = export_llama_cpp(plan, roomy, path)
    where = placement_of(ex.override_args, roomy.spec)
    assert sorted(where) == list(roomy.spec.moe_layers)
    assert set(where.values()) == {"CUDA0"} and not any(c.demoted for c in ex.layers)
    assert any(not c.majority_gpu for c in ex.layers), "the fixture's plan keeps some layers mostly off VRAM"


def _score(plan, problem, model, gpu) -> tuple[float, bool]:
    from strata_plan.planner.placement import footprint
    from strata_plan.planner.search import score
    p, pred = model.predict(gpu)
    return (score(pred, plan.search.objective, plan.search.mix_weight),
            footprint(problem, p).vram <= problem.budget.vram)


def check_no_fitting_layer_left_on_the_cpu_that_would_help(plan, problem, ex) -> None:
    """The export's layers against every one-layer change: adding any CPU layer either exceeds the VRAM
    budget or predicts no better (llama.cpp's decode), and dropping any GPU layer predicts no better."""
    from strata_plan.planner.export import LlamaCppCost
    cost = LlamaCppCost(problem)
    gpu = [c.on_gpu for c in ex.layers]
    mine, fits = _score(plan, problem, cost, gpu)
    assert fits
    for j in range(len(gpu)):
        other = list(gpu)
        other[j] = not gpu[j]
        s, ok = _score(plan, problem, cost, other)
        assert not ok or s <= mine * (1 + 1e-9), (j, gpu[j], s, mine)


def test_the_budget_takes_as_many_whole_layers_as_fit_and_help(tight):
    plan, path = tight
    problem = problem_for_plan(plan, path)
    ex = export_llama_cpp(plan, problem, path)
    assert ex.fits_vram and ex.vram_needed <= problem.budget.vram
    where = placement_of(ex.override_args, problem.spec)
    demoted = [c for c in ex.layers if c.demoted]
    kept = [c for c in ex.layers if c.on_gpu]
    assert demoted and kept, "14 GB holds some whole Mixtral layers, not all 32"
    assert all(where[c.layer] == "CPU" for c in demoted)
    assert any(f"layers {demoted[0].layer}" in n for n in ex.notes)
    check_no_fitting_layer_left_on_the_cpu_that_would_help(plan, problem, ex)


def test_kimi_on_the_rtx_pro_6000_fills_its_vram_with_whole_layers(tmp_path):
    """The case of issue 25: the per-layer majority put 0 of 92 layers on the 96 GB card and left 57 GB idle."""
    plan, path = _plan(tmp_path, model="kimi-k3.1-pro", profile="rtx-pro-6000", vram_gb=None, ram_gb=None,
                       prior="mixtral-like", trials=4)
    problem = problem_for_plan(plan, path)
    ex = export_llama_cpp(plan, problem, path)
    assert ex.gpu_layers and ex.fits_vram
    layer_bytes = float(problem.rank_bytes.sum())
    assert problem.budget.vram - ex.vram_needed < layer_bytes        # no room left for one more whole layer
    assert ex.nvme_experts > 0 and 0 < ex.predicted.decode_tok_s <= ex.predicted.bound_decode_tok_s
    check_no_fitting_layer_left_on_the_cpu_that_would_help(plan, problem, ex)


def test_the_layer_placement_is_predicted_again_within_its_bound(mixtral):
    plan, path = mixtral
    ex = export_llama_cpp(plan, problem_for_plan(plan, path), path)
    p = ex.predicted
    assert 0 < p.decode_tok_s <= p.bound_decode_tok_s * (1 + 1e-9)
    assert 0 < p.prefill_tok_s <= p.bound_prefill_tok_s * (1 + 1e-9)
    assert ex.plan_predicted.decode_tok_s == plan.predicted.decode_tok_s
    assert ex.cpu_bound_decode_tok_s is not None and p.decode_tok_s < ex.cpu_bound_decode_tok_s
    assert sum(c.moved for c in ex.layers) > 0
    text = ex.shell()
    assert "bound, not a prediction" in text and "Lost:" in text and "-ngl 999" in text


def test_dense_layers_and_shared_experts_are_never_matched(tmp_path):
    plan, path = _plan(tmp_path, model="deepseek-v3", profile="h100-80g", vram_gb=80, ram_gb=150, prior=None, trials=4)
    problem = problem_for_plan(plan, path)
    ex = export_llama_cpp(plan, problem, path)
    where = placement_of(ex.override_args, problem.spec)
    assert sorted(where) == list(problem.spec.moe_layers) and 0 not in where


def test_layer_regex_matches_whole_layer_numbers_only():
    pattern = re.compile(layer_regex([1, 13]))
    assert pattern.search("blk.1.ffn_up_exps.weight") and pattern.search("blk.13.ffn_down_exps.weight")
    for name in ("blk.113.ffn_up_exps.weight", "blk.131.ffn_up_exps.weight", "blk.3.ffn_up_exps.weight",
                 "blk.11.ffn_gate_exps.weight", "blk.1.ffn_up_shexp.weight", "blk.1.ffn_up.weight"):
        assert not pattern.search(name), name


def test_a_tie_is_not_a_majority():
    assert not LayerChoice(0, 4, 4, 0, 0, False).majority_gpu
    assert LayerChoice(0, 5, 3, 0, 0, True).majority_gpu
    assert LayerChoice(0, 5, 3, 0, 0, True).moved == 3 and LayerChoice(0, 5, 3, 0, 0, False).demoted


def test_cli_writes_what_it_prints(mixtral, tmp_path, capsys):
    _, path = mixtral
    out = tmp_path / "run.sh"
    assert main(["export", "--format", "llama.cpp", path, "--out", str(out), "--gguf", "mixtral.gguf"]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    assert printed.count("-ot ") == 2 and "llama-server -m mixtral.gguf" in printed
    assert main(["export", path, "--json", "--gguf", "mixtral.gguf"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["label"] == "predicted" and data["command"][-4:] == data["override_args"]
    assert data["command"][1:3] == ["-m", "mixtral.gguf"]          # the JSON's command names the --gguf too


def test_a_measured_profile_needs_its_path(tmp_path, capsys):
    import dataclasses

    from strata_plan.profiles.schema import load_profile, save_profile
    mine = save_profile(dataclasses.replace(load_profile("rtx-4090"), name="my-box"), tmp_path / "my-box.yaml")
    plan, path = _plan(tmp_path, profile=str(mine), trials=4)
    assert main(["export", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--profile" in err and "my-box" in err
    assert main(["export", path, "--profile", str(mine)]) == 0
    capsys.readouterr()
    other = save_profile(dataclasses.replace(load_profile("rtx-5090"), name="my-box"), tmp_path / "other.yaml")
    assert main(["export", path, "--profile", str(other)]) == 2
    assert "differs from the one the plan was made for" in capsys.readouterr().err


def test_bad_gpu_buffer_is_refused(mixtral, capsys):
    _, path = mixtral
    assert main(["export", path, "--gpu-buffer", "CUDA0=x"]) == 2
    assert "--gpu-buffer" in capsys.readouterr().err


def test_plans_from_measured_routing_export_and_changed_statistics_are_refused(tmp_path, capsys):
    """Statistics from the real Mixtral routing slice, as a YAML and as a trace .npz: the export finds them by
    the path the plan records, and refuses them once they no longer match the plan's sha256."""
    from pathlib import Path
    slice_ = str(Path(__file__).parent / "data" / "routing_mixtral_slice.jsonl")
    stats, trace = tmp_path / "s.yaml", tmp_path / "t.npz"
    assert main(["stats", slice_, "--model", "mixtral-8x7b", "--out", str(stats), "--save-trace", str(trace),
                 "--json"]) == 0
    for source in (stats, trace):
        plan, path = _plan(tmp_path, name=source.suffix[1:], prior=None, stats=str(source), trials=4)
        assert plan.sources.statistics.kind == "trace"
        assert main(["export", path]) == 0
    other = tmp_path / "other.yaml"
    assert main(["stats", "mixtral-like", "--model", "mixtral-8x7b", "--out", str(other), "--json"]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "yaml.yaml"), "--stats", str(other)]) == 2
    assert "sources.statistics" in capsys.readouterr().err


def test_each_cpu_layer_costs_llama_cpp_its_bytes_at_the_ram_rate_and_one_hand_off(mixtral):
    """llama.cpp's decode (LlamaCppCost): moving layers' experts to the CPU adds, per layer, its routed bytes at
    the RAM rate and the hand-off, and takes off its fused expert call on the GPU; never above the bound."""
    import dataclasses

    import numpy as np

    from strata_plan.planner.export import DEFAULT_CPU_LAYER_US, LlamaCppCost
    plan, path = mixtral
    problem = problem_for_plan(plan, path)
    L = len(plan.layers)
    slow = LlamaCppCost(problem)
    free = LlamaCppCost(problem, cpu_layer=dataclasses.replace(DEFAULT_CPU_LAYER_US, value=0.0))
    t_all = 1 / slow.predict([True] * L)[1].decode_tok_s
    assert t_all == 1 / slow.gpu_pred.decode_tok_s
    for n in (1, L // 2, L):
        gpu = [j >= n for j in range(L)]
        p, pred = slow.predict(gpu)
        ram, nvme = slow.cpu_bytes(p)
        assert ram[n:].sum() == nvme[n:].sum() == 0 and (ram[:n] + nvme[:n] > 0).all()
        reads = ram[:n].sum() / slow.ram_rate + nvme[:n].sum() / slow.nvme_rate
        T = 1 / pred.decode_tok_s
        assert np.isclose(T, t_all - slow.t_exp[:n].sum() + reads + n * DEFAULT_CPU_LAYER_US.value * 1e-6, rtol=1e-12)
        assert np.isclose(T - 1 / free.predict(gpu)[1].decode_tok_s, n * DEFAULT_CPU_LAYER_US.value * 1e-6)
        assert pred.decode_tok_s <= slow.bound(p, gpu).decode_tok_s * (1 + 1e-9)
        assert pred.prefill_tok_s == slow.cost.predict(p).prefill_tok_s
        assert pred.bytes_per_token["ram"] + pred.bytes_per_token["nvme"] == ram.sum() + nvme.sum()


def test_a_measured_hand_off_goes_into_the_prediction(mixtral, capsys):
    from strata_plan.planner.export import DEFAULT_CPU_LAYER_US
    _, path = mixtral
    assert main(["export", path, "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["export", path, "--json", "--cpu-layer-us", "400"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert default["cpu_layer_us"]["provenance"] == "estimate" and slow["cpu_layer_us"]["value"] == 400.0
    assert slow["cpu_layer_us"]["provenance"] == "measured"
    n = len(slow["cpu_layers"])
    assert n and len(default["cpu_layers"]) == n
    dt = 1 / slow["predicted"]["decode_tok_s"] - 1 / default["predicted"]["decode_tok_s"]
    assert abs(dt - n * (400 - DEFAULT_CPU_LAYER_US.value) * 1e-6) < 1e-9
    assert main(["export", path, "--cpu-layer-us", "-3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--cpu-layer-us" in err
