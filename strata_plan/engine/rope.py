"""Rotary position embedding: cos/sin tables for every position of the context, built once, and their
application to query/key heads (the half-split layout of Llama/Qwen/Mixtral, or DeepSeek's interleaved
pairs). Default and yarn frequencies, as transformers computes them (`modeling_rope_utils`)."""
from __future__ import annotations

import math

import torch

from .config import RopeConfig, yarn_mscale


def inv_freq(rope: RopeConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies float32 [dim/2], the cos/sin scale)."""
    dim, base = rope.dim, rope.theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if rope.kind == "default":
        return 1.0 / pos_freqs, 1.0
    factor = rope.factor
    attention = rope.attention_factor
    if attention is None:
        if rope.mscale and rope.mscale_all_dim:
            attention = yarn_mscale(factor, rope.mscale) / yarn_mscale(factor, rope.mscale_all_dim)
        else:
            attention = yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(rope.original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp                   # share of the unscaled frequency
    freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return freq, float(attention)


class RotaryTable:
    """cos and sin [positions, dim/2] (float32 math, stored in `dtype`) for positions 0..positions-1."""

    def __init__(self, rope: RopeConfig, positions: int, device, dtype: torch.dtype):
        freq, scale = inv_freq(rope)
        angles = torch.arange(positions, dtype=torch.float32)[:, None] * freq[None, :]   # [P, dim/2]
        self.cos = (angles.cos() * scale).to(device=device, dtype=dtype)
        self.sin = (angles.sin() * scale).to(device=device, dtype=dtype)
        self.interleave = rope.interleave
        self.fused = False      # a static step's rotation in one launch (`kernels.rope`; the engine's kernels on)

    def apply(self, x: torch.Tensor, start: int, at: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate x [T, heads, dim] for positions start..start+T-1 (or, with `at`, an int64 [T] device
        tensor of positions). Interleaved input pairs come out in the half-split layout (as transformers'
        `apply_rotary_pos_emb_interleave`); queries and keys get the same permutation, so their dot
        products are those of the pairwise rotation. With `fused` and `at`, `kernels.rope` computes the same
        values (bit for bit) in one launch."""
        t = x.shape[0]
        if at is not None and self.fused:
            from strata_plan.kernels.rope import rope
            return rope(x, self.cos, self.sin, at, self.interleave)
        if at is None:
            cos, sin = self.cos[start:start + t, None, :], self.sin[start:start + t, None, :]     # [T, 1, dim/2]
        else:
            cos, sin = self.cos.index_select(0, at)[:, None, :], self.sin.index_select(0, at)[:, None, :]
        if self.interleave:
            x1, x2 = x[..., 0::2], x[..., 1::2]
        else:
            half = x.shape[-1] // 2
            x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
