"""Llama 4 (planned, not run): the decoder's fields under `text_config`; GQA, sigmoid top-1 routing, one shared
expert in every MoE layer, MoE layers every `interleave_moe_layer_step` (or listed in `moe_layers`)."""
from __future__ import annotations

from strata_plan.core.families.base import Family
from strata_plan.core.geometry import AttentionSpec, Cfg, Geometry


def read_llama4(c: Cfg) -> Geometry:
    n_layers = c.int("num_hidden_layers")
    step = c.int("interleave_moe_layer_step", 1)
    moe_set = set(c.get("moe_layers") or range(step - 1, n_layers, step))
    kinds = ["moe" if i in moe_set else "dense" for i in range(n_layers)]
    heads = c.int("num_attention_heads")
    att = AttentionSpec("gqa", heads, c.int("num_key_value_heads", heads), c.get("head_dim") or c.int("hidden_size") // heads,
                        qkv_bias=bool(c.get("attention_bias", False)), qk_norm=bool(c.get("use_qk_norm", False)))
    return Geometry(attention=att, layer_kinds=tuple(kinds), n_routed=c.int("num_local_experts"),
                    top_k=c.int("num_experts_per_tok"), moe_intermediate=c.int("intermediate_size"),
                    shared_intermediate=c.int("intermediate_size"),
                    dense_intermediate=c.int("intermediate_size_mlp", c.get("intermediate_size")))


FAMILY = Family("llama4", "Llama-4", ("llama4",), read_llama4, router="sigmoid_topk", attention="gqa",
                llama_cpp_arch="llama4", text_config=True)
