"""ModelSpec: the geometry of an MoE decoder, read from a Hugging Face `config.json`, and every byte and
FLOP count the rest of strata-plan needs.

One reader covers the families whose configs name the same things (DeepSeek-V2/V3, Kimi-K2, GLM-4.x
MoE, Qwen2/Qwen3-MoE, Mixtral and its relatives, OLMoE, gpt-oss, Llama-4, DBRX, Arctic). Anything else
is refused with one line that names what is unsupported. Bytes of routed experts come from
`strata_plan.kernels.formats`; everything else here is counted at BF16 (2 bytes per parameter).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from strata_plan.errors import UserError
from strata_plan.kernels import formats as F

MODELS_DIR = Path(__file__).parent / "models"
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


@dataclass(frozen=True)
class ModelSpec:
    """Geometry of an MoE decoder. Derived counts are properties; nothing is stored twice."""

    name: str
    model_type: str
    hidden: int
    vocab: int
    layer_kinds: tuple[str, ...]      # "dense" or "moe", one per decoder layer
    n_routed: int
    top_k: int
    moe_intermediate: int
    shared_intermediate: int          # summed width of the shared expert(s); 0 = none
    dense_intermediate: int           # MLP width of dense layers
    attention: AttentionSpec
    tied_embeddings: bool = False
    native_dtype: str = "bfloat16"
    native_expert_bits: float = 16.0  # bits per routed-expert weight as released (fp8 8.0, mxfp4 4.25, ...)
    router_bias: bool = False
    expert_bias: bool = False         # gpt-oss: biases on expert projections (kept BF16, counted as dense)
    sliding_layers: tuple[bool, ...] = ()  # per layer: uses the sliding window
    source: str = ""                  # where the config came from
    config_sha256: str = ""

    @property
    def shipped(self) -> bool:
        """Read from a shipped spec (`core/models`): a plan records it by name, not by path."""
        return bool(self.source) and Path(self.source).resolve().parent == MODELS_DIR.resolve()

    # ---- layers -------------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.layer_kinds)

    @cached_property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == "moe")

    @property
    def n_moe_layers(self) -> int:
        return len(self.moe_layers)

    # ---- parameters ---------------------------------------------------------------------------
    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up, down)."""
        return 3 * self.hidden * self.moe_intermediate

    def dense_layer_params(self, layer: int) -> int:
        """Parameters of a layer that are not routed experts: attention, norms, router, shared expert
        (or the MLP of a dense layer)."""
        p = self.attention.params(self.hidden) + 2 * self.hidden
        if self.layer_kinds[layer] == "dense":
            return p + 3 * self.hidden * self.dense_intermediate
        p += self.n_routed * self.hidden + (self.n_routed if self.router_bias else 0)
        p += 3 * self.hidden * self.shared_intermediate
        if self.expert_bias:
            p += self.n_routed * (2 * self.moe_intermediate + self.hidden)
        return p

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def routed_params(self) -> int:
        return self.n_moe_layers * self.n_routed * self.expert_params

    @property
    def dense_params(self) -> int:
        """Everything that is not a routed expert (embeddings, lm_head and final norm included)."""
        layers = sum(self.dense_layer_params(i) for i in range(self.n_layers))
        return layers + self.embedding_params + self.lm_head_params + self.hidden

    @property
    def total_params(self) -> int:
        return self.routed_params + self.dense_params

    @property
    def active_params(self) -> int:
        """Parameters one decode token touches (top-k routed experts; embedding rows excluded)."""
        layers = sum(self.dense_layer_params(i) for i in range(self.n_layers))
        return layers + self.n_moe_layers * self.top_k * self.expert_params + self.lm_head_params + self.hidden \
            + (self.embedding_params if self.tied_embeddings else 0)

    # ---- bytes ---------------------------------------------------------------------------------
    def routed_expert_bytes(self, format: str) -> int:
        """Bytes of one routed expert packed in `format` (one read, one copy)."""
        return F.expert_bytes(format, self.hidden, self.moe_intermediate)

    def dense_layer_bytes(self, layer: int) -> int:
        """BF16 bytes of a layer's non-routed weights."""
        return BF16 * self.dense_layer_params(layer)

    @property
    def embedding_bytes(self) -> int:
        return BF16 * self.embedding_params

    @property
    def lm_head_bytes(self) -> int:
        return BF16 * (self.lm_head_params + self.hidden)   # with the final norm

    @property
    def dense_bytes(self) -> int:
        """BF16 bytes of everything but the routed experts."""
        return BF16 * self.dense_params

    def dense_bytes_per_token(self) -> int:
        """Dense bytes a decode token reads: every layer's non-routed weights and the lm_head; of the
        embedding only one row."""
        layers = sum(self.dense_layer_bytes(i) for i in range(self.n_layers))
        return layers + self.lm_head_bytes + BF16 * self.hidden

    def routed_bytes(self, mix: F.TierMix) -> int:
        """Bytes of all routed experts packed in a tier mix (whole experts per format per layer)."""
        per_layer = sum(c * self.routed_expert_bytes(f) for f, c in zip(mix.formats, mix.counts(self.n_routed)))
        return self.n_moe_layers * per_layer

    @property
    def native_bytes(self) -> int:
        """Approximate size as released: routed experts at their native precision, the rest BF16."""
        return int(self.routed_params * self.native_expert_bits / 8) + self.dense_bytes

    def packed_bytes(self, mix: F.TierMix) -> int:
        return self.routed_bytes(mix) + self.dense_bytes

    def kv_bytes_per_token(self, context: int | None = None) -> int:
        """KV-cache bytes per cached token summed over layers (sliding layers stop growing at their
        window: with `context` given, the average per token of a `context`-token cache)."""
        per = self.attention.kv_bytes_per_token_layer
        if context is None or not any(self.sliding_layers):
            return per * self.n_layers
        return self.kv_cache_bytes(context) // max(context, 1)

    def kv_cache_bytes(self, context: int) -> int:
        """KV cache of every decoder layer at `context` tokens: `kv_cache_layer_bytes` added up."""
        n_sliding = sum(1 for i in range(self.n_layers) if self._sliding(i))
        w = self.attention.sliding_window
        return self.attention.kv_bytes_per_token_layer * (n_sliding * min(context, w) + (self.n_layers - n_sliding) * context)

    def kv_cache_layer_bytes(self, i: int, context: int) -> int:
        """KV cache of decoder layer i at `context` tokens (a sliding-window layer keeps its window)."""
        w = self.attention.sliding_window
        return self.attention.kv_bytes_per_token_layer * (min(context, w) if self._sliding(i) else context)

    def _sliding(self, i: int) -> bool:
        return bool(self.sliding_layers) and bool(self.sliding_layers[i]) and self.attention.sliding_window > 0

    # ---- FLOPs ---------------------------------------------------------------------------------
    def flops_per_token(self, context: int = 0) -> int:
        """Forward FLOPs of one token attending over `context` cached tokens (2 per multiply-add)."""
        w = self.attention.sliding_window
        att = 0
        for i in range(self.n_layers):
            sliding = bool(self.sliding_layers) and self.sliding_layers[i] and w > 0
            att += self.attention.score_flops(min(context, w) if sliding else context)
        return 2 * self.active_params + att

    def dense_flops_per_token(self, context: int = 0) -> int:
        """FLOPs of one token that are not routed-expert matrix products."""
        return self.flops_per_token(context) - 2 * self.n_moe_layers * self.top_k * self.expert_params

    def expert_flops(self, tokens: int = 1) -> int:
        """FLOPs of one routed expert applied to `tokens` tokens."""
        return 2 * self.expert_params * tokens

    # ---- identity ------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name, "model_type": self.model_type, "layers": self.n_layers,
            "moe_layers": self.n_moe_layers, "routed_experts": self.n_routed, "top_k": self.top_k,
            "hidden": self.hidden, "moe_intermediate": self.moe_intermediate,
            "shared_intermediate": self.shared_intermediate, "attention": self.attention.kind,
            "total_params_B": round(self.total_params / 1e9, 2), "active_params_B": round(self.active_params / 1e9, 2),
        }

    def details(self) -> dict[str, Any]:
        """`summary()` with the bytes per routed expert of each format, dense and KV bytes, FLOPs and the seed's
        tier mix (what `strata-plan models NAME` shows)."""
        from strata_plan.kernels.formats import TIER_FORMATS, tier_mix
        mix = tier_mix()
        return {**self.summary(),
                "routed_expert_bytes": {f: self.routed_expert_bytes(f) for f in (*TIER_FORMATS, "q4_g128_f16", "bf16")},
                "dense_bytes_bf16": self.dense_bytes, "dense_bytes_per_token": self.dense_bytes_per_token(),
                "kv_bytes_per_token": self.kv_bytes_per_token(), "flops_per_token_ctx0": self.flops_per_token(0),
                "native_bytes": self.native_bytes, "seed_mix_bytes": self.packed_bytes(mix),
                "seed_mix": dict(zip(mix.formats, [round(f, 4) for f in mix.fractions]))}


# ------------------------------------------------------------------------------------------------
# Reading config.json
# ------------------------------------------------------------------------------------------------
REFUSED_TYPES = {
    "switch_transformers": "encoder-decoder model (not an MoE decoder)",
    "nllb-moe": "encoder-decoder model (not an MoE decoder)",
    "nllb_moe": "encoder-decoder model (not an MoE decoder)",
    "jamba": "Mamba (state-space) layers are not supported",
    "jetmoe": "mixture-of-attention heads (JetMoE) are not supported",
    "deepseek_v32": "DeepSeek sparse attention (the lightning indexer of V3.2) is not supported",
}
DEEPSEEK_TYPES = ("deepseek", "deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe")
MIXTRAL_TYPES = ("mixtral", "phimoe", "grinmoe", "granitemoe", "olmoe", "qwen2_moe", "qwen3_moe", "gpt_oss")


class _Cfg:
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


def _native_expert_bits(c: _Cfg) -> tuple[str, float]:
    dtype = str(c.get("torch_dtype", c.get("dtype", "bfloat16")))
    q = c.get("quantization_config", {}) or {}
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        return dtype, 8.0
    if method == "mxfp4":
        return dtype, 4.25          # 4-bit e2m1 codes + one e8m0 scale per 32
    if method in ("compressed-tensors", "awq", "gptq"):
        bits = q.get("bits") or (q.get("config_groups", {}) or {}).get("group_0", {}).get("weights", {}).get("num_bits", 4)
        return dtype, float(bits) + 0.25
    return dtype, {"float32": 32.0, "float16": 16.0}.get(dtype, 16.0)


def spec_from_config(cfg: dict, name: str, where: str = "config.json") -> ModelSpec:
    """Read an HF config dict into a ModelSpec, or raise UserError naming what is unsupported."""
    if not isinstance(cfg, dict):
        raise UserError(where, "", "is not a JSON object", "pass a Hugging Face config.json")
    if cfg.get("text_config") and cfg.get("model_type") == "llama4":
        inner = dict(cfg["text_config"])
        inner.setdefault("torch_dtype", cfg.get("torch_dtype"))
        cfg = {**inner, "model_type": "llama4"}
    mt = cfg.get("model_type")
    if not mt:
        raise UserError(where, "model_type", "missing", "use a Hugging Face config.json that names its model_type")
    mt = str(mt)
    if mt in REFUSED_TYPES:
        raise UserError(where, "model_type", f"{mt!r}: {REFUSED_TYPES[mt]}", "use a decoder-only MoE model")
    if cfg.get("is_encoder_decoder"):
        raise UserError(where, "is_encoder_decoder", "encoder-decoder model (not an MoE decoder)", "use a decoder-only MoE model")
    c = _Cfg(cfg, where)
    dtype, native_bits = _native_expert_bits(c)

    if mt == "dbrx":
        return _dbrx(cfg, name, where, dtype, native_bits)
    if mt == "arctic":
        n_layers = c.int("num_hidden_layers")
        heads = c.int("num_attention_heads")
        att = AttentionSpec("gqa", heads, c.int("num_key_value_heads", heads), c.get("head_dim") or c.int("hidden_size") // heads)
        return _finish(cfg, name, mt, c, att, ["moe"] * n_layers, c.int("num_local_experts"), c.int("num_experts_per_tok"),
                       c.int("intermediate_size"), c.int("intermediate_size") if c.get("use_residual") else 0,
                       c.int("intermediate_size"), dtype, native_bits)

    if mt in DEEPSEEK_TYPES:
        n_layers = c.int("num_hidden_layers")
        first_dense = c.int("first_k_dense_replace", 0, lo=0)
        freq = c.int("moe_layer_freq", 1)
        kinds = ["moe" if (i >= first_dense and i % freq == 0) else "dense" for i in range(n_layers)]
        heads = c.int("num_attention_heads")
        if c.get("kv_lora_rank"):
            att = AttentionSpec("mla", heads, q_lora_rank=int(c.get("q_lora_rank", 0) or 0), kv_lora_rank=c.int("kv_lora_rank"),
                                qk_nope_head_dim=c.int("qk_nope_head_dim"), qk_rope_head_dim=c.int("qk_rope_head_dim"),
                                v_head_dim=c.int("v_head_dim"))
        else:
            hd = c.get("head_dim") or c.int("hidden_size") // heads
            att = AttentionSpec("gqa", heads, c.int("num_key_value_heads", heads), hd,
                                qkv_bias=bool(c.get("attention_bias", False)), qk_norm=bool(c.get("use_qk_norm", False)))
        n_shared = c.int("n_shared_experts", 0, lo=0)
        moe_i = c.int("moe_intermediate_size")
        return _finish(cfg, name, mt, c, att, kinds, c.int("n_routed_experts"), c.int("num_experts_per_tok"), moe_i,
                       n_shared * moe_i, c.int("intermediate_size"), dtype, native_bits,
                       router_bias=c.get("topk_method") == "noaux_tc")

    if mt == "llama4":
        n_layers = c.int("num_hidden_layers")
        step = c.int("interleave_moe_layer_step", 1)
        moe_set = set(c.get("moe_layers") or range(step - 1, n_layers, step))
        kinds = ["moe" if i in moe_set else "dense" for i in range(n_layers)]
        heads = c.int("num_attention_heads")
        att = AttentionSpec("gqa", heads, c.int("num_key_value_heads", heads), c.get("head_dim") or c.int("hidden_size") // heads,
                            qkv_bias=bool(c.get("attention_bias", False)), qk_norm=bool(c.get("use_qk_norm", False)))
        return _finish(cfg, name, mt, c, att, kinds, c.int("num_local_experts"), c.int("num_experts_per_tok"),
                       c.int("intermediate_size"), c.int("intermediate_size"),
                       c.int("intermediate_size_mlp", c.get("intermediate_size")), dtype, native_bits)

    if mt in MIXTRAL_TYPES:
        n_layers = c.int("num_hidden_layers")
        n_exp = c.get("num_local_experts") or c.get("num_experts")
        if not n_exp:
            raise UserError(where, "num_experts", "missing", "an MoE config names its routed experts (num_experts or num_local_experts)")
        top_k = c.int("num_experts_per_tok", c.get("experts_per_token"))
        kinds = ["moe"] * n_layers
        shared = 0
        moe_i = c.int("moe_intermediate_size", c.get("intermediate_size"))
        if mt in ("qwen2_moe", "qwen3_moe"):
            step = c.int("decoder_sparse_step", 1)
            only = set(c.get("mlp_only_layers", []) or [])
            kinds = ["moe" if (i not in only and (i + 1) % step == 0) else "dense" for i in range(n_layers)]
            shared = int(c.get("shared_expert_intermediate_size", 0) or 0)
        heads = c.int("num_attention_heads")
        hd = c.get("head_dim") or c.int("hidden_size") // heads
        bias = bool(c.get("attention_bias", mt == "qwen2_moe"))
        att = AttentionSpec("gqa", heads, c.int("num_key_value_heads", heads), hd, qkv_bias=bias,
                            o_bias=bias and mt == "gpt_oss", qk_norm=mt in ("qwen3_moe", "olmoe"),
                            sliding_window=int(c.get("sliding_window", 0) or 0) if mt == "gpt_oss" else 0)
        sliding = tuple(t == "sliding_attention" for t in c.get("layer_types", [])) if mt == "gpt_oss" else ()
        spec = _finish(cfg, name, mt, c, att, kinds, int(n_exp), top_k, moe_i, shared, c.int("intermediate_size"),
                       dtype, native_bits, router_bias=mt == "gpt_oss", expert_bias=mt == "gpt_oss", sliding=sliding)
        return spec

    raise UserError(where, "model_type", f"{mt!r} is not a supported MoE decoder",
                    "use a DeepSeek/Kimi/GLM, Qwen-MoE, Mixtral-family, OLMoE, gpt-oss, Llama-4, DBRX or Arctic config")


def _finish(cfg: dict, name: str, mt: str, c: _Cfg, att: AttentionSpec, kinds: list[str], n_routed: int, top_k: int,
            moe_i: int, shared_i: int, dense_i: int, dtype: str, native_bits: float, router_bias: bool = False,
            expert_bias: bool = False, sliding: tuple[bool, ...] = ()) -> ModelSpec:
    if "moe" not in kinds:
        raise UserError(c.where, "num_hidden_layers", "no layer has routed experts", "use an MoE config")
    if top_k > n_routed:
        raise UserError(c.where, "num_experts_per_tok", f"top-k {top_k} exceeds {n_routed} routed experts", "correct the config")
    if sliding and len(sliding) != len(kinds):
        raise UserError(c.where, "layer_types", f"{len(sliding)} entries for {len(kinds)} layers", "give one type per layer")
    return ModelSpec(
        name=name, model_type=mt, hidden=c.int("hidden_size"), vocab=c.int("vocab_size"), layer_kinds=tuple(kinds),
        n_routed=n_routed, top_k=top_k, moe_intermediate=moe_i, shared_intermediate=shared_i, dense_intermediate=dense_i,
        attention=att, tied_embeddings=bool(c.get("tie_word_embeddings", False)), native_dtype=dtype,
        native_expert_bits=native_bits, router_bias=router_bias, expert_bias=expert_bias, sliding_layers=sliding,
        config_sha256=_sha(cfg))


def _dbrx(cfg: dict, name: str, where: str, dtype: str, native_bits: float) -> ModelSpec:
    c = _Cfg(cfg, where)
    ffn = _Cfg(cfg.get("ffn_config") or {}, where + ":ffn_config")
    attn = _Cfg(cfg.get("attn_config") or {}, where + ":attn_config")
    d, heads = c.int("d_model"), c.int("n_heads")
    att = AttentionSpec("gqa", heads, attn.int("kv_n_heads"), d // heads)
    n = c.int("n_layers")
    return ModelSpec(name=name, model_type="dbrx", hidden=d, vocab=c.int("vocab_size"), layer_kinds=("moe",) * n,
                     n_routed=ffn.int("moe_num_experts"), top_k=ffn.int("moe_top_k"),
                     moe_intermediate=ffn.int("ffn_hidden_size"), shared_intermediate=0,
                     dense_intermediate=ffn.int("ffn_hidden_size"), attention=att,
                     tied_embeddings=bool(c.get("tie_word_embeddings", False)), native_dtype=dtype,
                     native_expert_bits=native_bits, config_sha256=_sha(cfg))


def _sha(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


def scan_configs(folder: str | Path) -> list[tuple[str, str, str]]:
    """(path relative to `folder`, "loads" or "refused", what it is or why not) for every `*.json` under
    `folder` (names starting with `_` skipped): which Hugging Face configs this reader takes."""
    folder = Path(folder)
    rows = []
    for p in sorted(folder.rglob("*.json")):
        if p.name.startswith("_"):
            continue
        rel = p.relative_to(folder).as_posix()
        try:
            s = spec_from_config(json.loads(p.read_text()), p.stem, rel)
            rows.append((rel, "loads", f"{s.model_type}, {s.total_params / 1e9:.1f}B params, "
                                       f"{s.n_moe_layers} MoE layers x {s.n_routed} experts, top-{s.top_k}"))
        except UserError as e:
            rows.append((rel, "refused", f"{e.field}: {e.problem}"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            rows.append((rel, "refused", f"not valid JSON ({e.__class__.__name__})"))
    return rows


def shipped_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


TRUNCATED = re.compile(r"^(?P<base>.+)@(?P<n>\d+)moe$")


def load_spec(model: str, moe_layers: int | None = None) -> ModelSpec:
    """A shipped spec by name (`kimi-k3.1-pro`, `deepseek-v3`, ...) or a path to a config.json (or its folder).

    `NAME@5moe` (or `moe_layers=5`) is the same model cut after its 5th MoE layer (`truncate_config`): what
    `strata-plan pack --synthetic` builds and `strata-plan plan` plans for benchmarks without a checkpoint."""
    m = TRUNCATED.match(model)
    if m and not Path(model).exists():
        if moe_layers is not None and moe_layers != int(m["n"]):
            raise UserError("--moe-layers", str(moe_layers), f"{model} already names {m['n']} MoE layers", "pass one")
        model, moe_layers = m["base"], int(m["n"])
    cfg, name, where, p = load_config(model)
    if moe_layers is not None:
        cfg = truncate_config(cfg, moe_layers, where)
        name = f"{name}@{moe_layers}moe"
    spec = spec_from_config(cfg, name, where)
    return _replace(spec, source=str(p))


def load_config(model: str) -> tuple[dict, str, str, Path]:
    """(config dict, spec name, where for messages, path) of a shipped spec name or a config.json path."""
    p = Path(model)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" and p.exists():
        where, name = str(p), (p.parent.name if p.name == "config.json" else p.stem)
    elif (MODELS_DIR / f"{model}.json").exists():
        p, where, name = MODELS_DIR / f"{model}.json", f"{model} (shipped spec)", model
    elif p.suffix == ".json" or "/" in model:
        raise UserError(model, "", "file not found", "pass a path to a Hugging Face config.json")
    else:
        raise UserError("--model", model, "unknown model name",
                        f"use one of {', '.join(shipped_models())} or a path to a config.json")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(where, "", f"not valid JSON ({e.__class__.__name__})", "pass a Hugging Face config.json") from None
    return cfg, name, where, p


def truncate_config(cfg: dict, n_moe: int, where: str = "config.json") -> dict:
    """The config of the model's decoder layers up to and including its `n_moe`-th MoE layer (the dense layers
    before it kept): the layer count and every per-layer list cut to match. Checked: the truncated config reads
    back as exactly those layers."""
    full = spec_from_config(cfg, "", where)
    if not 1 <= n_moe <= full.n_moe_layers:
        raise UserError(where, "--moe-layers", f"{n_moe} MoE layers asked, the model has {full.n_moe_layers}",
                        f"pass 1..{full.n_moe_layers}")
    n = full.moe_layers[n_moe - 1] + 1
    out = json.loads(json.dumps(cfg))
    inner = out["text_config"] if out.get("model_type") == "llama4" and out.get("text_config") else out
    inner["n_layers" if full.model_type == "dbrx" else "num_hidden_layers"] = n
    for key in ("layer_types", "no_rope_layers"):
        if isinstance(inner.get(key), list):
            inner[key] = inner[key][:n]
    for key in ("moe_layers", "mlp_only_layers"):
        if isinstance(inner.get(key), list):
            inner[key] = [i for i in inner[key] if i < n]
    cut = spec_from_config(out, "", where)
    if cut.layer_kinds != full.layer_kinds[:n] or cut.n_moe_layers != n_moe:
        raise UserError(where, "num_hidden_layers", f"cannot cut {full.model_type} after {n_moe} MoE layers "
                        "(its layer pattern changes)", "use the whole model")
    return out


def _replace(spec: ModelSpec, **kw: Any) -> ModelSpec:
    import dataclasses
    return dataclasses.replace(spec, **kw)
