"""Snowflake Arctic (planned, not run): GQA, softmax top-k, every layer MoE with a dense residual MLP beside the
experts (`use_residual`)."""
from __future__ import annotations

from strata_plan.core.families.base import Family
from strata_plan.core.geometry import AttentionSpec, Cfg, Geometry


def read_arctic(c: Cfg) -> Geometry:
    n_layers = c.int("num_hidden_layers")
    heads = c.int("num_attention_heads")
    att = AttentionSpec("gqa", heads, c.int("num_key_value_heads", heads), c.get("head_dim") or c.int("hidden_size") // heads)
    return Geometry(attention=att, layer_kinds=("moe",) * n_layers, n_routed=c.int("num_local_experts"),
                    top_k=c.int("num_experts_per_tok"), moe_intermediate=c.int("intermediate_size"),
                    shared_intermediate=c.int("intermediate_size") if c.get("use_residual") else 0,
                    dense_intermediate=c.int("intermediate_size"))


FAMILY = Family("arctic", "Arctic", ("arctic",), read_arctic, router="softmax_topk", attention="gqa",
                llama_cpp_arch="arctic")
