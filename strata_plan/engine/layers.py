"""Small pieces every layer uses: RMSNorm and the SwiGLU MLP (dense layers and shared experts)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from strata_plan.kernels.norm import rms_norm as _fused_rms_norm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / rms(x), the mean of squares in float32 (transformers' LlamaRMSNorm and kin). On a GPU one launch
    (`kernels.norm`, the same arithmetic); this expression is its reference and the CPU's path."""
    return _fused_rms_norm(x, weight, eps) if x.is_cuda else rms_norm_reference(x, weight, eps)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class SwiGLU:
    """down(silu(gate(x)) * up(x)); weights [I, H], [I, H], [H, I]."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
        self.gate, self.up, self.down = gate, up, down

    @staticmethod
    def load(src, prefix: str, names: tuple[str, str, str], device, dtype) -> "SwiGLU":
        return SwiGLU(*(src.get(f"{prefix}.{n}.weight", device, dtype) for n in names))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, self.gate)) * F.linear(x, self.up), self.down)
