"""Attention of one layer over the static cache: MLA (DeepSeek-V3 family) and GQA (Qwen3-MoE, Mixtral).

Each call takes the normalised hidden states x [T, H] of positions start..start+T-1, writes their keys
(MLA: the compressed latent) into the cache and attends over positions 0..start+T-1.

MLA, two forms that compute the same thing:
- expanded (prefill chunks): every cached latent is expanded by `kv_b_proj` into per-head keys and
  values, then scaled-dot-product attention. Cheaper when a chunk has many queries.
- absorbed (decode, the default for T = 1): `kv_b_proj`'s key half is folded into the query
  (q_lat[h] = W_uk[h]^T q_nope[h], [heads, kv_lora_rank]) and its value half applied after the
  weighted sum, so the scores are one product of [T*heads, rank + rope] queries with the cached rows
  [S, rank + rope] and nothing is expanded: reads S * (rank + rope) values a layer.

Static decode (`at` given: an int64 [1] device tensor holding the query's position): rope, the cache
write and the mask read the position on the device and the query attends over the whole cache with
later positions masked, so every shape is fixed and the step can be captured in a CUDA graph (it reads
the whole context's cache, not only the filled part).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .kv import GQACache, MLACache, hidden_at
from .layers import rms_norm
from .rope import RotaryTable


def visible(start: int, t: int, window: int, device) -> torch.Tensor | None:
    """bool [T, S] (True = attend) for queries start..start+T-1 over keys 0..start+T-1: causal, and within
    `window` positions when window > 0. None when every key is visible (a single query, no window)."""
    s = start + t
    if t == 1 and (window <= 0 or s <= window):
        return None
    q = torch.arange(start, s, device=device)[:, None]
    k = torch.arange(s, device=device)[None, :]
    m = k <= q
    if window > 0:
        m &= k > q - window
    return m


def visible_at(positions: torch.Tensor, at: torch.Tensor, window: int) -> torch.Tensor:
    """bool [1, context]: the keys a query at device position `at` sees (static decode)."""
    m = positions[None, :] <= at[:, None]
    if window > 0:
        m &= positions[None, :] > at[:, None] - window
    return m


def _softmax_v(scores: torch.Tensor, hidden: torch.Tensor | None, v: torch.Tensor) -> torch.Tensor:
    """softmax(scores masked) @ v: scores [..., T, S] (any dtype; softmax in float32, as transformers'
    eager attention), hidden (bool, broadcast to scores: True where a key is not seen) or None, v [..., S, Dv]."""
    scores = scores.float()
    if hidden is not None:
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, window: int, scale: float) -> torch.Tensor:
    """q [heads, T, D], k [heads, S, D], v [heads, S, Dv] -> [heads, T, Dv], queries at start..start+T-1."""
    t = q.shape[1]
    if start == 0 and (window <= 0 or t <= window):          # plain causal: lets CUDA pick a fused kernel
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible(start, t, window, q.device), scale=scale)


class MLAAttention:
    def __init__(self, cfg: ModelConfig, src, layer: int, device, dtype: torch.dtype):
        a = cfg.spec.attention
        p = f"model.layers.{layer}.self_attn."
        bias = cfg.attention_bias

        def w(name: str, b: bool = False):
            return src.get(p + name + ".weight", device, dtype), (src.get(p + name + ".bias", device, dtype) if b else None)

        self.layer, self.heads, self.eps = layer, a.heads, cfg.rms_eps
        self.nope, self.rope_dim, self.rank, self.v_dim = a.qk_nope_head_dim, a.qk_rope_head_dim, a.kv_lora_rank, a.v_head_dim
        self.scale = cfg.softmax_scale
        if a.q_lora_rank:
            self.q_a, self.q_a_b = w("q_a_proj", bias)
            self.q_a_norm = src.get(p + "q_a_layernorm.weight", device, dtype)
            self.q_b, _ = w("q_b_proj")
            self.q = None
        else:
            self.q, _ = w("q_proj")
        self.kv_a, self.kv_a_b = w("kv_a_proj_with_mqa", bias)
        self.kv_norm = src.get(p + "kv_a_layernorm.weight", device, dtype)
        self.kv_b, _ = w("kv_b_proj")                                        # [heads * (nope + v), rank]
        for name, t in self.derived().items():            # w_uk [heads, nope, rank], w_uv [heads, v, rank]
            setattr(self, name, t.contiguous())
        self.o, self.o_b = w("o_proj", bias)

    def derived(self) -> dict[str, torch.Tensor]:
        """The tensors made at load from the checkpoint's, as views of their source (kv_b_proj's key and
        value halves per head); `engine.dense` streams kv_b only and refills these on the device."""
        kv_b = self.kv_b.view(self.heads, self.nope + self.v_dim, self.rank)
        return {"w_uk": kv_b[:, :self.nope], "w_uv": kv_b[:, self.nope:]}

    def __call__(self, x: torch.Tensor, start: int, cache: MLACache, rope: RotaryTable,
                 absorbed: bool | None = None, at: torch.Tensor | None = None) -> torch.Tensor:
        t, h, r = x.shape[0], self.heads, self.rank
        if self.q is not None:
            q = F.linear(x, self.q)
        else:
            q = F.linear(rms_norm(F.linear(x, self.q_a, self.q_a_b), self.q_a_norm, self.eps), self.q_b)
        q = q.view(t, h, self.nope + self.rope_dim)
        q_nope, q_rope = q[..., :self.nope], rope.apply(q[..., self.nope:], start, at)      # [T, H, nope], [T, H, rope]
        ckv = F.linear(x, self.kv_a, self.kv_a_b)                                             # [T, rank + rope]
        latent = rms_norm(ckv[:, :r], self.kv_norm, self.eps)
        k_rope = rope.apply(ckv[:, None, r:], start, at)[:, 0]
        if at is None:
            cache.write(self.layer, start, latent, k_rope)
            s = start + t
        else:
            cache.write_at(self.layer, at, latent, k_rope)
            s, absorbed = cache.rows.shape[1], True
        rows = cache.view(self.layer, s)                                                      # [S, rank + rope]
        if absorbed if absorbed is not None else t == 1:
            if at is None:
                mask = visible(start, t, 0, x.device)
                hidden = None if mask is None else ~mask[:, None, :]
            else:
                hidden = hidden_at(cache, at, self.layer)[:, None, :]                         # once a step
            q_lat = torch.einsum("thn,hnr->thr", q_nope, self.w_uk)                           # [T, H, rank]
            qc = torch.cat([q_lat, q_rope], dim=-1).view(t, h, r + self.rope_dim)
            scores = (qc.reshape(t * h, -1) @ rows.T).view(t, h, s) * self.scale              # [T, H, S]
            o_lat = _softmax_v(scores, hidden, rows[:, :r])                                   # [T, H, rank]
            o = torch.einsum("thr,hvr->thv", o_lat, self.w_uv)                                # [T, H, v]
        else:
            kv = F.linear(rows[:, :r], self.kv_b).view(s, h, self.nope + self.v_dim)
            k = torch.cat([kv[..., :self.nope], rows[:, None, r:].expand(s, h, self.rope_dim)], dim=-1)
            qf = torch.cat([q_nope, q_rope], dim=-1)
            o = _sdpa(qf.transpose(0, 1), k.transpose(0, 1), kv[..., self.nope:].transpose(0, 1), start, 0,
                      self.scale).transpose(0, 1)                                             # [T, H, v]
        return F.linear(o.reshape(t, h * self.v_dim), self.o, self.o_b)


class GQAAttention:
    def __init__(self, cfg: ModelConfig, src, layer: int, device, dtype: torch.dtype):
        a = cfg.spec.attention
        p = f"model.layers.{layer}.self_attn."
        bias = cfg.attention_bias

        def w(name: str):
            return src.get(p + name + ".weight", device, dtype), (src.get(p + name + ".bias", device, dtype) if bias else None)

        self.layer, self.heads, self.kv_heads, self.dim, self.eps = layer, a.heads, a.kv_heads, a.head_dim, cfg.rms_eps
        self.scale, self.window = cfg.softmax_scale, cfg.sliding_window
        (self.wq, self.bq), (self.wk, self.bk), (self.wv, self.bv), (self.wo, self.bo) = (w(n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        self.q_norm = src.get(p + "q_norm.weight", device, dtype) if a.qk_norm else None
        self.k_norm = src.get(p + "k_norm.weight", device, dtype) if a.qk_norm else None

    def __call__(self, x: torch.Tensor, start: int, cache: GQACache, rope: RotaryTable,
                 at: torch.Tensor | None = None) -> torch.Tensor:
        t, g = x.shape[0], self.heads // self.kv_heads
        q = F.linear(x, self.wq, self.bq).view(t, self.heads, self.dim)
        k = F.linear(x, self.wk, self.bk).view(t, self.kv_heads, self.dim)
        v = F.linear(x, self.wv, self.bv).view(t, self.kv_heads, self.dim)
        if self.q_norm is not None:
            q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        q, k = rope.apply(q, start, at), rope.apply(k, start, at)
        if at is None:
            cache.write(self.layer, start, k, v)
            s = start + t
        else:
            cache.write_at(self.layer, at, k, v)
            s = cache.k.shape[2]
        keys, values = cache.view(self.layer, s)                                              # [KV, S, D]
        if t == 1:
            # query head j reads KV head j // g: [KV, g, D] against [KV, S, D], nothing expanded
            qg = q.view(self.kv_heads, g, self.dim)
            if at is not None and self.window <= 0:
                hidden = hidden_at(cache, at, self.layer)                                     # once a step
            else:
                mask = visible(start, 1, self.window, x.device) if at is None else visible_at(cache.positions, at,
                                                                                             self.window)
                hidden = None if mask is None else ~mask
            o = _softmax_v((qg @ keys.transpose(1, 2)) * self.scale, hidden, values)         # [KV, g, D]
        else:
            keys = keys[:, None].expand(self.kv_heads, g, s, self.dim).reshape(self.heads, s, self.dim)
            values = values[:, None].expand(self.kv_heads, g, s, self.dim).reshape(self.heads, s, self.dim)
            o = _sdpa(q.transpose(0, 1), keys, values, start, self.window, self.scale).transpose(0, 1)   # [T, H, D]
        return F.linear(o.reshape(t, self.heads * self.dim), self.wo, self.bo)


def make_attention(cfg: ModelConfig, src, layer: int, device, dtype: torch.dtype) -> MLAAttention | GQAAttention:
    return (MLAAttention if cfg.is_mla else GQAAttention)(cfg, src, layer, device, dtype)
