"""Granite-MoE (planned, not run): GQA, softmax top-k, every layer MoE."""
from __future__ import annotations

from strata_plan.core.families.base import Family
from strata_plan.core.families.mixtral import read_sparse

FAMILY = Family("granitemoe", "Granite-MoE", ("granitemoe",), read_sparse, router="softmax_topk", attention="gqa",
                llama_cpp_arch="granitemoe")
