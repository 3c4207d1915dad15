"""Synthetic packed models: random weights in a real model's geometry, for benchmarks without a checkpoint.

    strata-plan pack --synthetic kimi-k3.1-pro --moe-layers 5 --bpw 1.92 --out DIR
    strata-plan plan --model kimi-k3.1-pro --moe-layers 5 ...      # the same spec, kimi-k3.1-pro@5moe

The folder is what `strata-plan pack` writes for a checkpoint (engine/packed.py), byte for byte in layout:
every expert blob has its format's exact size and segments; only the values are random. Codes are uniform
random bytes; per group the scale S and min M are set so that w = S * q - M has mean about 0 and standard
deviation about sigma = 1 / sqrt(K) (K the matrix's inputs), with fp16 d / dmin of that realistic magnitude
(super-block formats: uint8 scales in [top/4, top], mins derived from them so each group stays centred), so
the kernels produce finite outputs of sane size. `dense.safetensors` holds random BF16 tensors with the names
and shapes the architecture's Hugging Face checkpoints use (`dense_tensor_specs`; the router's
e_score_correction_bias in float32 as they ship it), and `config.json` is the (truncated) config, so
`load_spec(DIR)` gives the spec the index names. Everything is generated on `device` (the GPU when there is
one) from one seeded generator and written in whole-blob sequential writes, hashed on other threads.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from strata_plan.core.families import FAMILIES, family_of
from strata_plan.engine.files import write_safetensors
from strata_plan.engine.pack import check_layer_formats, packed_folder, write_layers
from strata_plan.engine.packed import DENSE_FILE, PART_BYTES, PackIndex, write_index
from strata_plan.errors import UserError
from strata_plan.kernels import formats as F


def _sigma(k: int) -> float:
    return 1.0 / math.sqrt(k)


def random_matrix_segments(fmt: str, n: int, k: int, gen, device) -> dict[str, "torch.Tensor"]:
    """Random stored tensors of one packed [n, k] matrix, each of the dtype and shape `formats` lays out."""
    import torch

    from strata_plan.kernels.quantizer import pack_nibbles
    f = F.get_format(fmt)
    shapes = {name: shape for name, _, shape, _ in f.segments(n, k)}
    sigma = _sigma(k)
    kw = dict(generator=gen, device=device)
    if f.is_bf16:
        return {"weight": (torch.randn(n, k, **kw) * sigma).to(torch.bfloat16)}
    levels = (1 << f.bits) - 1
    s_mean = sigma * math.sqrt(12.0 / ((levels + 1) ** 2 - 1))        # std of S*q, q uniform on 0..levels
    out = {"codes": torch.randint(0, 256, shapes["codes"], dtype=torch.uint8, **kw)}
    jitter = lambda shape: 0.75 + 0.5 * torch.rand(shape, **kw)     # noqa: E731
    if not f.superblock:                                              # fp16 S and M per group
        s = s_mean * jitter(shapes["scales"])
        out["scales"] = s.to(torch.float16)
        out["mins"] = (out["scales"].float() * levels / 2).to(torch.float16)
        return out
    sc_top, mn_top = (1 << f.scale_bits) - 1, (1 << f.min_bits) - 1
    sc = torch.randint(sc_top // 4, sc_top + 1, shapes["scales"], **kw)
    d = (s_mean / (sc_top * 5 / 8) * jitter(shapes["d"])).to(torch.float16)
    dmin = (d.float() * sc_top * levels / 2 / mn_top).to(torch.float16)     # mn = sc * mn_top / sc_top centres groups
    mn = torch.round(d.float() * sc * levels / 2 / dmin.float()).clamp_(0, mn_top)
    out["scales"] = sc.to(torch.uint8)
    out["mins"] = pack_nibbles(mn) if f.min_bits == 4 else mn.to(torch.uint8)
    out["d"], out["dmin"] = d, dmin
    return out


def random_blob(fmt: str, hidden: int, intermediate: int, gen, device):
    """One random expert blob (uint8 [expert_bytes]) laid out exactly as `pack_expert` lays out a real one."""
    import torch
    layout = F.expert_layout(fmt, hidden, intermediate)
    blob = torch.zeros(layout.nbytes, dtype=torch.uint8, device=device)
    for m, (n, k) in F.matrix_shapes(hidden, intermediate).items():
        for name, t in random_matrix_segments(fmt, n, k, gen, device).items():
            seg = layout.segment(m, name)
            blob[seg.offset:seg.offset + seg.nbytes] = t.contiguous().view(torch.uint8).reshape(-1)
    return blob


def dense_tensor_specs(spec) -> list[tuple[str, "torch.dtype", tuple[int, ...]]]:
    """(name, dtype, shape) of every tensor that is not a routed expert, as the architecture's Hugging Face
    checkpoints name them (the families in `core.families` that name their checkpoint tensors), sorted by name."""
    import torch
    bf, f32 = torch.bfloat16, torch.float32
    mt, H, a = spec.model_type, spec.hidden, spec.attention
    family = family_of(mt)
    if family is None or family.tensors is None:
        named = [t for f in FAMILIES.values() if f.tensors for t in f.model_types]
        raise UserError(spec.source or spec.name, "model_type", f"synthetic dense weights of {mt!r} are not written",
                        f"use a {', '.join(named)} model")
    names = family.tensors
    out: list[tuple[str, torch.dtype, tuple[int, ...]]] = [("model.embed_tokens.weight", bf, (spec.vocab, H)),
                                                           ("model.norm.weight", bf, (H,))]
    if not spec.tied_embeddings:
        out.append(("lm_head.weight", bf, (spec.vocab, H)))
    for i, kind in enumerate(spec.layer_kinds):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", bf, (H,)), (p + "post_attention_layernorm.weight", bf, (H,))]
        s = p + "self_attn."
        if a.kind == "mla":
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            if a.q_lora_rank:
                out += [(s + "q_a_proj.weight", bf, (a.q_lora_rank, H)), (s + "q_a_layernorm.weight", bf, (a.q_lora_rank,)),
                        (s + "q_b_proj.weight", bf, (a.heads * qk, a.q_lora_rank))]
            else:
                out.append((s + "q_proj.weight", bf, (a.heads * qk, H)))
            out += [(s + "kv_a_proj_with_mqa.weight", bf, (a.kv_lora_rank + a.qk_rope_head_dim, H)),
                    (s + "kv_a_layernorm.weight", bf, (a.kv_lora_rank,)),
                    (s + "kv_b_proj.weight", bf, (a.heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank)),
                    (s + "o_proj.weight", bf, (H, a.heads * a.v_head_dim))]
        else:
            q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
            for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                out.append((s + f"{name}.weight", bf, (rows, H)))
                if a.qkv_bias:
                    out.append((s + f"{name}.bias", bf, (rows,)))
            out.append((s + "o_proj.weight", bf, (H, q)))
            if a.qk_norm:
                out += [(s + "q_norm.weight", bf, (a.head_dim,)), (s + "k_norm.weight", bf, (a.head_dim,))]
        if kind == "dense":
            out += _mlp(p + "mlp.", H, spec.dense_intermediate)
            continue
        router = f"{p}{names.router[0]}."
        out.append((router + "weight", bf, (spec.n_routed, H)))
        if spec.router_bias:
            out.append((router + "e_score_correction_bias", f32, (spec.n_routed,)))
        if spec.shared_intermediate:
            out += _mlp(f"{p}{names.shared}.", H, spec.shared_intermediate)
            if names.shared_gate:                                     # qwen2_moe: a gate on the shared expert
                out.append((f"{p}{names.shared_gate}.weight", bf, (1, H)))
    return sorted(out)


def _mlp(prefix: str, hidden: int, inter: int):
    import torch
    return [(prefix + "gate_proj.weight", torch.bfloat16, (inter, hidden)),
            (prefix + "up_proj.weight", torch.bfloat16, (inter, hidden)),
            (prefix + "down_proj.weight", torch.bfloat16, (hidden, inter))]


def random_dense(name: str, dtype, shape: tuple[int, ...], gen, device):
    """A random dense tensor: matrices N(0, 1/K) (embeddings N(0, 1)), norm weights about 1, biases about 0."""
    import torch
    kw = dict(generator=gen, device=device)
    if len(shape) == 2:
        sigma = 1.0 if "embed_tokens" in name else _sigma(shape[1])
        return (torch.randn(shape, **kw) * sigma).to(dtype)
    if "norm" in name:
        return (1.0 + 0.05 * torch.randn(shape, **kw)).to(dtype)
    return (0.01 * torch.randn(shape, **kw)).to(dtype)


def pack_synthetic(spec, out: str | os.PathLike, layer_formats: list[dict[int, str]], device: str = "cpu",
                   seed: int = 0, plan_sha256: str = "", progress=None, part_bytes: int = PART_BYTES) -> PackIndex:
    """Write a random-weight packed folder of `spec` (see the module docstring)."""
    import torch

    from strata_plan.yamlio import atomic_write_text
    check_layer_formats(spec, layer_formats)
    specs = dense_tensor_specs(spec)                          # refuses an architecture before writing anything
    out = Path(out)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    H, I = spec.hidden, spec.moe_intermediate
    shapes = {n: (dt, sh) for n, dt, sh in specs}
    with packed_folder(out) as tmp:             # renamed into place when complete (engine/pack.py)
        entries = write_layers(tmp, spec, layer_formats,
                               lambda layer, e, fmt: random_blob(fmt, H, I, gen, device).cpu().numpy(), progress,
                               part_bytes)
        dense_nbytes, dense_parts = write_safetensors(tmp / DENSE_FILE, specs,
                                                      lambda n: random_dense(n, *shapes[n], gen, device), part_bytes)
        atomic_write_text(tmp / "config.json", json.dumps(config_of(spec), indent=2) + "\n")
        if spec.vocab >= 256:
            atomic_write_text(tmp / "tokenizer.json", byte_tokenizer_json())
        index = PackIndex(spec.name, H, I, spec.n_routed, f"synthetic (random weights, seed {seed}, {device})",
                          spec.config_sha256, plan_sha256, part_bytes, dense_nbytes, tuple(dense_parts),
                          tuple(entries), folder=str(out))
        write_index(tmp, index)
    return index


def byte_tokenizer_json() -> str:
    """A byte-level tokenizer for a random-weight model: ids 0..255 are the 256 bytes (no merges), so `strata-plan
    run` takes a text prompt on a synthetic pack; what it prints is bytes of random weights' choosing."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


def config_of(spec) -> dict:
    """The config.json a spec was read from (cut to its MoE layers when it is a NAME@Nmoe spec)."""
    from strata_plan.core.spec import load_config, spec_from_config, truncate_config
    cfg, *_ = load_config(spec.source)
    if spec_from_config(cfg, spec.name).config_sha256 != spec.config_sha256:
        cfg = truncate_config(cfg, spec.n_moe_layers, spec.source)
    if spec_from_config(cfg, spec.name).config_sha256 != spec.config_sha256:
        raise UserError(spec.source, "config", f"does not read back as {spec.name}", "pass the model's config.json")
    return cfg
