"""Rotary position embedding of a decode step in one launch: `engine.rope.RotaryTable.apply`'s arithmetic for query or
key heads at positions held on the device, where the torch expression takes seven kernels (four products, a
difference, a sum and the concatenation).

    y = rope(x, cos, sin, at, interleave)    # x [T, H, D] (last dim contiguous, rows may be strided), at int64 [T]

Per token (one program): the position's cos and sin rows (the table's dtype), the pairs (interleaved, DeepSeek, or the
two halves, Llama / Qwen / Mixtral), then `x1 cos - x2 sin` and `x2 cos + x1 sin`, each product and each sum rounded to
x's dtype as torch's elementwise kernels round them (bit for bit the torch expression), written half-split.
"""
from __future__ import annotations

import torch

from .norm import TL_DTYPES, round_to
from .triton_common import tl, triton


@triton.jit
def rope_kernel(x_p, sx_t, sx_h, cos_p, sin_p, at_p, out_p, H, HALF: tl.constexpr, BHALF: tl.constexpr,
                BH: tl.constexpr, INTERLEAVE: tl.constexpr, XDT: tl.constexpr):
    # x_p: [T, H, 2 HALF] (strides sx_t, sx_h, 1); cos_p, sin_p: [P, HALF]; at_p: int64 [T]; out_p: [T, H, 2 HALF]
    t = tl.program_id(0)
    pos = tl.load(at_p + t)
    i = tl.arange(0, BHALF)                                                  # [BHALF] pair index
    hh = tl.arange(0, BH)                                                    # [BH] head
    mi, mh = i < HALF, hh < H
    c = tl.load(cos_p + pos * HALF + i, mask=mi, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_p + pos * HALF + i, mask=mi, other=0.0).to(tl.float32)[None, :]
    row = x_p + t.to(tl.int64) * sx_t + hh[:, None].to(tl.int64) * sx_h      # [BH, 1]
    m = mh[:, None] & mi[None, :]
    if INTERLEAVE:
        x1 = tl.load(row + 2 * i[None, :], mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(row + 2 * i[None, :] + 1, mask=m, other=0.0).to(tl.float32)
    else:
        x1 = tl.load(row + i[None, :], mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(row + HALF + i[None, :], mask=m, other=0.0).to(tl.float32)
    o1 = round_to(round_to(x1 * c, XDT) - round_to(x2 * s, XDT), XDT)       # [BH, BHALF]
    o2 = round_to(round_to(x2 * c, XDT) + round_to(x1 * s, XDT), XDT)
    out = out_p + (t.to(tl.int64) * H + hh[:, None]) * (2 * HALF)
    tl.store(out + i[None, :], o1.to(XDT), mask=m)
    tl.store(out + HALF + i[None, :], o2.to(XDT), mask=m)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, at: torch.Tensor, interleave: bool) -> torch.Tensor:
    """x [T, H, D] rotated for positions `at` (int64 [T], on the device): [T, H, D] contiguous, half-split layout."""
    T, H, D = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    if cos.dtype != x.dtype:
        raise ValueError(f"rope: table {cos.dtype} and heads {x.dtype} differ (torch would promote)")
    out = torch.empty((T, H, D), dtype=x.dtype, device=x.device)
    if T:
        rope_kernel[(T,)](x, x.stride(0), x.stride(1), cos, sin, at, out, H, HALF=D // 2,
                          BHALF=triton.next_power_of_2(D // 2), BH=triton.next_power_of_2(H),
                          INTERLEAVE=interleave, XDT=TL_DTYPES[x.dtype], num_warps=4)
    return out
