"""What a model family's config reader returns (`core.families`) and what `core.spec.ModelSpec` is built from:
the attention's geometry (`AttentionSpec`), the per-layer and expert widths (`Geometry`), and `Cfg`, the field
access that turns a missing or mistyped config field into one line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from strata_plan.errors import UserError

BF16 = 2  # bytes per parameter of everything that is not a routed expert


@dataclass(frozen=True)
class AttentionSpec:
    kind: Literal["mla", "gqa"]
    heads: int
    kv_heads: int = 0              # gqa
    head_dim: int = 0              # gqa: per-head q/k/v width
    q_lora_rank: int = 0           # mla: 0 = q projected straight from hidden
    kv_lora_rank: int = 0          # mla
    qk_nope_head_dim: int = 0      # mla
    qk_rope_head_dim: int = 0      # mla
    v_head_dim: int = 0            # mla
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    sliding_window: int = 0        # tokens kept by sliding-window layers (0 = none)

    def params(self, hidden: int) -> int:
        if self.kind == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.heads * qk
            else:
                q = hidden * self.heads * qk
            kv = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv += self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.heads * self.v_head_dim * hidden
            return q + kv + o
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        p = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden
        if self.qkv_bias:
            p += q_dim + 2 * kv_dim
        if self.o_bias:
            p += hidden
        if self.qk_norm:
            p += 2 * self.head_dim
        return p

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """KV-cache bytes one token adds to one layer (BF16; MLA caches its compressed latent)."""
        if self.kind == "mla":
            return BF16 * (self.kv_lora_rank + self.qk_rope_head_dim)
        return BF16 * 2 * self.kv_heads * self.head_dim

    def score_flops(self, context: int) -> int:
        """FLOPs of q.k and p.v for one query over `context` cached tokens (MLA in absorbed form)."""
        if self.kind == "mla":
            return 2 * self.heads * context * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * 2 * self.heads * self.head_dim * context


class Cfg:
    """Field access that turns a missing or mistyped config field into one clear line."""

    def __init__(self, data: dict, where: str):
        self.d, self.where = data, where

    def get(self, key: str, default: Any = None) -> Any:
        v = self.d.get(key, default)
        return default if v is None else v

    def int(self, key: str, default: int | None = None, lo: int = 1) -> int:
        v = self.d.get(key, default)
        if v is None:
            raise UserError(self.where, key, "missing field", f"add `{key}` (an integer) to the config")
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise UserError(self.where, key, f"must be an integer >= {lo}, got {v!r}", "correct the config value")
        return v


Geometry = dict
"""A family reader's result: the keyword arguments of `core.spec.ModelSpec` that a family's config names its own
way: attention, layer_kinds, n_routed, top_k, moe_intermediate, shared_intermediate, dense_intermediate, and where
the family has them router_bias, expert_bias, sliding_layers, hidden and vocab (else read from `hidden_size` and
`vocab_size`, the Hugging Face spelling, by `core.spec`)."""
