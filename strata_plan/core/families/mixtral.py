"""Mixtral (the engine runs it): GQA (optional sliding window), softmax over all experts, top-k renormalised,
every layer MoE. `read_sparse` reads the configs that name their experts Mixtral's way (`num_local_experts` or
`num_experts`, `num_experts_per_tok`), with each family's own options."""
from __future__ import annotations

from strata_plan.core.families.base import Family, TensorNames
from strata_plan.core.geometry import AttentionSpec, Cfg, Geometry
from strata_plan.errors import UserError


def read_sparse(c: Cfg, *, sparse_step: bool = False, attention_bias: bool = False, qk_norm: bool = False,
                openai: bool = False) -> Geometry:
    """sparse_step: Qwen-MoE's `decoder_sparse_step`, `mlp_only_layers` and shared expert; attention_bias: the
    default of `attention_bias`; qk_norm: per-head q/k RMSNorm; openai: gpt-oss's o_proj bias, router and expert
    biases, and sliding-window layers (`layer_types`)."""
    n_layers = c.int("num_hidden_layers")
    n_exp = c.get("num_local_experts") or c.get("num_experts")
    if not n_exp:
        raise UserError(c.where, "num_experts", "missing", "an MoE config names its routed experts (num_experts or num_local_experts)")
    top_k = c.int("num_experts_per_tok", c.get("experts_per_token"))
    kinds = ["moe"] * n_layers
    shared = 0
    moe_i = c.int("moe_intermediate_size", c.get("intermediate_size"))
    if sparse_step:
        step = c.int("decoder_sparse_step", 1)
        only = set(c.get("mlp_only_layers", []) or [])
        kinds = ["moe" if (i not in only and (i + 1) % step == 0) else "dense" for i in range(n_layers)]
        shared = int(c.get("shared_expert_intermediate_size", 0) or 0)
    heads = c.int("num_attention_heads")
    hd = c.get("head_dim") or c.int("hidden_size") // heads
    bias = bool(c.get("attention_bias", attention_bias))
    att = AttentionSpec("gqa", heads, c.int("num_key_value_heads", heads), hd, qkv_bias=bias, o_bias=bias and openai,
                        qk_norm=qk_norm, sliding_window=int(c.get("sliding_window", 0) or 0) if openai else 0)
    sliding = tuple(t == "sliding_attention" for t in c.get("layer_types", [])) if openai else ()
    return Geometry(attention=att, layer_kinds=tuple(kinds), n_routed=int(n_exp), top_k=top_k, moe_intermediate=moe_i,
                    shared_intermediate=shared, dense_intermediate=c.int("intermediate_size"), router_bias=openai,
                    expert_bias=openai, sliding_layers=sliding)


FAMILY = Family("mixtral", "Mixtral", ("mixtral",), read_sparse, router="softmax_topk", attention="gqa",
                llama_cpp_arch="llama", runs=True,
                tensors=TensorNames(experts=(("block_sparse_moe.experts", ("w1", "w3", "w2")),),
                                    router=("block_sparse_moe.gate", "mlp.gate")))
