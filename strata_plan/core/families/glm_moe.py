"""GLM-4.5/4.6/4.7 MoE (planned, not run): GQA (optional q/k norm), DeepSeek-V3's router (sigmoid, grouped,
correction bias), shared experts, `first_k_dense_replace` dense layers."""
from __future__ import annotations

from strata_plan.core.families.base import Family
from strata_plan.core.families.deepseek import TENSORS, read_deepseek

FAMILY = Family("glm4_moe", "GLM-4 MoE", ("glm4_moe",), read_deepseek, router="sigmoid_grouped",
                attention="gqa", llama_cpp_arch="glm4moe", tensors=TENSORS)
