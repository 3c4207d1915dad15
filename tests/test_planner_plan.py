"""The plan file and `strata-plan plan`: complete, strict, reproducible; bad input is one line, exit 2, and
no output file."""
from __future__ import annotations

import json

import pytest
import yaml

from strata_plan.errors import UserError
from strata_plan.planner.make import make_plan
from strata_plan.core.plan import load_plan, save_plan
from strata_plan.core.spec import load_spec
from strata_plan.planner.testing import skewed_trace, tiny_spec
from strata_plan.profiles.schema import load_profile
from strata_plan.schema import to_data

TINY = dict(vram_gb=1.5, ram_gb=1.0, context=512, chunk=256)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """A tiny model's config.json, a routing trace of it, and a trace of another geometry."""
    from strata_plan.core.routing import save_trace
    d = tmp_path_factory.mktemp("tiny")
    spec = tiny_spec(n_layers=3, n_experts=8, top_k=2)
    cfg = {"model_type": "mixtral", "hidden_size": spec.hidden, "intermediate_size": spec.moe_intermediate,
           "num_hidden_layers": 3, "num_attention_heads": 16, "num_key_value_heads": 4, "num_local_experts": 8,
           "num_experts_per_tok": 2, "vocab_size": spec.vocab}
    (d / "config.json").write_text(json.dumps(cfg))
    save_trace(skewed_trace((1.4, 0.4, 0.0), 8, 2, tokens=400, locality=0.3, model="tiny"), d / "trace.npz")
    save_trace(skewed_trace((1.0, 0.0), 8, 2, tokens=100, model="other"), d / "two_layers.npz")
    return d


@pytest.fixture(scope="module")
def tiny_plan(tiny_files):
    return make_plan("rtx-4090", str(tiny_files / "config.json"), stats=str(tiny_files / "trace.npz"), trials=20,
                     seed=1, **TINY)


def test_plan_is_complete(tiny_plan, tiny_files):
    p = tiny_plan
    spec = load_spec(str(tiny_files / "config.json"))
    assert p.model == spec.name and p.n_experts == 8 and p.top_k == 2 and p.prefill_chunk == 256
    assert [l.layer for l in p.layers] == list(spec.moe_layers)
    for layer in p.layers:
        assert sorted(layer.vram + layer.ram + layer.nvme) == list(range(8))
        assert sum(len(v) for v in layer.formats.values()) == 8
    pr = p.predicted
    assert pr.label == "predicted" and 0 < pr.decode_tok_s <= pr.bound_decode_tok_s
    assert 0 < pr.prefill_tok_s <= pr.bound_prefill_tok_s
    assert set(pr.bytes_per_token) >= {"vram", "ram", "nvme"}
    assert p.memory.vram_total <= p.memory.budgets.vram_bytes and p.memory.ram_total <= p.memory.budgets.ram_bytes
    assert p.sources.model.sha256 == spec.config_sha256 and len(p.sources.profile.sha256) == 64
    assert p.sources.statistics.kind == "trace" and p.sources.statistics_source_sha256
    assert p.staging.vram_slots == (p.prefetch_depth + 1) * 2 and set(p.staging.nvme_reads) <= set(p.layers[0].formats)
    assert p.search.trials == 20 and p.search.seed == 1 and p.search.objective == "decode"


def test_the_hottest_experts_get_the_best_format(tiny_plan):
    for layer in tiny_plan.layers:
        ranked = layer.vram + layer.ram + layer.nvme          # listed most used first
        assert layer.format_of(ranked[0]) == "q2_g16_s8m4" and layer.format_of(ranked[-1]) == "q1_g32_s8m4"


def test_round_trip_and_same_seed_same_plan(tiny_plan, tiny_files, tmp_path):
    path = save_plan(tiny_plan, tmp_path / "plan.yaml")
    again = load_plan(path, load_spec(str(tiny_files / "config.json")))
    assert again == tiny_plan
    twin = make_plan("rtx-4090", str(tiny_files / "config.json"), stats=str(tiny_files / "trace.npz"), trials=20,
                     seed=1, **TINY)
    assert twin.layers == tiny_plan.layers and twin.predicted == tiny_plan.predicted


def _mutated(tmp_path, plan, edit):
    data = to_data(plan)
    edit(data)
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d.update(version=2), "(top level)"),
    (lambda d: d["layers"][0].update(vram=d["layers"][0]["vram"] + d["layers"][0]["vram"][:1]), "layers[0]"),
    (lambda d: d["layers"][1].update(vram=[], ram=[], nvme=list(range(7))), "layers[1]"),
    (lambda d: d["layers"][0]["formats"].update(q9_magic=[0]), "layers[0]"),
    (lambda d: d["predicted"].update(decode_tok_s=d["predicted"]["bound_decode_tok_s"] * 2), "predicted"),
    (lambda d: d["predicted"].update(decode_binding="vibes"), "predicted.decode_binding"),
    (lambda d: d.update(prefetch_depth=9), "prefetch_depth"),
    (lambda d: d["cache"].update(total_slots=d["cache"]["total_slots"] + 1), "(top level)"),
    (lambda d: d.pop("dense"), "(top level)"),
    (lambda d: d["staging"].update(lookahead_point="router"), "staging.lookahead_point"),
])
def test_plan_loading_is_strict(tiny_plan, tmp_path, edit, field):
    with pytest.raises(UserError) as e:
        load_plan(_mutated(tmp_path, tiny_plan, edit))
    assert e.value.field == field
    assert "\n" not in e.value.line()


def test_the_lookahead_point_is_recorded_and_predicted_again(tiny_files, tmp_path):
    """`strata-plan plan --lookahead-point attention`: the plan records where the NVMe guesses are taken
    (`staging.lookahead_point`), the plan's problem rebuilt from the file carries it, and a plan with an NVMe tier and
    lookahead is predicted at that point (the kimi5 seed plan at depth 2)."""
    import dataclasses
    from pathlib import Path
    from strata_plan.planner.repredict import plan_problem, predict_plan
    plan = make_plan("rtx-4090", str(tiny_files / "config.json"), stats=str(tiny_files / "trace.npz"), trials=6,
                     seed=1, lookahead_point="attention", **TINY)
    again = load_plan(save_plan(plan, tmp_path / "tiny.yaml"))
    assert plan.staging.point == again.staging.point == "attention"
    assert plan_problem(again, "rtx-4090", "tiny.yaml").lookahead_point == "attention"
    data = Path(__file__).resolve().parent / "data"
    seed = load_plan(data / "plan-kimi5-h200-seed-depth2.yaml")
    assert seed.staging.point == "output" and seed.prefetch_depth == 2      # a file without the field
    data_out = yaml.safe_load((data / "plan-kimi5-h200-seed-depth2.yaml").read_text())
    data_out["staging"]["lookahead_point"] = "output"                  # written out: the same as absent
    (tmp_path / "named.yaml").write_text(yaml.safe_dump(data_out))
    assert load_plan(tmp_path / "named.yaml").staging.point == "output"
    router = dataclasses.replace(seed, staging=dataclasses.replace(seed.staging, lookahead_point="attention"))
    saved = load_plan(save_plan(router, tmp_path / "seed.yaml"))
    prob = plan_problem(seed, "h200", str(data / "plan-kimi5-h200-seed-depth2.yaml"))
    got = predict_plan(saved, "h200", "plan", where=str(tmp_path / "seed.yaml")).decode_tok_s
    assert got == pytest.approx(predict_plan(seed, None, "plan", problem=prob.replace(lookahead_point="attention"))
                                .decode_tok_s)
    assert got != pytest.approx(predict_plan(seed, None, "plan", problem=prob).decode_tok_s, rel=1e-6)


def test_plan_for_another_model_is_refused(tiny_plan, tmp_path):
    path = save_plan(tiny_plan, tmp_path / "plan.yaml")
    with pytest.raises(UserError, match="kimi-k3.1-pro"):
        load_plan(path, load_spec("kimi-k3.1-pro"))


def test_kimi_plan_on_a_24_gb_card_streams_dense_weights(cli, tmp_path):
    """The seed model on the smallest seed row: planned and bounded, not refused; rich output by default."""
    out = tmp_path / "kimi.yaml"
    r = cli("plan", "--profile", "rtx-4090", "--model", "kimi-k3.1-pro", "--prior", "olmoe-like", "--trials", "6",
            "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "predicted" in r.stdout and "physical" in r.stdout and "wrote" in r.stdout
    plan = load_plan(out, load_spec("kimi-k3.1-pro"))
    assert len(plan.layers) == 92 and plan.dense.streamed_layers
    assert plan.predicted.bytes_per_token["ram"] > 10e9          # streamed dense weights dominate
    assert plan.predicted.decode_tok_s <= plan.predicted.bound_decode_tok_s


def test_json_output_and_gpu_preset(cli, tiny_files, tmp_path):
    host = to_data(load_profile("rtx-4090"))
    host.update(gpus=[], name="laptop")
    (tmp_path / "host.yaml").write_text(yaml.safe_dump(host))
    out = tmp_path / "plan.yaml"
    r = cli("plan", "--profile", str(tmp_path / "host.yaml"), "--gpu-preset", "a100-80g", "--model",
            str(tiny_files / "config.json"), "--stats", str(tiny_files / "trace.npz"), "--trials", "5", "--vram-gb", "1.5",
            "--ram-gb", "1", "--context", "512", "--chunk", "256", "--objective", "mix", "--mix-weight", "0.7",
            "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["label"] == "predicted" and summary["decode_tok_s"] <= summary["bound_decode_tok_s"]
    plan = load_plan(out)
    assert plan.sources.gpu_preset == "a100-80g" and plan.sources.profile.name == "laptop+a100-80g"
    assert plan.search.objective == "mix" and plan.search.mix_weight == 0.7


def _bad(capsys, tmp_path, *args):
    """`strata-plan plan ARGS` in-process (`cli.main`: a user's mistake is one line and exit 2, anything else
    raises here); test_kimi_plan_on_a_24_gb_card_streams_dense_weights runs the real command."""
    from strata_plan.cli import main
    out = tmp_path / "never.yaml"
    try:
        code = main(["plan", *args, "--out", str(out)])
    except SystemExit as e:                          # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("strata-plan: error:")
    assert not out.exists() and not list(tmp_path.glob(".never.yaml*"))
    return err


def test_bad_input_is_one_line_exit_2_and_no_file(capsys, tiny_files, tmp_path):
    model, trace = str(tiny_files / "config.json"), str(tiny_files / "trace.npz")
    small = ["--vram-gb", "1.5", "--ram-gb", "1", "--context", "512", "--chunk", "256", "--trials", "2"]
    assert "unknown model name" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", "kimi-k9")
    assert "unknown profile name" in _bad(capsys, tmp_path, "--profile", "rtx-9090", "--model", model, *small)
    assert "working set" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", "kimi-k3.1-pro", "--vram-gb", "1.2")
    assert "MoE layers" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", model,
                                "--stats", str(tiny_files / "two_layers.npz"), *small)
    assert "both given" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", model, "--stats", trace,
                                "--prior", "uniform", *small)
    assert "--objective mix" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", model, "--mix-weight", "0.3")
    assert "unknown prior" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", model, "--prior", "zipfy", *small)
    assert "--trials" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", model, "--trials", "0")
    assert "--context" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", model, "--context", "0")
    assert "--depth" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", model, "--stats", trace, "--depth",
                             "99", *small)
    host = to_data(load_profile("rtx-4090"))
    host.update(gpus=[])
    (tmp_path / "host.yaml").write_text(yaml.safe_dump(host))
    assert "--gpu-preset" in _bad(capsys, tmp_path, "--profile", str(tmp_path / "host.yaml"), "--model", model, *small)
    assert "unknown profile" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--gpu-preset", "tpu-v9", "--model", model)
    assert "file not found" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", model, "--stats",
                                    str(tmp_path / "missing.yaml"), *small)
    assert "--ram-gb" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", "kimi-k3.1-pro", "--ram-gb", "1")
    assert "NVMe" in _bad(capsys, tmp_path, "--profile", "rtx-4090", "--model", "kimi-k3.1-pro", "--nvme-gb", "10",
                          "--trials", "2")


def test_statistics_of_another_geometry_are_refused():
    from strata_plan.planner.capacity import Budget
    from strata_plan.planner.problem import Problem
    from strata_plan.core.routing import stats_from_prior
    kimi, prof = load_spec("kimi-k3.1-pro"), load_profile("a100-80g")
    for layers, experts, k, field in ((3, 384, 8, "layers"), (92, 256, 8, "n_experts"), (92, 384, 6, "top_k")):
        stats = stats_from_prior("uniform", layers, experts, k, tokens=64)
        with pytest.raises(UserError) as e:
            Problem(kimi, prof, stats, Budget.from_profile(prof))
        assert e.value.field == field


def test_the_plan_takes_the_guesses_at_the_router_by_default_and_says_where(capsys, tmp_path):
    """`strata-plan plan` prices and records the NVMe guesses at each layer's router unless told `--lookahead-point
    output`, and its summary names the point of a plan whose lookahead reads NVMe experts (kimi5's seed budget)."""
    from strata_plan.cli import main as cli
    argv = ["plan", "--model", "kimi-k3.1-pro", "--moe-layers", "5", "--profile", "h200", "--prior", "olmoe-like",
            "--trials", "4", "--context", "1024", "--vram-gb", "11", "--ram-gb", "11.5", "--nvme-gb", "60",
            "--depth", "2", "--force"]
    said = {}
    for point, extra in (("attention", []), ("output", ["--lookahead-point", "output"])):
        out = tmp_path / f"{point}.yaml"
        assert cli(argv + extra + ["--out", str(out)]) == 0
        assert load_plan(out).staging.point == point
        said[point] = " ".join(capsys.readouterr().out.split())
    assert "depth 2 (NVMe guesses at each layer's router)" in said["attention"]
    assert "depth 2 (NVMe guesses at each layer's end)" in said["output"]
