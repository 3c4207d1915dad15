"""gpt-oss (planned, not run): GQA with biases and alternating sliding-window layers, top-k then softmax with a
router bias, expert projections with biases, MXFP4 experts as released."""
from __future__ import annotations

from functools import partial

from strata_plan.core.families.base import Family
from strata_plan.core.families.mixtral import read_sparse

FAMILY = Family("gpt_oss", "gpt-oss", ("gpt_oss",), partial(read_sparse, openai=True), router="softmax_topk",
                attention="gqa", llama_cpp_arch="gpt-oss")
