"""Plain-torch references for the Triton kernels, and the baselines the quantizer is judged against.

Nothing here is fast; everything here is obviously right. The kernels are tested against these.

    linear(x, p)                 x [M, K] @ dequantize(p).T in float32
    moe(x, topk_ids, topk_weights, arena, offsets, formats, hidden, intermediate)
                                 the fused MoE call, one token and one expert at a time
    quantize_activations(x, epw) the int8 activation grid the decode kernels use (see KERNELS.md)
    linear_q8(x, p)              `linear` with activations on that grid: what the GEMV kernel computes
    rtn_minmax(w, bits, group)   the baseline quantizer: round-to-nearest, fp16 min/max per group
"""
from __future__ import annotations

from typing import Sequence

import torch

from .formats import FORMAT_CODES
from .quantizer import PackedMatrix, dequantize, group_params, unpack_bits, unpack_expert

XBLOCK = 32          # activations share one int8 scale per 32 inputs


def linear(x: torch.Tensor, p: PackedMatrix) -> torch.Tensor:
    """x [M, K] times the dequantized weight, transposed: [M, N] in float32."""
    return x.float() @ dequantize(p).T


def rtn_minmax(w: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Baseline: round-to-nearest on a min..max grid per group of `group` weights along K, scale and
    zero stored as fp16 (so 2-bit g64 is 2.5 bpw, 1-bit g128 1.25, 4-bit g128 4.25). Returns the
    dequantized weights [N, K] (float32). K must be a multiple of `group`."""
    n, k = w.shape
    levels = (1 << bits) - 1
    g = w.float().reshape(n, k // group, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    s = ((hi - lo) / levels).half().float()
    z = lo.half().float()
    q = torch.where(s > 0, torch.round((g - z) / torch.where(s > 0, s, 1.0)), 0.0).clamp(0, levels)
    return (q * s + z).reshape(n, k)


def relative_output_error(w: torch.Tensor, w_hat: torch.Tensor, x: torch.Tensor) -> float:
    """||x w_hat^T - x w^T|| / ||x w^T|| (Frobenius), in float64."""
    ref = x.double() @ w.double().T
    return float((x.double() @ w_hat.double().T - ref).norm() / ref.norm())


# ---------------------------------------------------------------------------- the decode kernels' grid

def quantize_activations(x: torch.Tensor, kp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] to int8 values and float32 scales, one scale per 32 inputs: x ~ x8 * dx.

    dx = max|x| / 127 over the block, x8 = round-half-away-from-zero(x * 127 / max|x|). K is padded
    with zeros to `kp` (a multiple of 32). Returns x8 [M, kp] (float32 holding integers), dx [M, kp/32]."""
    m, k = x.shape
    xp = torch.zeros(m, kp, dtype=torch.float32, device=x.device)
    xp[:, :k] = x.float()
    blocks = xp.view(m, kp // XBLOCK, XBLOCK)
    amax = blocks.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, 1.0), 0.0)
    v = blocks * inv.unsqueeze(-1)
    x8 = torch.where(v >= 0, v + 0.5, v - 0.5).trunc()
    return x8.view(m, kp), amax / 127.0


def unpack_activation_words(xq: torch.Tensor, kp: int) -> torch.Tensor:
    """The decode kernels' activations on the int8 grid (xq int32 [M, kp/4], four int8 values a word,
    little end first) back to their values: float32 [M, kp]."""
    return xq.contiguous().view(torch.int8).view(xq.shape[0], -1)[:, :kp].float()


def linear_q8(x: torch.Tensor, p: PackedMatrix, grid: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """What the GEMV kernel computes (float64): per group, S * dx * sum(q * x8) - M * sum(x).

    The integer dot product uses activations on the int8 grid (`quantize_activations`, or `grid` =
    (x8 [M, kp], dx [M, kp/32]) as a kernel produced it); the min term uses the exact x."""
    f = p.format
    if f.is_bf16:
        return x.double() @ p.weight.double().T
    kp = p.kp
    x8, dx = grid if grid is not None else quantize_activations(x, max(kp, XBLOCK))
    x8, dx = x8[:, :kp].double(), dx[:, :kp // XBLOCK].double()
    xf = torch.zeros(x.shape[0], kp, dtype=torch.float64, device=x.device)
    xf[:, :x.shape[1]] = x.double()
    q = unpack_bits(p.rows("codes"), f.bits).double()                    # [N, kp]
    S, M = (t.double() for t in group_params(p))                 # [N, G]
    # integer dot per (row, 32-block) scaled by its dx: works because groups and x blocks nest
    step = min(f.group, XBLOCK)
    qx = torch.einsum("nbs,mbs->mnb", q.view(p.n, -1, step), x8.view(x.shape[0], -1, step))
    dxs = dx.repeat_interleave(XBLOCK // step, 1) if step < XBLOCK else dx
    per_step = qx * dxs.unsqueeze(1)                              # [M, N, kp/step]
    per_group = per_step.view(x.shape[0], p.n, -1, f.group // step).sum(-1)
    xsum = xf.view(x.shape[0], -1, f.group).sum(-1)               # [M, G]
    return (per_group * S.unsqueeze(0)).sum(-1) - xsum @ M.T


# ------------------------------------------------------------------------------------------------- MoE

def expert_formats(formats: str | Sequence[str] | torch.Tensor, n_experts: int) -> list[str]:
    """Normalize a `formats` argument (one name, a name per expert, or format codes) to names."""
    if isinstance(formats, str):
        return [formats] * n_experts
    if isinstance(formats, torch.Tensor):
        return [FORMAT_CODES[int(c)] for c in formats.tolist()]
    return list(formats)


def moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, arena: torch.Tensor,
        offsets: torch.Tensor, formats, hidden: int, intermediate: int, q8: bool = False) -> torch.Tensor:
    """The MoE expert call, one token and one expert at a time (float32 [M, H]).

    out[m] = sum_j w[m, j] * down_e(silu(gate_e(x[m])) * up_e(x[m])), e = topk_ids[m, j].
    With q8=True the projections run on the int8 activation grid, as the decode kernels do. An id < 0 is
    a skipped pair: it contributes nothing."""
    names = expert_formats(formats, offsets.numel())
    lin = linear_q8 if q8 else linear
    out = torch.zeros(x.shape[0], hidden, dtype=torch.float64 if q8 else torch.float32, device=x.device)
    for m in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[m, j])
            if e < 0:
                continue
            mats = unpack_expert(arena[int(offsets[e]):], names[e], hidden, intermediate)
            xm = x[m:m + 1]
            h = torch.nn.functional.silu(lin(xm, mats["gate"]).float()) * lin(xm, mats["up"]).float()
            out[m] += float(topk_weights[m, j]) * lin(h, mats["down"])[0].to(out.dtype)
    return out.float()
