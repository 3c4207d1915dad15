"""RMSNorm in one launch: `engine.layers.rms_norm`'s arithmetic (transformers' LlamaRMSNorm and kin) for the rows of
a 2-D tensor on a GPU, where the plain torch expression takes seven kernels (to, pow, mean, add, rsqrt, mul, to, mul).

    y = rms_norm(x, weight, eps)       # x [M, D] (rows may be strided: a slice of a wider tensor), weight [D]

Per row (one program): the mean of squares in float32, x * rsqrt(mean + eps) rounded to x's dtype, times the weight
in the dtype torch's promotion gives (`weight * y`). A decoder layer takes two to four of these a token.
"""
from __future__ import annotations

import torch

from .triton_common import tl, triton

TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def round_to(x, DT: tl.constexpr):
    # float32 x rounded to DT, to nearest even, kept in float32. bf16: on the bits (Triton's interpreter truncates a
    # float32 -> bf16 conversion; the GPU rounds): x + 0x7FFF + the kept LSB, low half cleared (finite x)
    if DT == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)
    else:
        return x.to(DT).to(tl.float32)


@triton.jit
def rms_norm_kernel(x_p, stride_x, w_p, out_p, D, eps, XDT: tl.constexpr, ODT: tl.constexpr, BD: tl.constexpr):
    # x_p: [M, D] rows stride_x apart (last dim contiguous); w_p: [D]; out_p: [M, D] contiguous; one program a row
    r = tl.program_id(0)
    d = tl.arange(0, BD)                                                     # [BD]
    m = d < D
    x = tl.load(x_p + r.to(tl.int64) * stride_x + d, mask=m, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, 0) / D + eps)                        # (kernels.gate recomputes it so)
    y = round_to(x * rstd, XDT)                                              # rounded to x's dtype first
    w = tl.load(w_p + d, mask=m, other=0.0).to(tl.float32)
    tl.store(out_p + r.to(tl.int64) * D + d, round_to(w * y, ODT).to(ODT), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / rms(x)) over the last dim of x [..., D] (2-D with a strided row, or any contiguous shape)."""
    D, shape = x.shape[-1], x.shape
    if x.dim() != 2:
        x = x.reshape(-1, D)          # (a copy only if x was not viewable so)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty((x.shape[0], D), dtype=out_dtype, device=x.device)
    if x.shape[0]:
        rms_norm_kernel[(x.shape[0],)](x, x.stride(0), weight, out, D, eps, XDT=TL_DTYPES[x.dtype], ODT=TL_DTYPES[out_dtype],
                                       BD=triton.next_power_of_2(D), num_warps=4 if D <= 2048 else 8)
    return out.reshape(shape)
