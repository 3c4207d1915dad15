"""ModelSpec: the geometry of an MoE decoder, read from a Hugging Face `config.json`, and every byte and
FLOP count the rest of strata-plan needs.

Each family's own config fields are read by its module in `core.families` (found by `model_type`); this
module reads what every config shares and builds the spec. Anything else is refused with one line that
names what is unsupported. Bytes of routed experts come from
`strata_plan.kernels.formats`; everything else here is counted at BF16 (2 bytes per parameter).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from strata_plan.core.families import FAMILIES, family_of
from strata_plan.core.geometry import BF16, AttentionSpec, Cfg, Geometry
from strata_plan.errors import UserError
from strata_plan.kernels import formats as F

MODELS_DIR = Path(__file__).parent / "models"


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

    @property
    def layer_geometry(self) -> str:
        """What a decoder layer's decode work without its routed experts depends on, as one key: the family, hidden
        size, vocabulary, attention shape, dense and shared MLP widths, the router's width and top-k (not the layer
        count, nor the routed experts' size). A profile's measured `layer_times` entry serves every spec of its key."""
        att = ",".join(f"{k}={v}" for k, v in sorted(dataclasses.asdict(self.attention).items()))
        return (f"{self.model_type};h={self.hidden};v={self.vocab};{att};dense={self.dense_intermediate};"
                f"shared={self.shared_intermediate};E={self.n_routed};k={self.top_k};tied={int(self.tied_embeddings)}")

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


def _native_expert_bits(c: Cfg) -> tuple[str, float]:
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
    family = family_of(cfg.get("model_type"))
    if family is not None and family.text_config and cfg.get("text_config"):
        inner = dict(cfg["text_config"])
        inner.setdefault("torch_dtype", cfg.get("torch_dtype"))
        cfg = {**inner, "model_type": cfg["model_type"]}
    mt = cfg.get("model_type")
    if not mt:
        raise UserError(where, "model_type", "missing", "use a Hugging Face config.json that names its model_type")
    mt = str(mt)
    if mt in REFUSED_TYPES:
        raise UserError(where, "model_type", f"{mt!r}: {REFUSED_TYPES[mt]}", "use a decoder-only MoE model")
    if cfg.get("is_encoder_decoder"):
        raise UserError(where, "is_encoder_decoder", "encoder-decoder model (not an MoE decoder)", "use a decoder-only MoE model")
    c = Cfg(cfg, where)
    dtype, native_bits = _native_expert_bits(c)
    if family is None:
        raise UserError(where, "model_type", f"{mt!r} is not a supported MoE decoder",
                        f"use a config of one of: {', '.join(f.title for f in FAMILIES.values())}")
    return _finish(cfg, name, mt, c, family.read(c), dtype, native_bits)


def _finish(cfg: dict, name: str, mt: str, c: Cfg, g: Geometry, dtype: str, native_bits: float) -> ModelSpec:
    kinds, sliding = g["layer_kinds"], g.get("sliding_layers", ())
    if "moe" not in kinds:
        raise UserError(c.where, "num_hidden_layers", "no layer has routed experts", "use an MoE config")
    if g["top_k"] > g["n_routed"]:
        raise UserError(c.where, "num_experts_per_tok", f"top-k {g['top_k']} exceeds {g['n_routed']} routed experts",
                        "correct the config")
    if sliding and len(sliding) != len(kinds):
        raise UserError(c.where, "layer_types", f"{len(sliding)} entries for {len(kinds)} layers", "give one type per layer")
    shared = {"hidden": g.get("hidden") or c.int("hidden_size"), "vocab": g.get("vocab") or c.int("vocab_size"),
              "tied_embeddings": bool(c.get("tie_word_embeddings", False))}
    return ModelSpec(name=name, model_type=mt, **{**shared, **g}, native_dtype=dtype, native_expert_bits=native_bits,
                     config_sha256=_sha(cfg))


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
    family = family_of(full.model_type)
    inner = out["text_config"] if family.text_config and out.get("text_config") else out
    inner[family.layers_field] = n
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
