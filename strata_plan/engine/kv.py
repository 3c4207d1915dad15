"""Static key/value caches of a whole context, allocated once.

MLA (DeepSeek-V3 family) caches the compressed latent: per token and layer the normalised
`kv_lora_rank` latent and the rotated `qk_rope_head_dim` key, one row of `kv_lora_rank +
qk_rope_head_dim` values shared by every head; exactly what `ModelSpec.kv_cache_bytes` counts (at BF16,
2 bytes a value). GQA caches rotated keys and values per KV head: `2 * kv_heads * head_dim` values.

Positions are written either at host integers (`write`, slices) or at positions held on the device
(`write_at`, for a decode step with static shapes that a CUDA graph can capture).
"""
from __future__ import annotations

import torch

from .config import ModelConfig


class MLACache:
    def __init__(self, cfg: ModelConfig, context: int, device, dtype: torch.dtype):
        a = cfg.spec.attention
        self.rank = a.kv_lora_rank
        self.rows = torch.zeros(cfg.n_layers, context, a.kv_lora_rank + a.qk_rope_head_dim, device=device, dtype=dtype)
        self.positions = torch.arange(context, device=device)                    # for masks over the whole cache
        self._hidden = torch.zeros(1, context, dtype=torch.bool, device=device)

    @property
    def values_per_token_layer(self) -> int:
        return self.rows.shape[-1]

    def write(self, layer: int, start: int, latent: torch.Tensor, k_rope: torch.Tensor) -> None:
        """latent [T, rank], k_rope [T, rope] for positions start..start+T-1."""
        t = latent.shape[0]
        self.rows[layer, start:start + t, :self.rank] = latent
        self.rows[layer, start:start + t, self.rank:] = k_rope

    def write_at(self, layer: int, at: torch.Tensor, latent: torch.Tensor, k_rope: torch.Tensor) -> None:
        """The same at positions given on the device (int64 [T]): no host integer, graph-capturable."""
        self.rows[layer].index_copy_(0, at, torch.cat([latent, k_rope], dim=-1))

    def view(self, layer: int, length: int) -> torch.Tensor:
        """[length, rank + rope]: latent then rotated key of positions 0..length-1."""
        return self.rows[layer, :length]


class GQACache:
    def __init__(self, cfg: ModelConfig, context: int, device, dtype: torch.dtype):
        a = cfg.spec.attention
        self.k = torch.zeros(cfg.n_layers, a.kv_heads, context, a.head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.positions = torch.arange(context, device=device)
        self._hidden = torch.zeros(1, context, dtype=torch.bool, device=device)

    @property
    def values_per_token_layer(self) -> int:
        return 2 * self.k.shape[1] * self.k.shape[3]

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [T, kv_heads, head_dim] for positions start..start+T-1."""
        t = k.shape[0]
        self.k[layer, :, start:start + t] = k.transpose(0, 1)
        self.v[layer, :, start:start + t] = v.transpose(0, 1)

    def write_at(self, layer: int, at: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """The same at positions given on the device (int64 [T]): no host integer, graph-capturable."""
        self.k[layer].index_copy_(1, at, k.transpose(0, 1))
        self.v[layer].index_copy_(1, at, v.transpose(0, 1))

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [kv_heads, length, head_dim]."""
        return self.k[layer, :, :length], self.v[layer, :, :length]


def hidden_at(cache, at: torch.Tensor, layer: int) -> torch.Tensor:
    """bool [1, context], True at the keys a static-step query at device position `at` must not see (those after it):
    computed by the step's layer 0 (every static step runs it first) into one buffer the later layers read, so a step
    takes one launch for its mask, not three a layer."""
    if layer == 0:
        torch.gt(cache.positions[None, :], at[:, None], out=cache._hidden)
    return cache._hidden


def make_cache(cfg: ModelConfig, context: int, device, dtype: torch.dtype) -> MLACache | GQACache:
    cache = (MLACache if cfg.is_mla else GQACache)(cfg, context, device, dtype)
    assert 2 * cache.values_per_token_layer == cfg.spec.attention.kv_bytes_per_token_layer   # BF16 bytes, as planned
    return cache
