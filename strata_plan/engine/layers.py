"""Small pieces every layer uses: RMSNorm and the SwiGLU MLP (dense layers and shared experts)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / rms(x), the mean of squares in float32 (transformers' LlamaRMSNorm and kin)."""
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
