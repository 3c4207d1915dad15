"""Model families (`strata_plan.core.families`): one module each, found by `model_type`. A new family is one
module (or one `register` call) and a tiny config: the planner reads it, `strata-plan pack` refuses it in one
line unless the engine runs it. Every shipped and shared config resolves to the family its model_type names."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from strata_plan.cli import main
from strata_plan.core.families import FAMILIES, Family, family_of, model_types, register, unregister
from strata_plan.core.geometry import AttentionSpec, Cfg, Geometry
from strata_plan.core.spec import MODELS_DIR, REFUSED_TYPES, load_spec, spec_from_config
from strata_plan.kernels import formats as F

# The model_types core/spec.py accepted before the families moved into core/families (its DEEPSEEK_TYPES,
# MIXTRAL_TYPES and the dbrx, arctic and llama4 branches).
ACCEPTED_BEFORE = {"deepseek", "deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe",
                   "mixtral", "phimoe", "grinmoe", "granitemoe", "olmoe", "qwen2_moe", "qwen3_moe", "gpt_oss",
                   "dbrx", "arctic", "llama4"}
RUN_BEFORE = {"deepseek_v3", "kimi_k2", "qwen3_moe", "mixtral"}     # engine/config.py's families before


def read_toy(c: Cfg) -> Geometry:
    """A toy family's own spelling: `n_blocks` layers, every second one MoE, `n_experts` experts of `d_expert`."""
    n = c.int("n_blocks")
    heads = c.int("num_attention_heads")
    att = AttentionSpec("gqa", heads, c.int("num_key_value_heads", heads), c.int("hidden_size") // heads)
    kinds = tuple("moe" if i % 2 else "dense" for i in range(n))
    return Geometry(attention=att, layer_kinds=kinds, n_routed=c.int("n_experts"), top_k=c.int("top_k"),
                    moe_intermediate=c.int("d_expert"), shared_intermediate=0, dense_intermediate=c.int("d_dense"))


@pytest.fixture
def toy(tmp_path):
    register(Family("toy", "Toy-MoE", ("toy_moe",), read_toy, router="softmax_topk", attention="gqa",
                    llama_cpp_arch="toy", layers_field="n_blocks"))
    cfg = {"model_type": "toy_moe", "n_blocks": 4, "hidden_size": 256, "vocab_size": 1000, "num_attention_heads": 4,
           "num_key_value_heads": 2, "n_experts": 16, "top_k": 2, "d_expert": 128, "d_dense": 512}
    path = tmp_path / "toy" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    yield path
    unregister("toy")


def test_a_family_registered_alone_is_read_and_planned(toy):
    spec = load_spec(str(toy))
    assert (spec.model_type, spec.n_layers, spec.moe_layers, spec.n_routed, spec.top_k) == ("toy_moe", 4, (1, 3), 16, 2)
    assert spec.routed_expert_bytes("bf16") == F.expert_bytes("bf16", 256, 128)
    assert spec.dense_layer_bytes(0) == 2 * (spec.attention.params(256) + 2 * 256 + 3 * 256 * 512)
    assert load_spec(f"{toy}", moe_layers=1).n_layers == 2           # truncation goes through the family too
    from strata_plan.planner.make import make_plan
    plan = make_plan("rtx-4090", str(toy), prior="uniform", trials=4)
    assert len(plan.layers) == 2 and plan.n_experts == 16


def test_pack_refuses_a_family_the_engine_does_not_run_in_one_line(toy, tmp_path, capsys):
    assert main(["pack", "--synthetic", str(toy), "--format", "bf16", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model_type" in err[0] and "'toy_moe'" in err[0] and "fix:" in err[0]
    assert all(t in err[0] for t in RUN_BEFORE) and "Mixtral" in err[0]
    assert not (tmp_path / "o").exists()


def test_a_model_type_belongs_to_one_family():
    with pytest.raises(ValueError, match="already registered"):
        register(Family("other", "Other", ("mixtral",), read_toy, router="softmax_topk", attention="gqa",
                        llama_cpp_arch="llama"))
    assert family_of("mixtral").name == "mixtral"


def test_the_accepted_and_running_model_types_are_unchanged():
    assert set(model_types()) == ACCEPTED_BEFORE
    assert {t for f in FAMILIES.values() if f.runs for t in f.model_types} == RUN_BEFORE
    assert not set(REFUSED_TYPES) & ACCEPTED_BEFORE
    from strata_plan.planner.export import EXPERT_TENSORS
    import re
    for f in FAMILIES.values():
        assert (f.tensors is not None) >= f.runs, f.name
        assert all(re.fullmatch(EXPERT_TENSORS, n + ".") for n in f.llama_cpp_experts), f.name


def _configs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.json") if not p.name.startswith("_"))


def _check(path: Path) -> None:
    cfg = json.loads(path.read_text())
    mt = cfg.get("model_type")
    family = family_of(mt)
    assert (family is not None) == (mt in ACCEPTED_BEFORE), path
    if family is not None:
        spec = spec_from_config(cfg, path.stem, str(path))
        assert spec.model_type == mt and spec.attention.kind == family.attention, path


def test_every_shipped_config_resolves_to_its_family():
    paths = _configs(MODELS_DIR)
    assert paths
    for p in paths:
        assert family_of(json.loads(p.read_text())["model_type"]) is not None, p
        _check(p)


def test_every_shared_config_resolves_to_its_family(shared_data):
    paths = [p for p in _configs(shared_data / "configs") if isinstance(json.loads(p.read_text()), dict)]
    assert paths
    for p in paths:
        _check(p)
