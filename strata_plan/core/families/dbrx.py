"""DBRX (planned, not run): its own config spelling (`d_model`, `n_layers`, `ffn_config`, `attn_config`); GQA,
softmax top-k, every layer MoE."""
from __future__ import annotations

from strata_plan.core.families.base import Family
from strata_plan.core.geometry import AttentionSpec, Cfg, Geometry


def read_dbrx(c: Cfg) -> Geometry:
    ffn = Cfg(c.get("ffn_config") or {}, c.where + ":ffn_config")
    attn = Cfg(c.get("attn_config") or {}, c.where + ":attn_config")
    d, heads = c.int("d_model"), c.int("n_heads")
    att = AttentionSpec("gqa", heads, attn.int("kv_n_heads"), d // heads)
    n = c.int("n_layers")
    return Geometry(attention=att, layer_kinds=("moe",) * n, n_routed=ffn.int("moe_num_experts"), top_k=ffn.int("moe_top_k"),
                    moe_intermediate=ffn.int("ffn_hidden_size"), shared_intermediate=0,
                    dense_intermediate=ffn.int("ffn_hidden_size"), hidden=d, vocab=c.int("vocab_size"))


FAMILY = Family("dbrx", "DBRX", ("dbrx",), read_dbrx, router="softmax_topk", attention="gqa",
                llama_cpp_arch="dbrx", layers_field="n_layers")
