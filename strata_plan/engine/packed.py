"""The packed model folder as the engine reads it: `index.json`, checked strictly, and the checks that tie a
packed folder to a plan and every byte to its sha256.

    index = load_index(DIR)                     # strict: format, version, fields, files present and long enough
    check_plan_matches(index, plan, plan_path)  # model, experts, layers, each expert's format: the packed ones
    verify_blob(index, entry, data)             # sha256 of one blob as read; a mismatch names layer, expert, file
    verify_dense(index)                         # sha256 of dense.safetensors

A plan with other budgets or tier splits (vram/ram/nvme ids, cache slots, staging) and the same formats runs
on the same packed folder without re-packing. sha256 costs about 0.65 s per GB on one core (PACK.md).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path

from strata_plan.engine.files import sha256_bytes
from strata_plan.errors import UserError
from strata_plan.kernels import formats as F

INDEX_FORMAT = "strata-plan/packed-experts"
INDEX_VERSION = 3        # 2: lane-major codes, unit-major tensors; 3: sha256 of every blob, dense and plan
DENSE_FILE = "dense.safetensors"
HASH_CHUNK = 64 << 20    # bytes hashed per read when hashing a file


@dataclass(frozen=True)
class PackedEntry:
    layer: int          # decoder layer index
    expert: int
    file: str           # relative to the index
    offset: int         # bytes, a multiple of formats.EXPERT_ALIGN
    nbytes: int
    format: str
    sha256: str         # of the blob's nbytes bytes


@dataclass(frozen=True)
class PackIndex:
    model: str                  # ModelSpec.name of what was packed (e.g. kimi-k3.1-pro@5moe for a synthetic one)
    hidden: int
    moe_intermediate: int
    n_experts: int
    source: str                 # checkpoint folder, or "synthetic (random weights, seed S)"
    config_sha256: str          # ModelSpec.config_sha256 of config.json in the folder
    plan_sha256: str            # sha256 of the plan file's bytes it was packed from ("" for --bpw / --format)
    dense_nbytes: int
    dense_sha256: str
    entries: tuple[PackedEntry, ...]
    folder: str = ""            # where it was loaded from (not stored)

    @property
    def expert_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted({e.layer for e in self.entries}))

    def bytes_by_format(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.entries:
            out[e.format] = out.get(e.format, 0) + e.nbytes
        return out

    def layer_formats(self) -> dict[int, dict[int, str]]:
        """decoder layer -> {expert id -> format}."""
        out: dict[int, dict[int, str]] = {}
        for e in self.entries:
            out.setdefault(e.layer, {})[e.expert] = e.format
        return out

    @cached_property
    def _by_key(self) -> dict[tuple[int, int], PackedEntry]:
        return {(e.layer, e.expert): e for e in self.entries}

    def entry(self, layer: int, expert: int) -> PackedEntry:
        return self._by_key[(layer, expert)]

    def path(self, name: str) -> Path:
        return Path(self.folder) / name

    def to_data(self) -> dict:
        d = asdict(self)
        d.pop("folder")
        d["entries"] = [asdict(e) for e in self.entries]
        return {"format": INDEX_FORMAT, "version": INDEX_VERSION, **d}


def sha256_file(path: str | os.PathLike, offset: int = 0, nbytes: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = nbytes
        while left is None or left > 0:
            chunk = f.read(HASH_CHUNK if left is None else min(HASH_CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def write_index(out: str | os.PathLike, index: PackIndex) -> Path:
    from strata_plan.yamlio import atomic_write_text
    return atomic_write_text(Path(out) / "index.json", json.dumps(index.to_data(), indent=1) + "\n")


# ---------------------------------------------------------------------------------------------- loading
_REPACK = f"pack the checkpoint again with this strata-plan (writes {INDEX_FORMAT} v{INDEX_VERSION})"


def _field_types(cls) -> dict[str, type]:
    return {f.name: {"int": int, "str": str}.get(str(f.type), object) for f in fields(cls)}


def _strict(cls, data, where: str, field: str, skip=()):
    """cls(**data) with every field present, of its type, and nothing else."""
    if not isinstance(data, dict):
        raise UserError(where, field, "is not a JSON object", _REPACK)
    types = {k: t for k, t in _field_types(cls).items() if k not in skip}
    for k in data:
        if k not in types:
            raise UserError(where, f"{field}.{k}" if field else k, "unknown field", _REPACK)
    for k, t in types.items():
        if k not in data:
            raise UserError(where, f"{field}.{k}" if field else k, "missing", _REPACK)
        v = data[k]
        if t is not object and (not isinstance(v, t) or isinstance(v, bool)):
            raise UserError(where, f"{field}.{k}" if field else k, f"must be {t.__name__}, got {v!r}", _REPACK)
    return data


def load_index(path: str | os.PathLike, check_files: bool = True) -> PackIndex:
    """Read `index.json` of a packed folder (or the file itself) strictly.

    Refuses, with one line naming the file, the field and the fix: unreadable or invalid JSON, another format or
    version (pack again), a missing or mistyped field, an entry whose offset, size or format does not fit the
    format registry, and (with `check_files`) a blob file or dense.safetensors that is missing or shorter than the
    index says. Checksums are not computed here (`verify_blob`, `verify_dense`, `verify_all`)."""
    p = Path(path)
    p = p / "index.json" if p.is_dir() else p
    where = str(p)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(where, "", "no index.json", "pass a folder written by `strata-plan pack`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(where, "", f"cannot read the index ({e.__class__.__name__}: {e})",
                        "pack again: the index is damaged or not a packed folder's") from None
    if not isinstance(data, dict):
        raise UserError(where, "", "is not a JSON object", _REPACK)
    if data.get("format") != INDEX_FORMAT or data.get("version") != INDEX_VERSION:
        raise UserError(where, "version", f"got {data.get('format')!r} v{data.get('version')}, this strata-plan reads "
                        f"v{INDEX_VERSION}", _REPACK)
    data = dict(data)
    data.pop("format"), data.pop("version")
    _strict(PackIndex, data, where, "", skip=("folder",))
    if not isinstance(data["entries"], list):
        raise UserError(where, "entries", "must be a list", _REPACK)
    entries = []
    for i, raw in enumerate(data["entries"]):
        e = PackedEntry(**_strict(PackedEntry, raw, where, f"entries[{i}]"))
        if e.format not in F.FORMATS:
            raise UserError(where, f"entries[{i}].format", f"unknown format {e.format!r}", _REPACK)
        want = F.expert_bytes(e.format, data["hidden"], data["moe_intermediate"])
        if e.nbytes != want or e.offset % F.EXPERT_ALIGN or e.offset < 0:
            raise UserError(where, f"entries[{i}]", f"layer {e.layer} expert {e.expert}: {e.nbytes} bytes at offset "
                            f"{e.offset}, but a {e.format} blob is {want} bytes at a 4 KiB boundary", _REPACK)
        entries.append(e)
    index = PackIndex(**{**data, "entries": tuple(entries)}, folder=str(p.parent))
    _check_expert_ids(index, where)
    if check_files:
        check_files_present(index)
    return index


def _check_expert_ids(index: PackIndex, where: str) -> None:
    for layer, fmts in index.layer_formats().items():
        if sorted(fmts) != list(range(index.n_experts)):
            raise UserError(where, "entries", f"layer {layer} lists experts {len(fmts)} distinct ids, not each of "
                            f"0..{index.n_experts - 1} once", _REPACK)
    if len(index.entries) != len(index.layers) * index.n_experts:
        raise UserError(where, "entries", "an expert is listed twice", _REPACK)


def check_files_present(index: PackIndex) -> None:
    """Every blob file exists and reaches past its last blob; dense.safetensors exists with its recorded size."""
    ends: dict[str, int] = {}
    for e in index.entries:
        ends[e.file] = max(ends.get(e.file, 0), e.offset + e.nbytes)
    for name, end in sorted(ends.items()):
        path = index.path(name)
        if not path.is_file():
            raise UserError(str(path), "file", "missing (listed in index.json)", f"pack {index.folder} again")
        size = path.stat().st_size
        if size < end:
            raise UserError(str(path), "size", f"truncated: {size} bytes, index.json needs {end}",
                            f"pack {index.folder} again (or copy the file again)")
    dense = index.path(DENSE_FILE)
    if not dense.is_file():
        raise UserError(str(dense), "file", "missing (every packed folder has one)", f"pack {index.folder} again")
    if dense.stat().st_size != index.dense_nbytes:
        raise UserError(str(dense), "size", f"{dense.stat().st_size} bytes, index.json says {index.dense_nbytes}",
                        f"pack {index.folder} again (or copy the file again)")


# ------------------------------------------------------------------------------------------- plan checks
def check_plan_matches(index: PackIndex, plan, plan_path: str) -> None:
    """Refuse a plan whose model, experts, MoE layers or any expert's format differ from the packed ones.

    Budgets, tier splits, cache and staging may differ: such a plan runs on the same packed folder."""
    src = plan.sources.model.sha256 if plan.sources else ""
    fix = f"plan again with --model {index.folder or 'the packed folder'}, or pack again with --plan {plan_path}"
    if src != index.config_sha256:
        raise UserError(plan_path, "sources.model.sha256", f"plan is for {plan.model} (config {src[:12]}), the packed "
                        f"folder holds {index.model} (config {index.config_sha256[:12]})", fix)
    if plan.n_experts != index.n_experts:
        raise UserError(plan_path, "n_experts", f"{plan.n_experts}, the packed model has {index.n_experts}", fix)
    layers = tuple(lp.layer for lp in plan.layers)
    if layers != index.layers:
        raise UserError(plan_path, "layers", f"plan places MoE layers {_span(layers)}, the packed folder holds "
                        f"{_span(index.layers)}", fix)
    packed = index.layer_formats()
    for lp in plan.layers:
        for e in range(plan.n_experts):
            want, have = lp.format_of(e), packed[lp.layer][e]
            if want != have:
                raise UserError(plan_path, f"layers[layer={lp.layer}].formats", f"expert {e} is {want} in the plan, "
                                f"packed as {have}", fix)


def _span(layers) -> str:
    return f"{layers[0]}..{layers[-1]} ({len(layers)})" if layers else "none"


# -------------------------------------------------------------------------------------------- checksums
def verify_blob(index: PackIndex, entry: PackedEntry, data) -> None:
    """Check one expert blob as read (bytes, numpy array, or a CPU uint8 tensor) against its sha256."""
    if hasattr(data, "numpy"):
        data = data.numpy()
    got = sha256_bytes(data)
    if got != entry.sha256:
        raise UserError(str(index.path(entry.file)), f"layer {entry.layer} expert {entry.expert}",
                        f"checksum mismatch at offset {entry.offset} ({entry.nbytes} bytes): sha256 {got[:16]}..., "
                        f"index.json says {entry.sha256[:16]}...", f"the file is damaged: pack {index.folder} again")


def read_blob(index: PackIndex, entry: PackedEntry, verify: bool = True) -> bytes:
    """One expert's bytes read plainly from its file (the store reads with O_DIRECT; this is the reference)."""
    with open(index.path(entry.file), "rb") as f:
        f.seek(entry.offset)
        data = f.read(entry.nbytes)
    if verify:
        verify_blob(index, entry, data)
    return data


def verify_dense(index: PackIndex) -> None:
    path = index.path(DENSE_FILE)
    got = sha256_file(path)
    if got != index.dense_sha256:
        raise UserError(str(path), "dense_sha256", f"checksum mismatch: sha256 {got[:16]}..., index.json says "
                        f"{index.dense_sha256[:16]}...", f"the file is damaged: pack {index.folder} again")


def verify_all(index: PackIndex) -> int:
    """Check every blob and dense.safetensors; returns the bytes hashed."""
    for e in index.entries:
        read_blob(index, e, verify=True)
    verify_dense(index)
    return index.expert_bytes + index.dense_nbytes
