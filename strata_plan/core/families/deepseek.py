"""DeepSeek-V3 and Kimi-K2 (the engine runs them): MLA, sigmoid scores grouped top-k with the correction bias,
shared experts, `first_k_dense_replace` dense layers. `read_deepseek` also reads DeepSeek-MoE, DeepSeek-V2 and
GLM-4 MoE, whose configs name the same fields."""
from __future__ import annotations

from strata_plan.core.families.base import Family, TensorNames
from strata_plan.core.geometry import AttentionSpec, Cfg, Geometry

TENSORS = TensorNames(experts=(("mlp.experts", ("gate_proj", "up_proj", "down_proj")),), router=("mlp.gate",),
                      shared="mlp.shared_experts")


def read_deepseek(c: Cfg) -> Geometry:
    n_layers = c.int("num_hidden_layers")
    first_dense = c.int("first_k_dense_replace", 0, lo=0)
    freq = c.int("moe_layer_freq", 1)
    kinds = ["moe" if (i >= first_dense and i % freq == 0) else "dense" for i in range(n_layers)]
    heads = c.int("num_attention_heads")
    if c.get("kv_lora_rank"):
        att = AttentionSpec("mla", heads, q_lora_rank=int(c.get("q_lora_rank", 0) or 0), kv_lora_rank=c.int("kv_lora_rank"),
                            qk_nope_head_dim=c.int("qk_nope_head_dim"), qk_rope_head_dim=c.int("qk_rope_head_dim"),
                            v_head_dim=c.int("v_head_dim"))
    else:
        hd = c.get("head_dim") or c.int("hidden_size") // heads
        att = AttentionSpec("gqa", heads, c.int("num_key_value_heads", heads), hd,
                            qkv_bias=bool(c.get("attention_bias", False)), qk_norm=bool(c.get("use_qk_norm", False)))
    n_shared = c.int("n_shared_experts", 0, lo=0)
    moe_i = c.int("moe_intermediate_size")
    return Geometry(attention=att, layer_kinds=tuple(kinds), n_routed=c.int("n_routed_experts"),
                    top_k=c.int("num_experts_per_tok"), moe_intermediate=moe_i, shared_intermediate=n_shared * moe_i,
                    dense_intermediate=c.int("intermediate_size"), router_bias=c.get("topk_method") == "noaux_tc")


FAMILY = Family("deepseek", "DeepSeek-V3/Kimi-K2", ("deepseek_v3", "kimi_k2"), read_deepseek, router="sigmoid_grouped",
                attention="mla", llama_cpp_arch="deepseek2", runs=True, tensors=TENSORS)
