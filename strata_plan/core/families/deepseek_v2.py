"""DeepSeek-V2 (planned, not run): MLA, softmax scores with group-limited greedy top-k, shared experts."""
from __future__ import annotations

from strata_plan.core.families.base import Family
from strata_plan.core.families.deepseek import TENSORS, read_deepseek

FAMILY = Family("deepseek_v2", "DeepSeek-V2", ("deepseek_v2",), read_deepseek, router="softmax_grouped",
                attention="mla", llama_cpp_arch="deepseek2", tensors=TENSORS)
