"""The router lookahead's gate in two launches: MoE layer jj's post-attention norm and router applied to layer j's
output, its top-k ids and weights written straight into the guess buffers of the device loop.

    gate_logits(x, norm_w, eps, router_w, logits)          # launch 1: logits float32 [E]
    gate_topk(logits, rc, bias, ids_out, scores_out, dtype) # launch 2: ids int64 [k], weights float32 [k]
    lookahead_gate(x, norm_w, eps, router, logits, ids_out, scores_out)   # both

The same arithmetic as `engine.layers.rms_norm` then `engine.routing.Router` (the plain reference the tests hold
these to), in 2 launches instead of the ~22 small torch kernels that path takes on a GPU:

- `gate_logits_kernel` (grid cdiv(E, BE)): each program recomputes the row's mean of squares (H values, float32),
  normalises as rms_norm does (x * rstd rounded to the model dtype, times the norm weight, rounded again) and dots
  BE router rows with it in float32 (a bf16 router's logits rounded to bf16, as F.linear returns them).
- `gate_topk_kernel` (one program): scores (DeepSeek: sigmoid, plus the correction bias for the choice, the group
  limit when n_group > 1; Qwen3 / Mixtral: softmax), top-k by k rounds of argmax (the lowest id on a tie), the
  weights (normalised, scaled; Qwen3's rounded to the model dtype), written best first by weight.

Guesses only steer prefetches: a near-tie ordered otherwise than torch's topk changes which bytes cross the link
early, never a result.
"""
from __future__ import annotations

import torch

from .norm import TL_DTYPES, round_to
from .triton_common import tl, triton


@triton.jit
def gate_logits_kernel(x_p, norm_p, w_p, out_p, H, E, eps, XDT: tl.constexpr, ROUND_LOGITS: tl.constexpr,
                       BE: tl.constexpr, BH: tl.constexpr):
    # x_p: [H] one token's residual stream (model dtype); norm_p: [H]; w_p: [E, H] router rows; out_p: float32 [E]
    pid = tl.program_id(0)
    hh = tl.arange(0, BH)
    ss = tl.zeros([BH], tl.float32)
    for h0 in range(0, H, BH):                                                  # mean of squares, float32
        xv = tl.load(x_p + h0 + hh, mask=h0 + hh < H, other=0.0).to(tl.float32)
        ss += xv * xv
    rstd = tl.math.rsqrt(tl.sum(ss, 0) / H + eps)                              # as kernels.norm
    ee = pid * BE + tl.arange(0, BE)                                            # [BE] this program's experts
    acc = tl.zeros([BE, BH], tl.float32)
    for h0 in range(0, H, BH):
        m = h0 + hh < H
        xv = tl.load(x_p + h0 + hh, mask=m, other=0.0).to(tl.float32)
        nw = tl.load(norm_p + h0 + hh, mask=m, other=0.0).to(tl.float32)
        y = round_to(nw * round_to(xv * rstd, XDT), XDT)                          # [BH] rms_norm's rounding
        w = tl.load(w_p + ee[:, None] * H + h0 + hh[None, :], mask=(ee[:, None] < E) & m[None, :],
                    other=0.0).to(tl.float32)                                  # [BE, BH]
        acc += w * y[None, :]
    logit = tl.sum(acc, 1)                                                      # [BE]
    if ROUND_LOGITS:
        logit = round_to(logit, XDT)
    tl.store(out_p + ee, logit, mask=ee < E)


@triton.jit
def gate_topk_kernel(logits_p, bias_p, ids_p, scores_p, E, scaling, SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr,
                     NG: tl.constexpr, TG: tl.constexpr, NORM: tl.constexpr, ROUND_W: tl.constexpr,
                     XDT: tl.constexpr, K: tl.constexpr, KB: tl.constexpr, EB: tl.constexpr):
    # logits_p: float32 [E]; ids_p: int64 [>= K], scores_p: float32 [>= K] (the guess row); one program
    ee = tl.arange(0, EB)
    valid = ee < E
    lg = tl.load(logits_p + ee, mask=valid, other=-float("inf"))
    if SIGMOID:
        choice = 1.0 / (1.0 + tl.exp(-lg))
        if HAS_BIAS:
            choice = choice + tl.load(bias_p + ee, mask=valid, other=0.0)
    else:
        mx = tl.max(lg, 0)
        p = tl.exp(lg - mx)
        den_p = tl.sum(tl.where(valid, p, 0.0), 0)
        choice = p / den_p
    choice = tl.where(valid, choice, -float("inf"))
    if NG > 1:                                       # DeepSeek's group limit: the TG groups of best top-2 sums
        grp = ee // (E // NG)
        gg = tl.arange(0, NG)
        gsum = tl.zeros([NG], tl.float32)
        for g in tl.static_range(NG):
            c = tl.where(grp == g, choice, -float("inf"))
            m1 = tl.max(c, 0)
            i1 = tl.min(tl.where(c == m1, ee, EB), 0)
            m2 = tl.max(tl.where(ee == i1, -float("inf"), c), 0)
            gsum = tl.where(gg == g, m1 + m2, gsum)
        keep = gg < 0
        for _ in tl.static_range(TG):
            best = tl.max(gsum, 0)
            gi = tl.min(tl.where(gsum == best, gg, NG), 0)
            keep = keep | (gg == gi)
            gsum = tl.where(gg == gi, -float("inf"), gsum)
        kept = tl.sum(tl.where(keep[None, :] & (grp[:, None] == gg[None, :]), 1, 0), 1) > 0     # [EB]
        choice = tl.where(kept, choice, -float("inf"))
    # top-k by choice: k rounds of one max each over int64 keys (the value's bits ordered as a signed int, above the
    # lane's rank from the end: the lowest id wins a tie), then the weights gathered for the k ids
    cb = choice.to(tl.int32, bitcast=True)
    key = ((cb ^ ((cb >> 31) & 0x7FFFFFFF)).to(tl.int64) << 32) | (EB - 1 - ee).to(tl.int64)     # [EB]
    kk = tl.arange(0, KB)
    ids = tl.zeros([KB], tl.int64) - 1
    for i in tl.static_range(K):
        best = tl.max(key, 0)
        ids = tl.where(kk == i, EB - 1 - (best & 0xFFFFFFFF), ids)
        key = tl.where(key == best, -0x7FFFFFFFFFFFFFFF, key)     # below every key
    mk = kk < K
    lk = tl.load(logits_p + tl.maximum(ids, 0), mask=mk, other=0.0)                        # [KB] the chosen logits
    if SIGMOID:
        w = 1.0 / (1.0 + tl.exp(-lk))
    else:
        w = tl.exp(lk - mx) / den_p                                                    # as `choice`
    w = tl.where(mk, w, 0.0)
    if NORM:
        den = tl.sum(w, 0)
        if SIGMOID:
            den += 1e-20
        w = w / den
    w = w * scaling
    if ROUND_W:
        w = round_to(w, XDT)
    # best first by weight, a stable sort: each id's place is the count of those before it (larger, or equal and
    # earlier), all at once
    w = tl.where(mk, w, -float("inf"))
    before = (w[None, :] > w[:, None]) | ((w[None, :] == w[:, None]) & (kk[None, :] < kk[:, None]))     # [KB, KB]
    place = tl.sum(before.to(tl.int32), 1)
    tl.store(ids_p + place, ids, mask=mk)
    tl.store(scores_p + place, w, mask=mk)


def gate_logits(x: torch.Tensor, norm_w: torch.Tensor, eps: float, router_w: torch.Tensor,
                logits: torch.Tensor) -> None:
    """logits float32 [E] = router_w [E, H] . rms_norm(x [H] or [1, H], norm_w): one launch."""
    E, H = router_w.shape
    be = 4 if H >= 2048 else 16
    gate_logits_kernel[(triton.cdiv(E, be),)](x, norm_w, router_w, logits, H, E, eps, XDT=TL_DTYPES[x.dtype],
                                              ROUND_LOGITS=router_w.dtype != torch.float32, BE=be,
                                              BH=min(1024, triton.next_power_of_2(H)), num_warps=4)


def gate_topk(logits: torch.Tensor, rc, bias: torch.Tensor | None, ids_out: torch.Tensor, scores_out: torch.Tensor,
              dtype: torch.dtype) -> None:
    """The router's top-k of float32 logits [E] (`rc`: engine.config.RouterConfig) into ids_out int64 [>= k] and
    scores_out float32 [>= k], best first by weight: one launch."""
    sigmoid = rc.kind == "sigmoid_grouped"
    if sigmoid and rc.n_group & (rc.n_group - 1):
        raise ValueError(f"gate_topk: n_group {rc.n_group} is not a power of two")
    gate_topk_kernel[(1,)](logits, bias if bias is not None else logits, ids_out, scores_out, rc.n_experts,
                           float(rc.scaling if sigmoid else 1.0), SIGMOID=sigmoid, HAS_BIAS=sigmoid and bias is not None,
                           NG=rc.n_group if sigmoid else 1, TG=rc.topk_group if sigmoid else 1,
                           NORM=bool(rc.norm_topk_prob), ROUND_W=bool(rc.round_weights) and not sigmoid,
                           XDT=TL_DTYPES[dtype], K=rc.top_k, KB=triton.next_power_of_2(rc.top_k),
                           EB=triton.next_power_of_2(rc.n_experts), num_warps=1 if rc.n_experts <= 1024 else 4)


def lookahead_gate(x: torch.Tensor, norm_w: torch.Tensor, eps: float, router, logits: torch.Tensor,
                   ids_out: torch.Tensor, scores_out: torch.Tensor) -> None:
    """`router` (engine.routing.Router) of rms_norm(x, norm_w) for one token: ids and weights into the guess row."""
    gate_logits(x, norm_w, eps, router.weight, logits)
    gate_topk(logits, router.rc, router.bias, ids_out, scores_out, x.dtype)
