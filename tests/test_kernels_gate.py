"""The lookahead gate's two kernels (kernels/gate.py: interpreted on a CPU, compiled on a GPU) against the plain
path they replace, `engine.routing.Router` on `engine.layers.rms_norm`: the same ids in the same order, the same
weights but for a bf16 rounding of the norm (an element rounded the other way moves a weight by ~1e-3), for DeepSeek's sigmoid router (with its correction bias, with and without the group
limit) and the softmax routers (Qwen3-MoE's rounded weights, Mixtral's)."""
from __future__ import annotations

import pytest
import torch

from strata_plan.engine.config import RouterConfig
from strata_plan.engine.layers import rms_norm_reference as rms_norm
from strata_plan.engine.routing import Router
from strata_plan.kernels.gate import lookahead_gate

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CASES = {
    "deepseek": (RouterConfig("sigmoid_grouped", 64, 6, True, 2.5, correction_bias=True), 96, torch.float32),
    "deepseek-grouped": (RouterConfig("sigmoid_grouped", 64, 8, True, 2.5, n_group=8, topk_group=4,
                                      correction_bias=True), 160, torch.float32),
    "qwen3": (RouterConfig("softmax_topk", 60, 4, True, round_weights=True), 130, torch.bfloat16),
    "mixtral": (RouterConfig("softmax_topk", 8, 2, True), 64, torch.bfloat16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_fused_gate_is_the_router_on_the_norm(name):
    rc, H, wdt = CASES[name]
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(1, H, generator=g) * 3).to(torch.bfloat16).to(DEV)
    norm = (1 + 0.2 * torch.randn(H, generator=g)).to(torch.bfloat16).to(DEV)
    w = (torch.randn(rc.n_experts, H, generator=g) / H ** 0.5).to(wdt).to(DEV)      # logits of order 1: no ties
    bias = (0.1 * torch.randn(rc.n_experts, generator=g)).to(DEV) if rc.correction_bias else None
    router = Router(rc, w, bias, torch.bfloat16)
    want_ids, want_w = router(rms_norm(x, norm, 1e-6))
    logits = torch.empty(rc.n_experts, dtype=torch.float32, device=DEV)
    ids = torch.full((2 * rc.top_k,), -1, dtype=torch.int64, device=DEV)
    sc = torch.zeros(2 * rc.top_k, dtype=torch.float32, device=DEV)
    lookahead_gate(x, norm, 1e-6, router, logits, ids, sc)
    assert ids[:rc.top_k].tolist() == want_ids[0].tolist()
    assert (ids[rc.top_k:] == -1).all()                    # the rest of the guess row untouched
    torch.testing.assert_close(sc[:rc.top_k], want_w[0], rtol=2 ** -7, atol=2 ** -8)   # a bf16 rounding of the norm
