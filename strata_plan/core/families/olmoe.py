"""OLMoE (planned, not run): GQA with q/k RMSNorm, softmax top-k, every layer MoE."""
from __future__ import annotations

from functools import partial

from strata_plan.core.families.base import Family
from strata_plan.core.families.mixtral import read_sparse

FAMILY = Family("olmoe", "OLMoE", ("olmoe",), partial(read_sparse, qk_norm=True), router="softmax_topk",
                attention="gqa", llama_cpp_arch="olmoe")
