"""Qwen3-MoE (the engine runs it): GQA with per-head q/k RMSNorm, softmax top-k (`norm_topk_prob`),
`decoder_sparse_step` / `mlp_only_layers` dense layers."""
from __future__ import annotations

from functools import partial

from strata_plan.core.families.base import Family, TensorNames
from strata_plan.core.families.mixtral import read_sparse

FAMILY = Family("qwen3_moe", "Qwen3-MoE", ("qwen3_moe",), partial(read_sparse, sparse_step=True, qk_norm=True),
                router="softmax_topk", attention="gqa", llama_cpp_arch="qwen3moe", runs=True,
                tensors=TensorNames(experts=(("mlp.experts", ("gate_proj", "up_proj", "down_proj")),), router=("mlp.gate",)))
