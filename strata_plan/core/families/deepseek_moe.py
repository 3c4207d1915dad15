"""DeepSeek-MoE, the first DeepSeek MoE (`model_type` deepseek; planned, not run): multi-head attention, softmax
top-k, shared experts, `first_k_dense_replace` dense layers."""
from __future__ import annotations

from strata_plan.core.families.base import Family
from strata_plan.core.families.deepseek import TENSORS, read_deepseek

FAMILY = Family("deepseek_moe", "DeepSeek-MoE", ("deepseek",), read_deepseek, router="softmax_topk",
                attention="gqa", llama_cpp_arch="deepseek", tensors=TENSORS)
