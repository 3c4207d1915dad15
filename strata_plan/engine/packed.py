"""The packed model folder as the engine reads it: `index.json`, checked strictly, and the checks that tie a
packed folder to a plan and every byte to its sha256.

    index = load_index(DIR)                     # strict: format, version, fields, files present and long enough
    check_plan_matches(index, plan, plan_path)  # model, top-k, experts, layers, each expert's format: the packed ones
    verify_blob(index, entry, data)             # sha256 of each part of one blob as read; names layer, expert, file
    verify_dense(index)                         # sha256 of each part of dense.safetensors, on hashing threads

Every blob and dense.safetensors are hashed in parts of `part_bytes` (1 MiB): the parts of one blob or file are
checked on several threads at once (hashlib releases the interpreter lock), and the store checks an NVMe
blob's parts as its reads land (engine/transfer.py). A plan with other budgets or tier splits (vram/ram/nvme
ids, cache slots, staging) and the same formats runs on the same packed folder without re-packing. sha256
costs about 0.65 s per GB on one core (PACK.md).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path

from strata_plan.errors import UserError
from strata_plan.kernels import formats as F

INDEX_FORMAT = "strata-plan/packed-experts"
INDEX_VERSION = 4        # 2: lane-major codes, unit-major tensors; 3: sha256 of every blob, dense and plan;
                         # 4: sha256 of every part_bytes part of each blob and of dense.safetensors
DENSE_FILE = "dense.safetensors"
PART_BYTES = 1 << 20     # bytes per hashed part (a multiple of formats.EXPERT_ALIGN): 18 parts of a 18.5 MB expert
DIGEST_CHARS = 64        # a sha256 in hex


@dataclass(frozen=True)
class PackedEntry:
    layer: int          # decoder layer index
    expert: int
    file: str           # relative to the index
    offset: int         # bytes, a multiple of formats.EXPERT_ALIGN
    nbytes: int
    format: str
    parts: tuple[str, ...]   # sha256 of each part_bytes slice of the blob's nbytes bytes (the last one shorter)


@dataclass(frozen=True)
class PackIndex:
    model: str                  # ModelSpec.name of what was packed (e.g. kimi-k3.1-pro@5moe for a synthetic one)
    hidden: int
    moe_intermediate: int
    n_experts: int
    source: str                 # checkpoint folder, or "synthetic (random weights, seed S)"
    config_sha256: str          # ModelSpec.config_sha256 of config.json in the folder
    plan_sha256: str            # sha256 of the plan file's bytes it was packed from ("" for --bpw / --format)
    part_bytes: int             # bytes per hashed part of a blob or of dense.safetensors
    dense_nbytes: int
    dense_parts: tuple[str, ...]   # sha256 of each part_bytes slice of dense.safetensors
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


def write_index(out: str | os.PathLike, index: PackIndex) -> Path:
    from strata_plan.yamlio import atomic_write_text
    return atomic_write_text(Path(out) / "index.json", json.dumps(index.to_data(), indent=1) + "\n")


# ---------------------------------------------------------------------------------------------- loading
_REPACK = (f"pack the checkpoint again with this strata-plan (`strata-plan pack CHECKPOINT --out DIR --force` writes "
           f"{INDEX_FORMAT} v{INDEX_VERSION})")


def _repack(folder) -> str:
    return (f"pack the checkpoint again with this strata-plan: strata-plan pack CHECKPOINT --out {folder} --force "
            f"(writes v{INDEX_VERSION})")


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
    format registry, a part digest list of the wrong length, and (with `check_files`) a blob file or
    dense.safetensors that is missing or shorter than the index says. Checksums are not computed here
    (`verify_blob`, `verify_dense`, `verify_all`)."""
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
        v = data.get("version")
        why = " (one sha256 per blob)" if data.get("format") == INDEX_FORMAT and v == 3 else ""
        raise UserError(where, "version", f"got {data.get('format')!r} v{v}{why}, this strata-plan reads "
                        f"v{INDEX_VERSION} (a sha256 of every {PART_BYTES >> 20} MiB part, checked on every run)",
                        _repack(p.parent))
    data = dict(data)
    data.pop("format"), data.pop("version")
    _strict(PackIndex, data, where, "", skip=("folder",))
    if not isinstance(data["entries"], list):
        raise UserError(where, "entries", "must be a list", _REPACK)
    pb = data["part_bytes"]
    if pb <= 0 or pb % F.EXPERT_ALIGN:
        raise UserError(where, "part_bytes", f"{pb}: not a positive multiple of {F.EXPERT_ALIGN}", _REPACK)
    data["dense_parts"] = _digests(data["dense_parts"], data["dense_nbytes"], pb, where, "dense_parts")
    entries = []
    for i, raw in enumerate(data["entries"]):
        raw = _strict(PackedEntry, raw, where, f"entries[{i}]")
        e = PackedEntry(**{**raw, "parts": _digests(raw["parts"], raw["nbytes"], pb, where, f"entries[{i}].parts")})
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


def _digests(value, nbytes: int, part_bytes: int, where: str, field: str) -> tuple[str, ...]:
    """A list of one sha256 (hex) per part_bytes part of nbytes bytes, as a tuple."""
    n = -(-nbytes // part_bytes)
    if not isinstance(value, list) or len(value) != n:
        got = f"{len(value)} digests" if isinstance(value, list) else repr(type(value).__name__)
        raise UserError(where, field, f"{got}, {nbytes} bytes in parts of {part_bytes} need {n}", _REPACK)
    if not all(isinstance(d, str) and len(d) == DIGEST_CHARS for d in value):
        raise UserError(where, field, "a digest that is not a sha256 in hex", _REPACK)
    return tuple(value)


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
    """Refuse a plan whose model (its name against the one it records, its config against the packed one), top-k,
    experts, MoE layers, dense layers or any expert's format differ from the packed model's (the folder's
    config.json read as a spec, checked against the index).

    Budgets, tier splits, cache and staging may differ: such a plan runs on the same packed folder."""
    src = plan.sources.model.sha256 if plan.sources else ""
    fix = f"plan again with --model {index.folder or 'the packed folder'}, or pack again with --plan {plan_path}"
    recorded = plan.sources.model.name if plan.sources else ""
    if plan.model != recorded:
        raise UserError(plan_path, "model", f"{plan.model!r}, but the plan was made for {recorded!r} (sources.model; "
                        f"the packed folder holds {index.model})", f"write `model: {recorded}` back, or plan again")
    if src != index.config_sha256:
        raise UserError(plan_path, "sources.model.sha256", f"plan is for {plan.model} (config {src[:12]}), the packed "
                        f"folder holds {index.model} (config {index.config_sha256[:12]})", fix)
    if index.folder:
        from strata_plan.core.plan import check_plan_model
        spec = packed_spec(index)
        check_plan_model(plan, spec, plan_path)
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


def packed_spec(index: PackIndex):
    """The ModelSpec of the folder's config.json, refused in one line unless it is the config the index was
    packed from (a config.json edited or copied from elsewhere would give the runtime other shapes)."""
    from strata_plan.core.spec import load_spec
    path = index.path("config.json")
    if not path.is_file():
        raise UserError(str(path), "file", "missing (every packed folder has one)", f"pack {index.folder} again")
    spec = load_spec(str(path))
    spec = dataclasses.replace(spec, name=index.model)        # named as packed, not after the folder
    if spec.config_sha256 != index.config_sha256:
        raise UserError(str(path), "config_sha256", f"{spec.config_sha256[:12]}, index.json says the folder was packed "
                        f"from config {index.config_sha256[:12]}", f"restore the config.json it was packed with, or "
                        f"pack {index.folder} again")
    return spec


def _span(layers) -> str:
    return f"{layers[0]}..{layers[-1]} ({len(layers)})" if layers else "none"


# -------------------------------------------------------------------------------------------- checksums
def hash_threads() -> int:
    """Threads that hash at once: the cores this process may use (`threads.usable_cores`)."""
    from strata_plan.threads import usable_cores
    return usable_cores()


def part_ok(data, a: int, b: int, want: str) -> bool:
    """Bytes [a, b) of a bytes-like object hash to `want` (sha256 hex)."""
    return hashlib.sha256(memoryview(data).cast("B")[a:b]).hexdigest() == want


def blob_mismatch(folder, path, layer: int, expert: int, offset: int, nbytes: int, part: int,
                  part_bytes: int) -> UserError:
    """The one line for an expert blob whose part `part` differs from its sha256 in the index."""
    a = part * part_bytes
    return UserError(str(path), f"layer {layer} expert {expert}",
                     f"checksum mismatch in bytes {a}..{min(nbytes, a + part_bytes)} of the {nbytes}-byte blob at "
                     f"offset {offset} (sha256 of part {part} differs from index.json)",
                     f"the file is damaged: copy it again, or pack again with `strata-plan pack ... --out {folder} "
                     f"--force`")


def verify_part(index: PackIndex, entry: PackedEntry, data, k: int) -> None:
    """Check part k of one expert blob as read (bytes or a numpy array of the whole blob) against its sha256."""
    P = index.part_bytes
    if not part_ok(data, k * P, min(entry.nbytes, (k + 1) * P), entry.parts[k]):
        raise blob_mismatch(index.folder, index.path(entry.file), entry.layer, entry.expert, entry.offset,
                            entry.nbytes, k, P)


def verify_blob(index: PackIndex, entry: PackedEntry, data) -> None:
    """Check one expert blob as read (bytes, numpy array, or a CPU uint8 tensor) against its parts' sha256."""
    if hasattr(data, "numpy"):
        data = data.numpy()
    for k in range(len(entry.parts)):
        verify_part(index, entry, data, k)


def read_blob(index: PackIndex, entry: PackedEntry, verify: bool = True) -> bytes:
    """One expert's bytes read plainly from its file (the store reads with O_DIRECT; this is the reference)."""
    with open(index.path(entry.file), "rb") as f:
        f.seek(entry.offset)
        data = f.read(entry.nbytes)
    if verify:
        verify_blob(index, entry, data)
    return data


def verify_dense(index: PackIndex, threads: int = 0) -> None:
    """Check dense.safetensors against its parts' sha256, reading and hashing the parts on `threads` threads (0:
    `hash_threads()`); reads go through the page cache, so the weights' load that follows reads them from it."""
    path = index.path(DENSE_FILE)
    P, n = index.part_bytes, index.dense_nbytes
    fd = os.open(path, os.O_RDONLY)

    def ok(k: int) -> bool:
        a = k * P
        data = os.pread(fd, min(P, n - a), a)
        return len(data) == min(P, n - a) and part_ok(data, 0, len(data), index.dense_parts[k])
    try:
        with ThreadPoolExecutor(threads or hash_threads()) as pool:
            bad = next((k for k, good in enumerate(pool.map(ok, range(len(index.dense_parts)))) if not good), None)
    finally:
        os.close(fd)
    if bad is not None:
        raise UserError(str(path), "dense_parts", f"checksum mismatch in bytes {bad * P}..{min(n, (bad + 1) * P)} "
                        f"(sha256 of part {bad} differs from index.json): the dense weights are damaged",
                        f"copy the file again, or pack again with `strata-plan pack ... --out {index.folder} --force`")


def verify_all(index: PackIndex) -> int:
    """Check every blob and dense.safetensors; returns the bytes hashed."""
    def check(e: PackedEntry) -> None:
        read_blob(index, e, verify=True)
    with ThreadPoolExecutor(hash_threads()) as pool:
        list(pool.map(check, index.entries))
    verify_dense(index)
    return index.expert_bytes + index.dense_nbytes
