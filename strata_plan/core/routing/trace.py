"""The routing trace (format v1): which experts every token used, layer by layer, as a `.npz` file.

TRACE.md beside this file is the reference for people; this module is the reference for programs. A trace
is checked when it is built, loaded and saved: ids outside [0, E), a layer count other than the model's
MoE layers, arrays that disagree in shape or a truncated file are refused with one `UserError` line.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from strata_plan.core.lookahead import MAX_DEPTH
from strata_plan.errors import UserError
from strata_plan.yamlio import atomic_write_bytes

if TYPE_CHECKING:
    from strata_plan.core.spec import ModelSpec

FORMAT = "strata-plan/routing-trace"
VERSION = 1
PHASES = ("decode", "prefill", "mixed")
ARRAYS = ("experts", "weights", "sequence", "lookahead_experts", "lookahead_scores", "meta")


@dataclass(frozen=True, eq=False)
class Trace:
    """A routing trace in memory. Arrays (T tokens, L MoE layers, top-k, D lookahead depths):

    experts  int32 [T, L, k]    routed expert ids per token and MoE layer, descending gate weight
    weights  float32 [T, L, k]  their gate weights
    sequence int32 [T]          sequence id per token; a sequence's tokens are contiguous and in order
    lookahead_experts int32 [T, L, D, k] / lookahead_scores float32 [T, L, D, k] (optional): the top-k
             that MoE layer i+d's gate picks from MoE layer i's output, d = 1..D; -1 / 0.0 past the last layer
    """

    experts: np.ndarray
    weights: np.ndarray
    sequence: np.ndarray
    model: str
    n_experts: int
    phase: str = "decode"
    source: str = ""
    lookahead_experts: np.ndarray | None = None
    lookahead_scores: np.ndarray | None = None

    def __post_init__(self) -> None:
        check_trace(self, self.source or "trace")

    @property
    def n_tokens(self) -> int:
        return self.experts.shape[0]

    @property
    def n_layers(self) -> int:
        return self.experts.shape[1]

    @property
    def top_k(self) -> int:
        return self.experts.shape[2]

    @property
    def depth(self) -> int:
        """Lookahead depths D recorded (0 = none)."""
        return 0 if self.lookahead_experts is None else self.lookahead_experts.shape[2]

    @property
    def meta(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "model": self.model, "n_experts": self.n_experts,
                "top_k": self.top_k, "n_layers": self.n_layers, "phase": self.phase, "source": self.source}

    @property
    def sha256(self) -> str:
        """Content hash of the arrays and the meta (independent of how the file was compressed)."""
        h = hashlib.sha256(json.dumps(self.meta, sort_keys=True).encode())
        for a in (self.experts, self.weights, self.sequence, self.lookahead_experts, self.lookahead_scores):
            if a is not None:
                h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def check_model(self, spec: "ModelSpec", where: str | None = None) -> None:
        """Refuse a trace whose geometry is not `spec`'s (experts, MoE layers, top-k)."""
        where = where or self.source or "trace"
        if self.n_experts != spec.n_routed:
            raise UserError(where, "meta.n_experts", f"{self.n_experts} experts, but {spec.name} has {spec.n_routed}",
                            "pass the --model the trace was recorded with")
        if self.n_layers != spec.n_moe_layers:
            raise UserError(where, "experts", f"{self.n_layers} MoE layers, but {spec.name} has {spec.n_moe_layers}",
                            "record one entry per MoE layer of the model, or pass the right --model")
        if self.top_k != spec.top_k:
            raise UserError(where, "experts", f"top-{self.top_k} routing, but {spec.name} routes top-{spec.top_k}",
                            "pass the --model the trace was recorded with")


def _fail(where: str, field: str, problem: str, fix: str = "regenerate the trace (see core/routing/TRACE.md)"):
    raise UserError(where, field, problem, fix)


def check_trace(t: Trace, where: str) -> None:
    """Every rule of format v1 that can be checked on the arrays; raises UserError naming the field."""
    e, w, seq = t.experts, t.weights, t.sequence
    if not isinstance(e, np.ndarray) or e.ndim != 3 or e.dtype.kind not in "iu":
        _fail(where, "experts", f"must be an int32 array [tokens, layers, top_k], got {_desc(e)}")
    T, L, k = e.shape
    if T == 0 or L == 0 or k == 0:
        _fail(where, "experts", f"is empty (shape {e.shape})", "record at least one token, layer and expert")
    if not isinstance(t.n_experts, (int, np.integer)) or t.n_experts < 1:
        _fail(where, "meta.n_experts", f"must be a positive integer, got {t.n_experts!r}")
    E = int(t.n_experts)
    if k > E:
        _fail(where, "meta.top_k", f"top-{k} exceeds the {E} experts")
    _check_ids(e, E, where, "experts", allow_missing=False)
    s = np.sort(e, axis=2)
    dup = np.argwhere(s[:, :, 1:] == s[:, :, :-1])
    if len(dup):
        ti, li, _ = dup[0]
        _fail(where, "experts", f"token {ti}, layer {li} lists expert {s[ti, li][_first_dup(s[ti, li])]} twice",
              "give k distinct experts per token and layer")
    if not isinstance(w, np.ndarray) or w.shape != e.shape or w.dtype.kind != "f":
        _fail(where, "weights", f"must be a float32 array of the experts' shape {e.shape}, got {_desc(w)}")
    if not np.isfinite(w).all():
        _fail(where, "weights", "has NaN or infinite gate weights")
    if not isinstance(seq, np.ndarray) or seq.shape != (T,) or seq.dtype.kind not in "iu":
        _fail(where, "sequence", f"must be an int32 array of {T} sequence ids (one per token), got {_desc(seq)}")
    starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
    if len(np.unique(seq[starts])) != len(starts):
        _fail(where, "sequence", "a sequence's tokens are not contiguous", "write each sequence's tokens together, in order")
    if t.phase not in PHASES:
        _fail(where, "meta.phase", f"got {t.phase!r}", f"use one of {', '.join(PHASES)}")
    _check_lookahead(t, where, E)


def _check_lookahead(t: Trace, where: str, E: int) -> None:
    le, ls = t.lookahead_experts, t.lookahead_scores
    if le is None and ls is None:
        return
    if le is None or ls is None:
        _fail(where, "lookahead_experts" if le is None else "lookahead_scores",
              "is missing while its partner is present", "save both lookahead arrays or neither")
    T, L, k = t.experts.shape
    if not isinstance(le, np.ndarray) or le.ndim != 4 or le.shape[:2] != (T, L) or le.shape[3] != k \
            or le.dtype.kind not in "iu" or not 1 <= le.shape[2] <= MAX_DEPTH:
        _fail(where, "lookahead_experts", f"must be int32 [{T}, {L}, D, {k}] with D in 1..{MAX_DEPTH}, got {_desc(le)}")
    if not isinstance(ls, np.ndarray) or ls.shape != le.shape or ls.dtype.kind != "f" or not np.isfinite(ls).all():
        _fail(where, "lookahead_scores", f"must be finite float32 of shape {le.shape}, got {_desc(ls)}")
    _check_ids(le, E, where, "lookahead_experts", allow_missing=True)
    D = le.shape[2]
    past = np.arange(L)[:, None] + np.arange(1, D + 1)[None, :] >= L     # [L, D]: layer i+d does not exist
    if (le[:, past, :] != -1).any():
        _fail(where, "lookahead_experts", "names experts for layers past the last MoE layer", "write -1 where i+d >= L")


def _check_ids(a: np.ndarray, E: int, where: str, field: str, allow_missing: bool) -> None:
    lo = -1 if allow_missing else 0
    bad = np.argwhere((a < lo) | (a >= E))
    if len(bad):
        idx = tuple(bad[0])
        allowed = f"[0, {E})" + (" or -1" if allow_missing else "")
        _fail(where, field, f"expert id {a[idx]} at token {idx[0]}, layer {idx[1]} is outside {allowed}",
              f"the model has {E} routed experts: pass the --model the trace was recorded with")


def _first_dup(row: np.ndarray) -> int:
    return int(np.flatnonzero(row[1:] == row[:-1])[0])


def _desc(a) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype} {list(a.shape)}"
    return type(a).__name__


# ------------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------------
def load_trace(path: str | os.PathLike, spec: "ModelSpec | None" = None) -> Trace:
    """Read a `.npz` trace; with `spec`, also check it matches the model's experts, MoE layers and top-k."""
    where = str(path)
    try:
        z = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(where, "", "file not found", "check the path") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(where, "", f"not a readable .npz file ({e.__class__.__name__})",
                        "pass a trace written by numpy.savez_compressed (see TRACE.md)") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise UserError(where, "", "holds a single array, not a trace", "save the trace with numpy.savez_compressed")
    with z:
        unknown = sorted(set(z.files) - set(ARRAYS))
        if unknown:
            _fail(where, unknown[0], "unknown array", f"keep only {', '.join(ARRAYS)}")
        missing = [n for n in ("experts", "weights", "sequence", "meta") if n not in z.files]
        if missing:
            _fail(where, missing[0], "missing array", "a trace holds experts, weights, sequence and meta")
        arrays = {n: _read(z, n, where) for n in z.files}
    meta = _parse_meta(arrays.pop("meta"), where)
    e = arrays["experts"]
    for key, got in (("n_layers", e.shape[1] if e.ndim == 3 else None), ("top_k", e.shape[2] if e.ndim == 3 else None)):
        if got is not None and meta[key] != got:
            _fail(where, f"meta.{key}", f"says {meta[key]}, but the experts array has {got}", "make meta agree with the arrays")
    try:
        trace = Trace(experts=e, weights=arrays["weights"], sequence=arrays["sequence"], model=meta["model"],
                      n_experts=meta["n_experts"], phase=meta["phase"], source=meta["source"] or where,
                      lookahead_experts=arrays.get("lookahead_experts"), lookahead_scores=arrays.get("lookahead_scores"))
    except UserError as err:                                     # name the file, not the trace's source text
        raise UserError(where, err.field, err.problem, err.fix) from None
    if spec is not None:
        trace.check_model(spec, where)
    return trace


def _read(z, name: str, where: str) -> np.ndarray:
    try:
        return z[name]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as e:
        raise UserError(where, name, f"cannot be read ({e.__class__.__name__}: the file is truncated or corrupt)",
                        "copy or regenerate the trace file") from None


_META_TYPES = {"format": str, "version": int, "model": str, "n_experts": int, "top_k": int, "n_layers": int,
               "phase": str, "source": str}


def _parse_meta(m: np.ndarray, where: str) -> dict:
    if m.ndim != 0 or m.dtype.kind not in "US":
        _fail(where, "meta", f"must be a 0-d string array holding JSON, got {_desc(m)}")
    try:
        meta = json.loads(str(m[()] if m.dtype.kind == "U" else m[()].decode()))
    except (json.JSONDecodeError, UnicodeDecodeError):
        _fail(where, "meta", "is not valid JSON")
    if not isinstance(meta, dict):
        _fail(where, "meta", "must be a JSON object")
    for key, tp in _META_TYPES.items():
        if key not in meta:
            _fail(where, f"meta.{key}", "missing", f"add \"{key}\" to meta")
        if not isinstance(meta[key], tp) or isinstance(meta[key], bool):
            _fail(where, f"meta.{key}", f"must be {'an integer' if tp is int else 'a string'}, got {meta[key]!r}")
    unknown = sorted(set(meta) - set(_META_TYPES))
    if unknown:
        _fail(where, f"meta.{unknown[0]}", "unknown key", f"keep only {', '.join(_META_TYPES)}")
    if meta["format"] != FORMAT:
        _fail(where, "meta.format", f"got {meta['format']!r}", f"a routing trace says \"{FORMAT}\"")
    if meta["version"] != VERSION:
        _fail(where, "meta.version", f"version {meta['version']} is not supported", f"this strata-plan reads version {VERSION}")
    return meta


def save_trace(trace: Trace, path: str | os.PathLike) -> Path:
    """Write `trace` as a compressed `.npz` atomically (temporary file beside it, fsync, rename)."""
    arrays = {"experts": trace.experts.astype(np.int32), "weights": trace.weights.astype(np.float32),
              "sequence": trace.sequence.astype(np.int32), "meta": np.array(json.dumps(trace.meta))}
    if trace.lookahead_experts is not None:
        arrays["lookahead_experts"] = trace.lookahead_experts.astype(np.int32)
        arrays["lookahead_scores"] = trace.lookahead_scores.astype(np.float32)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return atomic_write_bytes(path, buf.getvalue())
