"""The runtime geometry of a supported MoE decoder, read from its Hugging Face `config.json`.

`ModelConfig.load(path)` takes a checkpoint folder, a packed folder (both hold `config.json`) or the
file itself. Layer kinds, attention widths, expert counts and widths come from the planner's
`ModelSpec` (one reader of configs for the whole project); this module adds what only a forward pass
needs: the family, norms, rotary embedding, the router's rule and the special token ids.

Families the engine runs (`runs` in `core.families`; anything else is refused with one line naming
`model_type` and the families that run), dispatched on the family's router kind:

| family | model_type | attention | router |
|---|---|---|---|
| `deepseek` | deepseek_v3, kimi_k2 | MLA (q_lora_rank may be null), rope interleaved by default, yarn | sigmoid scores + `e_score_correction_bias` for choosing, grouped top-k (`n_group`, `topk_group`), weights from the unbiased scores, `norm_topk_prob`, times `routed_scaling_factor`; shared experts; `first_k_dense_replace` dense layers |
| `qwen3_moe` | qwen3_moe | GQA with per-head q/k RMSNorm | softmax over all experts, top-k, `norm_topk_prob`; `decoder_sparse_step`/`mlp_only_layers` dense layers |
| `mixtral` | mixtral | GQA (optional sliding window) | softmax over all experts, top-k, renormalised (= softmax over the top-k logits) |
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_plan.core.families import FAMILIES, TensorNames, require_runs
from strata_plan.core.spec import ModelSpec, spec_from_config
from strata_plan.errors import UserError


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of the rotated part of each query/key head (`dim` wide)."""

    dim: int
    theta: float
    interleave: bool = False           # DeepSeek: rotate pairs (x0, x1), (x2, x3), ... (transformers' rope_interleave)
    kind: str = "default"              # "default" or "yarn"
    factor: float = 1.0                # yarn
    original_max_positions: int = 0    # yarn
    beta_fast: float = 32.0            # yarn
    beta_slow: float = 1.0             # yarn
    mscale: float = 0.0                # yarn
    mscale_all_dim: float = 0.0        # yarn; DeepSeek also scales the softmax by its mscale squared
    attention_factor: float | None = None   # yarn: explicit cos/sin scale
    truncate: bool = True              # yarn


@dataclass(frozen=True)
class RouterConfig:
    kind: str                          # "sigmoid_grouped" (DeepSeek), "softmax_topk" (Qwen3-MoE, Mixtral)
    n_experts: int
    top_k: int
    norm_topk_prob: bool
    scaling: float = 1.0               # routed_scaling_factor
    n_group: int = 1
    topk_group: int = 1
    correction_bias: bool = False      # e_score_correction_bias (noaux_tc)
    round_weights: bool = False        # Qwen3-MoE: gate weights rounded to the model dtype (as transformers does)


@dataclass(frozen=True)
class ModelConfig:
    family: str
    spec: ModelSpec                    # layer kinds, widths, counts (core/spec.py)
    rms_eps: float
    rope: RopeConfig
    router: RouterConfig
    max_positions: int
    attention_bias: bool = False
    sliding_window: int = 0            # mixtral: keys older than this many positions are masked (0 = none)
    eos_ids: tuple[int, ...] = ()
    bos_id: int | None = None
    source: str = ""

    # ---- derived -------------------------------------------------------------------------------
    @property
    def tensors(self) -> TensorNames:
        """The family's checkpoint tensor names (core.families)."""
        return FAMILIES[self.family].tensors

    @property
    def hidden(self) -> int:
        return self.spec.hidden

    @property
    def vocab(self) -> int:
        return self.spec.vocab

    @property
    def n_layers(self) -> int:
        return self.spec.n_layers

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return self.spec.moe_layers

    @property
    def n_moe_layers(self) -> int:
        return self.spec.n_moe_layers

    @property
    def is_mla(self) -> bool:
        return self.spec.attention.kind == "mla"

    @property
    def softmax_scale(self) -> float:
        """Attention logit scale: 1/sqrt(query-key width), and for DeepSeek with yarn the mscale squared."""
        a = self.spec.attention
        width = a.qk_nope_head_dim + a.qk_rope_head_dim if self.is_mla else a.head_dim
        scale = width ** -0.5
        if self.family == "deepseek" and self.rope.kind == "yarn" and self.rope.mscale_all_dim:
            m = yarn_mscale(self.rope.factor, self.rope.mscale_all_dim)
            scale *= m * m
        return scale

    # ---- reading -------------------------------------------------------------------------------
    @staticmethod
    def load(path: str | Path) -> "ModelConfig":
        p = Path(path)
        p = p / "config.json" if p.is_dir() else p
        try:
            cfg = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(str(p), "", "file not found", "pass a checkpoint or packed folder holding config.json") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(str(p), "", f"not valid JSON ({e.__class__.__name__})", "pass a Hugging Face config.json") from None
        return ModelConfig.from_dict(cfg, str(p))

    @staticmethod
    def from_dict(cfg: dict, where: str = "config.json") -> "ModelConfig":
        mt = cfg.get("model_type")
        fam = require_runs(mt, where)
        family = fam.name
        spec = spec_from_config(cfg, Path(where).parent.name or str(mt), where)
        if cfg.get("hidden_act", "silu") != "silu":
            raise UserError(where, "hidden_act", f"{cfg.get('hidden_act')!r}", "the engine runs SwiGLU (silu) MLPs")
        a = spec.attention
        if fam.router == "sigmoid_grouped":
            if a.kind != "mla":
                raise UserError(where, "kv_lora_rank", "missing: DeepSeek-V3 attention is MLA", "use a config with MLA")
            scoring = cfg.get("scoring_func", "sigmoid")
            method = cfg.get("topk_method", "noaux_tc")
            if scoring != "sigmoid" or method != "noaux_tc":
                raise UserError(where, "topk_method", f"{scoring}/{method}", "the engine routes DeepSeek-V3's "
                                "sigmoid scores with noaux_tc (grouped top-k with the correction bias)")
            # missing fields take transformers' DeepseekV3Config defaults
            n_group, topk_group = int(cfg.get("n_group", 8) or 1), int(cfg.get("topk_group", 4) or 1)
            if spec.n_routed % n_group or topk_group > n_group:
                raise UserError(where, "n_group", f"{spec.n_routed} experts in {n_group} groups, {topk_group} kept",
                                "correct the config")
            router = RouterConfig("sigmoid_grouped", spec.n_routed, spec.top_k, bool(cfg.get("norm_topk_prob", True)),
                                  float(cfg.get("routed_scaling_factor", 2.5)), n_group, topk_group, True)
            rope_dim, interleave = a.qk_rope_head_dim, bool(cfg.get("rope_interleave", True))
        else:
            norm = bool(cfg.get("norm_topk_prob", False)) if family == "qwen3_moe" else True
            router = RouterConfig("softmax_topk", spec.n_routed, spec.top_k, norm, round_weights=family == "qwen3_moe")
            rope_dim, interleave = a.head_dim, False
        if cfg.get("partial_rotary_factor", 1.0) != 1.0:
            raise UserError(where, "partial_rotary_factor", str(cfg["partial_rotary_factor"]), "use full-width rope")
        max_pos = int(cfg.get("max_position_embeddings") or 0)
        sliding = 0
        if family == "mixtral":
            sliding = int(cfg.get("sliding_window") or 0)
        elif family == "qwen3_moe" and cfg.get("use_sliding_window"):
            raise UserError(where, "use_sliding_window", "true", "the engine runs Qwen3-MoE with full attention")
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
        bos = cfg.get("bos_token_id")
        eps = float(cfg.get("rms_norm_eps", 1e-5 if family == "mixtral" else 1e-6))        # transformers' defaults
        return ModelConfig(family, spec, eps, _rope(cfg, rope_dim, interleave, max_pos, 1e6 if family == "mixtral" else 1e4, where),
                           router, max_pos, bool(cfg.get("attention_bias", False)), sliding, eos_ids,
                           int(bos) if bos is not None else None, where)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _rope(cfg: dict, dim: int, interleave: bool, max_pos: int, default_theta: float, where: str) -> RopeConfig:
    """Both spellings: transformers 5's `rope_parameters` and the older `rope_theta` + `rope_scaling`."""
    params: dict[str, Any] = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", default_theta)))
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return RopeConfig(dim, theta, interleave)
    if kind != "yarn":
        raise UserError(where, "rope_scaling", f"rope type {kind!r}", "the engine runs default and yarn rope")
    orig = int(params.get("original_max_position_embeddings") or 0)
    if not orig:
        raise UserError(where, "rope_scaling.original_max_position_embeddings", "missing", "yarn needs it")
    factor = params.get("factor")
    factor = float(factor) if factor is not None else max_pos / orig
    af = params.get("attention_factor")
    return RopeConfig(dim, theta, interleave, "yarn", factor, orig, float(params.get("beta_fast") or 32),
                      float(params.get("beta_slow") or 1), float(params.get("mscale") or 0),
                      float(params.get("mscale_all_dim") or 0), float(af) if af is not None else None,
                      bool(params.get("truncate", True)))
