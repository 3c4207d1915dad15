"""Phi-3.5-MoE and GRIN-MoE (planned, not run): GQA, SparseMixer top-2 routing, every layer MoE."""
from __future__ import annotations

from strata_plan.core.families.base import Family
from strata_plan.core.families.mixtral import read_sparse

FAMILY = Family("phimoe", "Phi-MoE", ("phimoe", "grinmoe"), read_sparse, router="sparsemixer", attention="gqa",
                llama_cpp_arch="phimoe")
