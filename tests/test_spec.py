"""ModelSpec: parameter totals against the published ones, the seed model's geometry, and refusals."""
from __future__ import annotations

import json

import pytest

from strata_plan.errors import UserError
from strata_plan.kernels.formats import tier_mix
from strata_plan.core.spec import load_spec, shipped_models, spec_from_config

# Published total parameters (shared/data/README.md). Kimi-K2's config counts 1.03T against the
# advertised "1T" (the issue says: test against 1.03T).
PUBLISHED_B = {
    "deepseek-v3": 671, "deepseek-r1": 671, "kimi-k2": 1030, "qwen3-235b-a22b": 235, "qwen3-30b-a3b": 30.5,
    "qwen3-coder-480b": 480, "mixtral-8x7b": 46.7, "mixtral-8x22b": 141, "gpt-oss-120b": 117, "gpt-oss-20b": 21,
    "glm-4.7": 355, "olmoe-1b-7b": 6.9, "kimi-k3.1-pro": 2740,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_total_params_match_published_within_2_percent(name):
    spec = load_spec(name)
    assert abs(spec.total_params / 1e9 / PUBLISHED_B[name] - 1) < 0.02, spec.total_params


def test_every_shipped_spec_has_a_published_total():
    assert set(shipped_models()) == set(PUBLISHED_B)


def test_shared_configs_not_shipped_also_match(shared_data):
    cfgs = shared_data / "configs"
    for fname, published in [("dbrx-instruct", 132), ("snowflake-arctic-instruct", 480),
                             ("llama-4-maverick-17b-128e-instruct", 400), ("llama-4-scout-17b-16e-instruct", 109)]:
        spec = spec_from_config(json.loads((cfgs / f"{fname}.json").read_text()), fname)
        assert abs(spec.total_params / 1e9 / published - 1) < 0.02, (fname, spec.total_params)


def test_seed_model_geometry():
    s = load_spec("kimi-k3.1-pro")
    assert (s.n_layers, s.n_moe_layers, s.n_routed, s.top_k, s.hidden) == (93, 92, 384, 8, 7168)
    assert s.layer_kinds[0] == "dense" and s.attention.kind == "mla" and s.vocab == 163840
    mix = tier_mix(1.92)
    mean_expert = s.routed_bytes(mix) / (s.n_moe_layers * s.n_routed)
    assert abs(mean_expert / 18.5e6 - 1) < 0.01            # "18.5 MB per routed expert at 1.92 bpw"
    assert abs(s.packed_bytes(mix) / 692e9 - 1) < 0.01      # "about 692 GB with BF16 for the rest"
    assert 38e9 < s.dense_bytes < 40e9                      # the ~39 GB of BF16 dense weights


def test_byte_counts_follow_from_geometry():
    s = load_spec("deepseek-v3")
    # MLA caches the compressed latent: (kv_lora_rank + rope dim) * 2 bytes per layer per token
    assert s.kv_bytes_per_token() == 61 * (512 + 64) * 2
    assert s.kv_cache_bytes(1000) == 1000 * s.kv_bytes_per_token()
    m = load_spec("mixtral-8x7b")
    assert m.kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2
    assert m.routed_expert_bytes("bf16") >= 3 * 4096 * 14336 * 2
    assert m.flops_per_token(0) == 2 * m.active_params
    assert m.flops_per_token(4096) > m.flops_per_token(0)


def test_sliding_window_layers_stop_growing():
    s = load_spec("gpt-oss-120b")
    per_layer = s.attention.kv_bytes_per_token_layer
    # 18 full layers grow with the context, 18 sliding layers stop at 128 tokens
    assert s.kv_cache_bytes(10_000) == per_layer * (18 * 10_000 + 18 * 128)


@pytest.mark.parametrize("cfg,field", [
    ({"model_type": "llama", "num_hidden_layers": 2}, "model_type"),
    ({"model_type": "switch_transformers"}, "model_type"),
    ({"model_type": "jamba"}, "model_type"),
    ({"model_type": "deepseek_v32"}, "model_type"),
    ({"architectures": ["X"]}, "model_type"),
    ({"model_type": "mixtral", "num_hidden_layers": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
      "num_attention_heads": 4, "hidden_size": -64, "vocab_size": 10, "intermediate_size": 8}, "hidden_size"),
    ({"model_type": "mixtral", "num_hidden_layers": 2, "num_experts_per_tok": 2, "hidden_size": 64,
      "num_attention_heads": 4, "vocab_size": 10, "intermediate_size": 8}, "num_experts"),
    ({"model_type": "mixtral", "num_hidden_layers": 2, "num_local_experts": 2, "num_experts_per_tok": 4,
      "num_attention_heads": 4, "hidden_size": 64, "vocab_size": 10, "intermediate_size": 8}, "num_experts_per_tok"),
])
def test_refused_configs_name_the_field(cfg, field):
    with pytest.raises(UserError) as e:
        spec_from_config(cfg, "x", "cfg.json")
    assert e.value.field == field and "\n" not in e.value.line()


def test_unknown_model_name_is_one_line():
    with pytest.raises(UserError) as e:
        load_spec("no-such-model")
    assert "kimi-k3.1-pro" in e.value.fix


def test_config_path_and_folder(tmp_path):
    src = load_spec("olmoe-1b-7b").source
    (tmp_path / "config.json").write_text(open(src).read())
    assert load_spec(str(tmp_path)).total_params == load_spec("olmoe-1b-7b").total_params
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError):
        load_spec(str(tmp_path / "bad.json"))
