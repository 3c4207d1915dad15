"""FP8 block-quantized checkpoint weights (DeepSeek-V3, R1, Kimi-K2) back to floating point.

Those checkpoints store a linear weight W [N, K] as `float8_e4m3fn` codes `X.weight` and one float32 factor per
128 x 128 block, `X.weight_scale_inv` [ceil(N / 128), ceil(K / 128)] (the block size is the config's
`quantization_config.weight_block_size`); despite the name the factor multiplies:

    W[n, k] = float(X.weight[n, k]) * X.weight_scale_inv[n // bn, k // bk]

(DeepSeek-V3's own `weight_dequant`). `strata-plan pack` dequantizes on the fly: routed experts to float32 for
the quantizer, everything else to BF16 in dense.safetensors; scale tensors are never carried over.
"""
from __future__ import annotations

import math

SCALE_SUFFIX = "_scale_inv"
DEFAULT_BLOCK = (128, 128)


def block_size(config: dict) -> tuple[int, int]:
    """(bn, bk) of an HF config's FP8 block quantization (128 x 128 when it does not say)."""
    q = config.get("quantization_config") or {}
    b = q.get("weight_block_size") or DEFAULT_BLOCK
    return int(b[0]), int(b[1])


def is_fp8(dtype) -> bool:
    import torch
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def scale_shape(shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, int]:
    return math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])


def dequant_block_fp8(w, scale_inv, block: tuple[int, int] = DEFAULT_BLOCK, dtype=None):
    """W [N, K] fp8 codes times its per-block factors scale_inv [ceil(N/bn), ceil(K/bk)] -> [N, K] in `dtype`
    (float32 by default), on w's device."""
    import torch
    n, k = w.shape
    bn, bk = block
    s = scale_inv.to(device=w.device, dtype=torch.float32)
    s = s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]       # [N, K]
    return (w.to(torch.float32) * s).to(dtype or torch.float32)
