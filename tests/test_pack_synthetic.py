"""Synthetic packed models (`strata-plan pack --synthetic`) and the truncated specs (`NAME@Nmoe`) that `plan`
plans for them: real formats and sizes, random values that decode to sane finite weights, dense tensors
named and shaped as the architecture's checkpoints, and a plan for the same spec that matches the folder."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors import safe_open  # noqa: E402

from strata_plan.cli import main as cli_main  # noqa: E402
from strata_plan.engine.packed import check_plan_matches, load_index, verify_all  # noqa: E402
from strata_plan.engine.synthetic import dense_tensor_specs, random_blob  # noqa: E402
from strata_plan.errors import UserError  # noqa: E402
from strata_plan.kernels import dequantize, unpack_expert  # noqa: E402
from strata_plan.kernels import formats as F  # noqa: E402
from strata_plan.kernels import reference  # noqa: E402
from strata_plan.core.spec import load_spec, shipped_models  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "fixture-moe"


def test_dense_names_shapes_and_dtypes_are_the_checkpoints():
    spec = load_spec(str(FIXTURE))
    with safe_open(str(FIXTURE / "model.safetensors"), "pt") as f:
        real = sorted((n, f.get_slice(n).get_dtype(), tuple(f.get_slice(n).get_shape()))
                      for n in f.keys() if ".mlp.experts." not in n)
    code = {torch.bfloat16: "BF16", torch.float32: "F32"}
    assert [(n, code[d], s) for n, d, s in dense_tensor_specs(spec)] == real


@pytest.mark.parametrize("model", ["kimi-k3.1-pro", "deepseek-v3", "glm-4.7", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_dense_tensors_add_up_to_the_specs_dense_params(model):
    spec = load_spec(model)
    assert sum(math.prod(s) for _, _, s in dense_tensor_specs(spec)) == spec.dense_params


def test_unsupported_architecture_is_refused():
    with pytest.raises(UserError) as e:
        dense_tensor_specs(load_spec("gpt-oss-20b"))
    assert "model_type" in str(e.value)


@pytest.mark.parametrize("model", shipped_models())
def test_truncated_spec_is_the_models_first_layers(model):
    full = load_spec(model)
    for n in (1, 2):
        cut = load_spec(f"{model}@{n}moe")
        last = full.moe_layers[n - 1]
        assert cut.name == f"{model}@{n}moe" and cut.n_moe_layers == n
        assert cut.layer_kinds == full.layer_kinds[:last + 1]
        assert cut.config_sha256 != full.config_sha256
        assert (cut.hidden, cut.moe_intermediate, cut.n_routed, cut.top_k) == \
            (full.hidden, full.moe_intermediate, full.n_routed, full.top_k)
        assert load_spec(model, moe_layers=n).config_sha256 == cut.config_sha256


def test_more_moe_layers_than_the_model_has_is_refused():
    with pytest.raises(UserError) as e:
        load_spec(str(FIXTURE), moe_layers=9)
    assert "--moe-layers" in str(e.value) and "1..5" in str(e.value)


@pytest.mark.parametrize("fmt", list(F.FORMATS))
def test_random_blob_has_the_layout_and_decodes_to_sane_weights(fmt):
    H, I = 1024, 512
    blob = random_blob(fmt, H, I, torch.Generator().manual_seed(1), "cpu")
    assert blob.dtype == torch.uint8 and blob.numel() == F.expert_bytes(fmt, H, I)
    layout = F.expert_layout(fmt, H, I)
    last = layout.segments[-1]
    assert not blob[last.offset + last.nbytes:].any()                  # the padding to 4 KiB stays zero
    for name, p in unpack_expert(blob, fmt, H, I).items():
        w = dequantize(p)
        sigma = 1 / math.sqrt(p.k)
        assert torch.isfinite(w).all()
        assert abs(float(w.mean())) < 0.1 * sigma
        assert 0.8 * sigma < float(w.std()) < 1.25 * sigma, (name, float(w.std()), sigma)
        if p.d is not None:
            assert torch.isfinite(p.d.float()).all() and (p.d.float() > 0).all() and float(p.d.float().max()) < 1e-2


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    pytest.importorskip("optuna")
    d = tmp_path_factory.mktemp("synthetic")
    plan = d / "plan.yaml"
    assert cli_main(["plan", "--profile", "rtx-4090", "--model", str(FIXTURE), "--moe-layers", "2", "--trials", "3",
                     "--prior", "mixtral-like", "--out", str(plan), "--json"]) == 0
    out = d / "packed"
    assert cli_main(["pack", "--synthetic", str(FIXTURE), "--moe-layers", "2", "--plan", str(plan), "--out", str(out),
                     "--device", "cpu", "--seed", "3", "--json"]) == 0
    return plan, out


def test_synthetic_folder_is_a_packed_model_of_the_truncated_spec(synthetic):
    from strata_plan.core.plan import load_plan
    plan_path, out = synthetic
    index = load_index(out)
    spec = load_spec(str(out))                                    # config.json reads back as the truncated spec
    assert index.model == "fixture-moe@2moe" and spec.config_sha256 == index.config_sha256
    assert index.layers == spec.moe_layers == (1, 2)
    assert len(index.entries) == 2 * spec.n_routed
    verify_all(index)
    plan = load_plan(plan_path, load_spec(f"{FIXTURE}@2moe"))
    check_plan_matches(index, plan, str(plan_path))               # plan and pack agree
    with safe_open(str(out / "dense.safetensors"), "pt") as f:
        assert sorted(f.keys()) == [n for n, _, _ in dense_tensor_specs(spec)]
        assert f.get_tensor("model.layers.2.mlp.gate.e_score_correction_bias").dtype == torch.float32


def test_a_synthetic_pack_runs_from_a_text_prompt(synthetic, capsys, one_torch_thread):
    """A synthetic pack carries a byte-level tokenizer, so `run` takes text; random weights print bytes."""
    pytest.importorskip("tokenizers")
    plan, out = synthetic
    assert cli_main(["run", "--packed", str(out), "--plan", str(plan), "--prompt", "def f(x):", "--max-tokens", "3",
                     "--device", "cpu"]) == 0
    assert capsys.readouterr().err.count("error") == 0


def test_synthetic_layer_runs_through_the_reference_moe(synthetic):
    _, out = synthetic
    index = load_index(out)
    rows = [e for e in index.entries if e.layer == 2]
    arena = torch.from_numpy(np.fromfile(out / rows[0].file, dtype=np.uint8))
    offsets = torch.tensor([r.offset for r in rows])
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, index.hidden, generator=gen)
    ids = torch.stack([torch.randperm(index.n_experts, generator=gen)[:4] for _ in range(3)])
    y = reference.moe(x, ids, torch.full((3, 4), 0.25), arena, offsets, [r.format for r in rows], index.hidden,
                      index.moe_intermediate)
    assert torch.isfinite(y).all() and 1e-3 < float(y.std()) < 10


def test_same_seed_same_bytes(synthetic, tmp_path):
    plan, out = synthetic
    again = tmp_path / "again"
    assert cli_main(["pack", "--synthetic", f"{FIXTURE}@2moe", "--plan", str(plan), "--out", str(again),
                     "--device", "cpu", "--seed", "3", "--json"]) == 0
    a, b = load_index(out), load_index(again)
    assert [e.parts for e in a.entries] == [e.parts for e in b.entries] and a.dense_parts == b.dense_parts
    assert json.loads((out / "config.json").read_text()) == json.loads((again / "config.json").read_text())


def test_a_plan_for_the_whole_model_is_refused_for_the_truncated_one(synthetic, tmp_path, capsys):
    plan, _ = synthetic
    assert cli_main(["pack", "--synthetic", str(FIXTURE), "--plan", str(plan), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fix:" in err[0]


@pytest.mark.parametrize("args, field", [
    ([str(FIXTURE), "--synthetic", str(FIXTURE), "--format", "bf16"], "CHECKPOINT / --synthetic"),
    (["--format", "bf16"], "CHECKPOINT / --synthetic"),
    ([str(FIXTURE), "--moe-layers", "2", "--format", "bf16"], "--moe-layers"),
    (["--synthetic", "gpt-oss-20b", "--moe-layers", "1", "--format", "bf16"], "model_type"),
])
def test_bad_synthetic_input_is_one_line_exit_2(tmp_path, capsys, args, field):
    assert cli_main(["pack", *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and "fix:" in err[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_synthetic_build_on_the_gpu(tmp_path):
    assert cli_main(["pack", "--synthetic", f"{FIXTURE}@2moe", "--bpw", "1.92", "--out", str(tmp_path),
                     "--device", "cuda", "--json"]) == 0
    index = load_index(tmp_path)
    assert "cuda" in index.source
    verify_all(index)
    r = index.entries[-1]
    blob = torch.from_numpy(np.fromfile(tmp_path / r.file, dtype=np.uint8, count=r.nbytes, offset=r.offset))
    for p in unpack_expert(blob, r.format, index.hidden, index.moe_intermediate).values():
        assert torch.isfinite(dequantize(p)).all()


def test_too_little_disk_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    import collections
    import shutil
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - 10**6, 10**6))
    assert cli_main(["pack", "--synthetic", f"{FIXTURE}@1moe", "--bpw", "1.92", "--out", str(tmp_path / "o"),
                     "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "free space" in err[0] and "fix:" in err[0]
    assert not (tmp_path / "o").exists()
