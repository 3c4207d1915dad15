"""The router of one MoE layer: normalised hidden states [M, H] -> top-k expert ids and gate weights.

Ids come back sorted by gate weight, highest first (the order of routing traces, core/routing/TRACE.md),
int64 [M, k] on the hidden states' device; weights float32 [M, k], exactly what the expert sum multiplies
by (DeepSeek: the unbiased sigmoid scores of the chosen experts, normalised, times routed_scaling_factor;
Qwen3-MoE: softmax probabilities, optionally renormalised, rounded to the model dtype as transformers
does; Mixtral: softmax over the top-k logits). Nothing here leaves the device.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import RouterConfig


class Router:
    def __init__(self, rc: RouterConfig, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        self.rc, self.weight, self.bias, self.dtype = rc, weight, bias, dtype
        self._out: tuple[torch.Tensor, ...] | None = None    # `fused`: logits, ids, weights (made at its first call)

    @staticmethod
    def load(rc: RouterConfig, src, prefix: str, device, dtype: torch.dtype) -> "Router":
        """prefix: the gate's module path, e.g. `model.layers.3.mlp.gate`."""
        if rc.kind == "sigmoid_grouped":       # DeepSeek keeps its router and bias in float32
            return Router(rc, src.get(prefix + ".weight", device, torch.float32),
                          src.get(prefix + ".e_score_correction_bias", device, torch.float32), dtype)
        return Router(rc, src.get(prefix + ".weight", device, dtype), None, dtype)

    def fused(self, h: torch.Tensor, norm_w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One token's routing from the residual stream h [1, H] (before the post-attention norm `norm_w`) in two
        launches (`kernels.gate`: the norm and the logits, then the top-k) instead of the ~12 of `rms_norm` then
        this router in torch: ids int64 [1, k] and weights float32 [1, k], the same arithmetic up to float32
        summation order. They live in this router's own buffers, rewritten at its next call (graph-safe: one
        address every step); the MoE call reads them before that."""
        from strata_plan.kernels.gate import lookahead_gate
        if self._out is None or self._out[0].device != h.device:
            k = self.rc.top_k
            self._out = (torch.empty(self.rc.n_experts, dtype=torch.float32, device=h.device),
                         torch.empty(k, dtype=torch.int64, device=h.device),
                         torch.empty(k, dtype=torch.float32, device=h.device))
        logits, ids, w = self._out
        lookahead_gate(h[0], norm_w, eps, self, logits, ids, w)
        return ids.view(1, -1), w.view(1, -1)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rc = self.rc
        if rc.kind == "sigmoid_grouped":
            scores = F.linear(x.float(), self.weight).sigmoid()                              # [M, E]
            choice = scores + self.bias
            if rc.n_group > 1:
                m = x.shape[0]
                grouped = choice.view(m, rc.n_group, -1)
                group_scores = grouped.topk(2, dim=-1)[0].sum(-1)                              # [M, G]
                keep = torch.zeros_like(group_scores, dtype=torch.bool)
                keep.scatter_(1, group_scores.topk(rc.topk_group, dim=-1, sorted=False)[1], True)
                choice = choice.masked_fill(~keep[:, :, None].expand_as(grouped).reshape(m, -1), float("-inf"))
            ids = choice.topk(rc.top_k, dim=-1, sorted=False)[1]
            w = scores.gather(1, ids)
            if rc.norm_topk_prob:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            w = w * rc.scaling
            w, order = torch.sort(w, dim=-1, descending=True, stable=True)
            return ids.gather(1, order), w
        probs = torch.softmax(F.linear(x, self.weight).float(), dim=-1)
        w, ids = probs.topk(rc.top_k, dim=-1)
        if rc.norm_topk_prob:
            w = w / w.sum(-1, keepdim=True)
        if rc.round_weights:
            w = w.to(self.dtype).float()
        return ids, w
