"""Qwen1.5/Qwen2-MoE (planned, not run): GQA with q/k/v biases, softmax top-k, one shared expert behind a
sigmoid gate, `decoder_sparse_step` / `mlp_only_layers` dense layers."""
from __future__ import annotations

from functools import partial

from strata_plan.core.families.base import Family, TensorNames
from strata_plan.core.families.mixtral import read_sparse

FAMILY = Family("qwen2_moe", "Qwen2-MoE", ("qwen2_moe",), partial(read_sparse, sparse_step=True, attention_bias=True),
                router="softmax_topk", attention="gqa", llama_cpp_arch="qwen2moe",
                tensors=TensorNames(experts=(("mlp.experts", ("gate_proj", "up_proj", "down_proj")),), router=("mlp.gate",),
                                    shared="mlp.shared_expert", shared_gate="mlp.shared_expert_gate"))
