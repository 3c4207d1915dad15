"""`strata-plan pack`: turn a Hugging Face MoE checkpoint into what the engine reads.

    strata-plan pack CHECKPOINT --out DIR (--plan PLAN.yaml | --bpw 1.92 [--stats S] | --format NAME)

Every routed expert is quantized with `pack_expert` into one blob of its format (`formats.expert_layout`:
gate, up, down, padded to 4 KiB), and the blobs of one MoE layer go one after another into
`experts-layer{L:03d}.bin` (L = decoder layer), so every blob starts on a 4 KiB boundary of its file: one
O_DIRECT read per expert. `index.json` lists every blob (layer, expert, file, offset, nbytes, format);
`dense.safetensors` holds every other tensor of the checkpoint unchanged (attention, norms, routers and
their biases, shared experts, dense MLPs, embeddings, lm_head); `config.json` is copied.

Which format each expert gets: from a plan (its per-layer `formats`), or from a tier mix at a target
bits-per-weight (`formats.tier_mix`; the most used experts by `--stats`, else ids 0.. first, take the
first tier), or one format for all. Expert tensors are found under the names DeepSeek/Kimi/Qwen
(`mlp.experts.E.{gate,up,down}_proj.weight`) and Mixtral (`block_sparse_moe.experts.E.{w1,w3,w2}.weight`)
checkpoints use, or transformers' fused `mlp.experts.gate_up_proj` / `down_proj`.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from strata_plan.errors import UserError
from strata_plan.kernels import formats as F
from strata_plan.yamlio import atomic_write_bytes, atomic_write_text

INDEX_FORMAT = "strata-plan/packed-experts"
INDEX_VERSION = 2        # 2: codes lane-major in 32-bit words and every tensor unit-major (FORMATS.md)
PER_EXPERT = {"mlp.experts": ("gate_proj", "up_proj", "down_proj"),
              "block_sparse_moe.experts": ("w1", "w3", "w2")}


@dataclass(frozen=True)
class PackedEntry:
    layer: int          # decoder layer index
    expert: int
    file: str           # relative to the index
    offset: int         # bytes, a multiple of formats.EXPERT_ALIGN
    nbytes: int
    format: str


@dataclass(frozen=True)
class PackIndex:
    model: str
    hidden: int
    moe_intermediate: int
    n_experts: int
    source: str
    config_sha256: str
    entries: tuple[PackedEntry, ...]

    @property
    def expert_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def bytes_by_format(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.entries:
            out[e.format] = out.get(e.format, 0) + e.nbytes
        return out

    def to_data(self) -> dict:
        d = asdict(self)
        d["entries"] = [asdict(e) for e in self.entries]
        return {"format": INDEX_FORMAT, "version": INDEX_VERSION, **d}


class Checkpoint:
    """Tensor names -> safetensors file of a checkpoint folder (one file, or shards with an index)."""

    def __init__(self, folder: Path):
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
        self._open: dict[Path, object] = {}

    def get(self, name: str):
        from safetensors import safe_open
        path = self.where[name]
        if path not in self._open:
            self._open[path] = safe_open(str(path), "pt")
        return self._open[path].get_tensor(name)


def expert_weights(ckpt: Checkpoint, layer: int, n_experts: int):
    """(tensor names the layer's experts use, function expert -> (gate [I, H], up [I, H], down [H, I]))."""
    for prefix, (g, u, d) in PER_EXPERT.items():
        base = f"model.layers.{layer}.{prefix}"
        names = [f"{base}.{e}.{m}.weight" for e in range(n_experts) for m in (g, u, d)]
        if all(n in ckpt.where for n in names):
            return set(names), lambda e: tuple(ckpt.get(f"{base}.{e}.{m}.weight") for m in (g, u, d))
    fused = (f"model.layers.{layer}.mlp.experts.gate_up_proj", f"model.layers.{layer}.mlp.experts.down_proj")
    if all(n in ckpt.where for n in fused):
        gate_up, down = ckpt.get(fused[0]), ckpt.get(fused[1])          # [E, 2I, H], [E, H, I]
        inter = gate_up.shape[1] // 2
        return set(fused), lambda e: (gate_up[e, :inter], gate_up[e, inter:], down[e])
    raise UserError(str(ckpt.folder), f"model.layers.{layer}", f"routed-expert tensors of {n_experts} experts not found",
                    "use a checkpoint with mlp.experts.N.{gate,up,down}_proj, block_sparse_moe.experts.N.w1/w2/w3 "
                    "or fused mlp.experts.gate_up_proj/down_proj tensors")


def formats_from_plan(plan_path: str, spec) -> list[dict[int, str]]:
    from strata_plan.planner.plan import load_plan
    plan = load_plan(plan_path, spec)
    return [{e: f for f, ids in (lp.formats or {}).items() for e in ids} for lp in plan.layers]


def formats_from_mix(spec, bpw: float | None, fmt: str | None, stats_path: str | None) -> list[dict[int, str]]:
    if fmt is not None:
        F.get_format(fmt)
        return [{e: fmt for e in range(spec.n_routed)} for _ in spec.moe_layers]
    try:
        mix = F.tier_mix(bpw)
    except ValueError as e:
        raise UserError("--bpw", str(bpw), str(e), "choose a target between the tier formats' bits per weight") from None
    if stats_path:
        from strata_plan.planner.make import load_routing
        stats = load_routing(spec, stats=stats_path)
        if stats.n_layers != spec.n_moe_layers or stats.n_experts != spec.n_routed:
            raise UserError(stats_path, "layers", f"statistics of {stats.n_layers} layers x {stats.n_experts} experts",
                            f"use statistics of {spec.name} ({spec.n_moe_layers} x {spec.n_routed})")
        return [mix.assign(list(layer.order)) for layer in stats.layers]
    return [mix.assign(list(range(spec.n_routed))) for _ in spec.moe_layers]


def pack_checkpoint(folder: str | os.PathLike, out: str | os.PathLike, layer_formats: list[dict[int, str]],
                    device: str = "cpu", progress=None) -> PackIndex:
    """Pack every routed expert of the checkpoint in `folder` into `out` (see the module docstring)."""
    import torch
    from safetensors.torch import save as save_safetensors

    from strata_plan.kernels import pack_expert
    from strata_plan.planner.spec import load_spec
    folder, out = Path(folder), Path(out)
    spec = load_spec(str(folder))
    if len(layer_formats) != spec.n_moe_layers:
        raise UserError("--plan", "layers", f"{len(layer_formats)} MoE layers for {spec.name}'s {spec.n_moe_layers}",
                        f"plan again for {spec.name}")
    ckpt = Checkpoint(folder)
    out.mkdir(parents=True, exist_ok=True)
    expert_tensor_names: set[str] = set()
    entries: list[PackedEntry] = []
    for layer, fmts in zip(spec.moe_layers, layer_formats):
        names, weights = expert_weights(ckpt, layer, spec.n_routed)
        expert_tensor_names |= names
        file = f"experts-layer{layer:03d}.bin"
        offset = 0
        with _AtomicFile(out / file) as f:
            for e in range(spec.n_routed):
                gate, up, down = (w.to(device=device, dtype=torch.float32) for w in weights(e))
                blob = pack_expert(gate, up, down, fmts[e]).cpu().numpy()
                assert blob.nbytes % F.EXPERT_ALIGN == 0 and blob.nbytes == spec.routed_expert_bytes(fmts[e])
                f.write(blob.tobytes())
                entries.append(PackedEntry(layer, e, file, offset, blob.nbytes, fmts[e]))
                offset += blob.nbytes
        if progress:
            progress(layer, offset)
    dense = {n: ckpt.get(n).contiguous() for n in sorted(ckpt.where) if n not in expert_tensor_names}
    atomic_write_bytes(out / "dense.safetensors", save_safetensors(dense, metadata={"format": "pt"}))
    shutil.copyfile(folder / "config.json", out / "config.json")
    index = PackIndex(spec.name, spec.hidden, spec.moe_intermediate, spec.n_routed, str(folder), spec.config_sha256,
                      tuple(entries))
    atomic_write_text(out / "index.json", json.dumps(index.to_data(), indent=1) + "\n")
    return index


class _AtomicFile:
    """A file written under a temporary name in the same folder and renamed into place when closed
    cleanly (removed on any error, Ctrl-C included)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self.f = os.fdopen(fd, "wb")
        return self.f

    def __exit__(self, exc_type, exc, tb) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            Path(self.tmp).unlink(missing_ok=True)


def load_index(path: str | os.PathLike) -> PackIndex:
    """Read `index.json` of a packed folder (or the folder)."""
    p = Path(path)
    p = p / "index.json" if p.is_dir() else p
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(str(p), "", f"cannot read the index ({e.__class__.__name__})", "pass a folder written by "
                        "`strata-plan pack`") from None
    if data.get("format") != INDEX_FORMAT or data.get("version") != INDEX_VERSION:
        raise UserError(str(p), "format", f"got {data.get('format')!r} v{data.get('version')}",
                        f"pack again with this strata-plan ({INDEX_FORMAT} v{INDEX_VERSION})")
    entries = tuple(PackedEntry(**e) for e in data.pop("entries"))
    data.pop("format"), data.pop("version")
    return PackIndex(**data, entries=entries)
