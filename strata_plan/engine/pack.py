"""`strata-plan pack`: turn a Hugging Face MoE checkpoint (or random weights in a model's geometry) into what
the engine reads.

    strata-plan pack CHECKPOINT --out DIR (--plan PLAN.yaml | --bpw 1.92 [--stats S] | --format NAME)
    strata-plan pack --synthetic MODEL [--moe-layers N] --out DIR (--plan PLAN.yaml | --bpw 1.92 | --format NAME)

Every routed expert is quantized with `pack_expert` (on the GPU when there is one) into one blob of its format
(`formats.expert_layout`: gate, up, down, padded to 4 KiB), and the blobs of one MoE layer go one after another
into `experts-layer{L:03d}.bin` (L = decoder layer), so every blob starts on a 4 KiB boundary of its file: one
O_DIRECT read per expert. `index.json` (engine/packed.py) lists every blob with the sha256 of each of its 1 MiB
parts, the same of `dense.safetensors`, and the sha256 of the plan; `dense.safetensors` holds every other tensor
of the checkpoint (attention, norms, routers and their biases, shared experts, dense MLPs, embeddings, lm_head)
unchanged, or as BF16 where the checkpoint stores FP8 blocks (engine/fp8.py: dequantized on the fly, scale
tensors left out); tensors of layers past `num_hidden_layers` (DeepSeek-V3's multi-token-prediction layer) are
left out; `config.json` is copied. `--synthetic` writes random weights instead (engine/synthetic.py).
Everything is written into a temporary folder beside the target and renamed into place when complete
(`files.AtomicFolder`): an error or Ctrl-C leaves no folder behind, or the old pack intact under `--force`.

Which format each expert gets: from a plan (its per-layer `formats`), or from a tier mix at a target
bits-per-weight (`formats.tier_mix`; the most used experts by `--stats`, else ids 0.. first, take the
first tier), or one format for all. Expert tensors are found under the names the checkpoints of the families
the engine runs use (their `TensorNames` in `core.families`: DeepSeek/Kimi/Qwen `mlp.experts.E.{gate,up,down}_proj
.weight`, Mixtral `block_sparse_moe.experts.E.{w1,w3,w2}.weight`), or transformers' fused
`mlp.experts.gate_up_proj` / `down_proj`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from strata_plan.core.families import FAMILIES
from strata_plan.engine import fp8
from strata_plan.engine.files import AtomicFile, AtomicFolder, BlobWriter, write_safetensors
from strata_plan.engine.packed import DENSE_FILE, PART_BYTES, PackedEntry, PackIndex, write_index
from strata_plan.errors import UserError
from strata_plan.kernels import formats as F

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_PACK_WRITES = re.compile(r"^(index\.json|config\.json|dense\.safetensors|experts-layer\d+\.bin|"
                          + "|".join(re.escape(n) for n in TOKENIZER_FILES) + r")$|^\..*\.(tmp|old)$")


def check_pack_target(out: str | os.PathLike) -> None:
    """Before any work: `out` can be written as a folder beside it and renamed into place (not a mount point)."""
    packed_folder(out).check()


def packed_folder(out: str | os.PathLike) -> AtomicFolder:
    """Where a pack writes: a temporary folder beside `out`, renamed into place when complete (an existing `out`
    replaced whole; files of it that a pack never writes, e.g. a user's notes, are moved into the new one)."""
    return AtomicFolder(out, keep=lambda name: not _PACK_WRITES.match(name))


def default_device() -> str:
    """Where packing computes: the GPU when there is one."""
    try:
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


class Checkpoint:
    """Tensor names -> safetensors file of a checkpoint folder (one file, or shards with an index); FP8 block-
    quantized weights come back dequantized (`get`), their `weight_scale_inv` tensors are not listed."""

    def __init__(self, folder: Path, config: dict | None = None):
        self.folder = folder
        index = folder / "model.safetensors.index.json"
        if index.exists():
            self.where = {n: folder / f for n, f in json.loads(index.read_text())["weight_map"].items()}
        elif (folder / "model.safetensors").exists():
            from safetensors import safe_open
            with safe_open(str(folder / "model.safetensors"), "pt") as f:
                self.where = {n: folder / "model.safetensors" for n in f.keys()}
        else:
            raise UserError(str(folder), "model.safetensors", "no safetensors weights found",
                            "pass a Hugging Face checkpoint folder (model.safetensors or its index)")
        self.block = fp8.block_size(config or {})
        self._open: dict[Path, object] = {}

    def _file(self, name: str):
        from safetensors import safe_open
        path = self.where[name]
        if path not in self._open:
            self._open[path] = safe_open(str(path), "pt")
        return self._open[path]

    @property
    def names(self) -> list[str]:
        """Every weight name but the FP8 scale tensors, sorted."""
        return sorted(n for n in self.where if not n.endswith(fp8.SCALE_SUFFIX))

    def stored_dtype(self, name: str):
        import torch
        code = self._file(name).get_slice(name).get_dtype()
        return {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
                "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}[code]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file(name).get_slice(name).get_shape())

    def get(self, name: str, device: str = "cpu", dtype=None):
        """Tensor `name` on `device`; FP8 weights dequantized with their block scales (to `dtype`, else float32)."""
        t = self._file(name).get_tensor(name).to(device)
        if fp8.is_fp8(t.dtype):
            scale = name + fp8.SCALE_SUFFIX
            if scale not in self.where or t.dim() != 2:
                raise UserError(str(self.where[name]), name, f"{t.dtype} weight without a 2-D block scale {scale}",
                                "use a checkpoint that ships weight_scale_inv per 128x128 block (DeepSeek-V3 style), "
                                "or a BF16 one")
            s = self._file(scale).get_tensor(scale)
            want = fp8.scale_shape(tuple(t.shape), self.block)
            if tuple(s.shape) != want:
                raise UserError(str(self.where[scale]), scale, f"shape {tuple(s.shape)} for a {tuple(t.shape)} weight "
                                f"in {self.block[0]}x{self.block[1]} blocks (expected {want})",
                                "set quantization_config.weight_block_size in config.json to the checkpoint's blocks")
            return fp8.dequant_block_fp8(t, s, self.block, dtype)
        return t if dtype is None else t.to(dtype)


def per_expert_names() -> dict[str, tuple[str, str, str]]:
    """prefix -> (gate, up, down) of every per-expert spelling the families the engine runs use (core.families)."""
    return {prefix: proj for f in FAMILIES.values() if f.runs for prefix, proj in f.tensors.experts}


def expert_weights(ckpt: Checkpoint, layer: int, n_experts: int, device: str = "cpu"):
    """(tensor names the layer's experts use, function expert -> float32 (gate [I, H], up [I, H], down [H, I]))."""
    import torch
    f32 = torch.float32
    for prefix, (g, u, d) in per_expert_names().items():
        base = f"model.layers.{layer}.{prefix}"
        names = [f"{base}.{e}.{m}.weight" for e in range(n_experts) for m in (g, u, d)]
        if all(n in ckpt.where for n in names):
            return set(names), lambda e: tuple(ckpt.get(f"{base}.{e}.{m}.weight", device, f32) for m in (g, u, d))
    fused = (f"model.layers.{layer}.mlp.experts.gate_up_proj", f"model.layers.{layer}.mlp.experts.down_proj")
    if all(n in ckpt.where for n in fused):
        loaded: list = []                     # [E, 2I, H], [E, H, I], read on the layer's first expert only

        def expert(e: int):
            if not loaded:
                loaded.extend(ckpt._file(n).get_tensor(n) for n in fused)
            gate_up, down = loaded
            inter = gate_up.shape[1] // 2
            return tuple(w.to(device, f32) for w in (gate_up[e, :inter], gate_up[e, inter:], down[e]))
        return set(fused), expert
    spelled = ", ".join(f"{prefix}.N.{{{','.join(proj)}}}" for prefix, proj in per_expert_names().items())
    raise UserError(str(ckpt.folder), f"model.layers.{layer}", f"routed-expert tensors of {n_experts} experts not found",
                    f"use a checkpoint with {spelled} or fused mlp.experts.gate_up_proj/down_proj tensors")


def formats_from_plan(plan_path: str, spec) -> tuple[list[dict[int, str]], str]:
    """(each MoE layer's expert -> format, sha256 of the plan file) of a plan made for `spec`'s config."""
    from strata_plan.core.plan import load_plan
    plan = load_plan(plan_path, spec)
    if plan.sources.model.sha256 != spec.config_sha256:
        raise UserError(plan_path, "sources.model.sha256", f"plan was made for {plan.model}'s config "
                        f"{plan.sources.model.sha256[:12]}, this is {spec.name} ({spec.config_sha256[:12]})",
                        f"plan again with --model {spec.source or spec.name}")
    sha = hashlib.sha256(Path(plan_path).read_bytes()).hexdigest()
    return [{e: f for f, ids in (lp.formats or {}).items() for e in ids} for lp in plan.layers], sha


def formats_from_mix(spec, bpw: float | None, fmt: str | None, stats_path: str | None) -> list[dict[int, str]]:
    if fmt is not None:
        F.get_format(fmt)
        return [{e: fmt for e in range(spec.n_routed)} for _ in spec.moe_layers]
    try:
        mix = F.tier_mix(bpw)
    except ValueError as e:
        raise UserError("--bpw", str(bpw), str(e), "choose a target between the tier formats' bits per weight") from None
    if stats_path:
        from strata_plan.core.routing.sources import load_routing
        stats = load_routing(spec, stats=stats_path)
        if stats.n_layers != spec.n_moe_layers or stats.n_experts != spec.n_routed:
            raise UserError(stats_path, "layers", f"statistics of {stats.n_layers} layers x {stats.n_experts} experts",
                            f"use statistics of {spec.name} ({spec.n_moe_layers} x {spec.n_routed})")
        return [mix.assign(list(layer.order)) for layer in stats.layers]
    return [mix.assign(list(range(spec.n_routed))) for _ in spec.moe_layers]


def check_layer_formats(spec, layer_formats: list[dict[int, str]]) -> None:
    if len(layer_formats) != spec.n_moe_layers:
        raise UserError("--plan", "layers", f"{len(layer_formats)} MoE layers for {spec.name}'s {spec.n_moe_layers}",
                        f"plan again for {spec.name}")


def write_layers(out: Path, spec, layer_formats: list[dict[int, str]], make_blob, progress=None,
                 part_bytes: int = PART_BYTES) -> list[PackedEntry]:
    """One `experts-layerLLL.bin` per MoE layer: make_blob(layer, expert, fmt) -> uint8 array of the blob, written
    in expert order while the next one is made; returns the entries with the sha256 of each part_bytes part."""
    entries: list[PackedEntry] = []
    for layer, fmts in zip(spec.moe_layers, layer_formats):
        file = f"experts-layer{layer:03d}.bin"
        rows, offset = [], 0
        with AtomicFile(out / file) as f, BlobWriter(f, part_bytes) as w:
            for e in range(spec.n_routed):
                blob = make_blob(layer, e, fmts[e])
                assert blob.nbytes % F.EXPERT_ALIGN == 0 and blob.nbytes == spec.routed_expert_bytes(fmts[e])
                rows.append((e, offset, blob.nbytes, fmts[e], w.put(blob)))
                offset += blob.nbytes
        entries += [PackedEntry(layer, e, file, off, n, fmt, tuple(parts.result())) for e, off, n, fmt, parts in rows]
        if progress:
            progress(layer, offset)
    return entries


def pack_checkpoint(folder: str | os.PathLike, out: str | os.PathLike, layer_formats: list[dict[int, str]],
                    device: str | None = None, plan_sha256: str = "", progress=None, importance=None,
                    rtn: bool = False, part_bytes: int = PART_BYTES) -> PackIndex:
    """Pack every routed expert of the checkpoint in `folder` into `out` (see the module docstring).

    importance: calibration statistics (`engine.calib.ActivationStats`) for the quantizer's importance
    input; rtn: plain round-to-nearest with group-wise min/max scaling instead of the fit (the baseline);
    part_bytes: bytes per hashed part (a multiple of 4 KiB; tests use small ones to have several parts a blob)."""
    import torch

    from strata_plan.kernels import pack_expert
    from strata_plan.core.spec import load_spec
    device = device or default_device()
    folder, out = Path(folder), Path(out)
    spec = load_spec(str(folder))
    check_layer_formats(spec, layer_formats)
    config = json.loads((folder / "config.json").read_text())
    ckpt = Checkpoint(folder, config)
    expert_names: set[str] = set()
    getters = {}
    for layer in spec.moe_layers:
        names, getters[layer] = expert_weights(ckpt, layer, spec.n_routed, device)
        expert_names |= names

    def make_blob(layer: int, e: int, fmt: str):
        for done in [l for l in getters if l < layer]:
            del getters[done]                 # a fused layer's tensors are freed once its experts are packed
        gate, up, down = getters[layer](e)
        imp = None
        if importance is not None:
            imp = {k: v.to(gate.device) for k, v in importance.importance(spec.moe_layers.index(layer), e).items()}
        return pack_expert(gate, up, down, fmt, imp, rtn=rtn).cpu().numpy()

    dense = [n for n in ckpt.names if n not in expert_names and _layer_of(n) < spec.n_layers]
    is_fp8 = {n: fp8.is_fp8(ckpt.stored_dtype(n)) for n in dense}
    out_dtype = {n: torch.bfloat16 if is_fp8[n] else ckpt.stored_dtype(n) for n in dense}
    with packed_folder(out) as tmp:
        entries = write_layers(tmp, spec, layer_formats, make_blob, progress, part_bytes)
        dense_nbytes, dense_parts = write_safetensors(  # only FP8 tensors visit the device (to be dequantized there)
            tmp / DENSE_FILE, [(n, out_dtype[n], ckpt.shape(n)) for n in dense],
            lambda n: ckpt.get(n, device if is_fp8[n] else "cpu", out_dtype[n]), part_bytes)
        shutil.copyfile(folder / "config.json", tmp / "config.json")
        for name in TOKENIZER_FILES:             # `strata-plan run --packed DIR` tokenizes from the packed folder
            if (folder / name).is_file():
                shutil.copyfile(folder / name, tmp / name)
        index = PackIndex(spec.name, spec.hidden, spec.moe_intermediate, spec.n_routed, str(folder),
                          spec.config_sha256, plan_sha256, part_bytes, dense_nbytes, tuple(dense_parts),
                          tuple(entries), folder=str(out))
        write_index(tmp, index)
    return index


def _layer_of(name: str) -> int:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def check_free_space(out: str | os.PathLike, spec, layer_formats: list[dict[int, str]]) -> None:
    """Refuse before writing anything when the folder's file system cannot hold the packed model."""
    need = sum(spec.routed_expert_bytes(f) for fmts in layer_formats for f in fmts.values()) + spec.dense_bytes
    probe = Path(out).resolve()
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need:
        kept = " (an old pack there is kept until the new one is complete)" if Path(out).exists() else ""
        raise UserError(str(out), "free space", f"{free / 1e9:.1f} GB free, the packed {spec.name} needs about "
                        f"{need / 1e9:.1f} GB{kept}", "free space or choose another --out")
