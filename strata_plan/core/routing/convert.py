"""Convert the JSONL Mixtral routing trace (shared/data/routing/mixtral8x7b_vllm_routing) to a `Trace`.

Each line is one (problem, token, layer): {"dataset", "problem_id", "layer", "token_idx", "experts",
"gating_probs"}, experts in descending probability. A token is kept only if every layer is present
(the last tokens of a problem lack some); a sequence is one (dataset, problem_id), in file order, and is
split where a dropped token leaves a gap, so "the previous token" is always the one decoded just before.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Iterable

import numpy as np

from strata_plan.errors import UserError

from .trace import Trace

_FIELDS = {"dataset": str, "problem_id": int, "layer": int, "token_idx": int, "experts": list, "gating_probs": list}


def trace_from_jsonl(paths: Iterable[str | os.PathLike], model: str = "mixtral-8x7b", n_experts: int = 8,
                     n_layers: int | None = None) -> Trace:
    """Read one or more `*_routing.jsonl` files into one decode trace (files in the order given)."""
    paths = [Path(p) for p in paths]
    tokens: dict[tuple, dict[int, tuple[list, list]]] = defaultdict(dict)   # (dataset, problem, token) -> layer
    k = None
    for path in paths:
        for where, rec in _records(path):
            if k is None:
                k = len(rec["experts"])
            if len(rec["experts"]) != k or len(rec["gating_probs"]) != k:
                raise UserError(where, "experts", f"lists {len(rec['experts'])} experts and {len(rec['gating_probs'])} "
                                f"probabilities; earlier records list {k}", "give every record the same top-k")
            key = (rec["dataset"], rec["problem_id"], rec["token_idx"])
            if rec["layer"] in tokens[key]:
                raise UserError(where, "layer", f"layer {rec['layer']} of token {key} appears twice", "remove the duplicate record")
            tokens[key][rec["layer"]] = (rec["experts"], rec["gating_probs"])
    if not tokens:
        raise UserError(", ".join(map(str, paths)), "", "no routing records", "pass *_routing.jsonl files")
    L = n_layers or 1 + max(layer for layers in tokens.values() for layer in layers)
    complete = [key for key, layers in tokens.items() if len(layers) == L and max(layers) == L - 1]
    if not complete:
        raise UserError(str(paths[0]), "layer", f"no token has all {L} layers", "pass a trace with whole tokens")
    experts = np.empty((len(complete), L, k), dtype=np.int32)
    weights = np.empty((len(complete), L, k), dtype=np.float32)
    sequence = np.empty(len(complete), dtype=np.int32)
    problems: dict[tuple, int] = {}                              # (dataset, problem) in order of first record
    for key in tokens:
        problems.setdefault(key[:2], len(problems))
    seq, prev = -1, None
    for i, key in enumerate(sorted(complete, key=lambda q: (problems[q[:2]], q[2]))):
        if prev is None or prev[:2] != key[:2] or key[2] != prev[2] + 1:
            seq += 1                                             # a new problem, or a gap left by a dropped token
        sequence[i] = seq
        for layer, (ex, pr) in tokens[key].items():
            experts[i, layer], weights[i, layer] = ex, pr
        prev = key
    source = "; ".join(str(p) for p in paths)
    return Trace(experts=experts, weights=weights, sequence=sequence, model=model, n_experts=n_experts,
                 phase="decode", source=source)


def _records(path: Path):
    try:
        f = path.open(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(str(path), "", "file not found", "check the path") from None
    except OSError as e:
        raise UserError(str(path), "", f"cannot read file ({e.__class__.__name__})", "pass a readable JSONL file") from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(where, "", "not a JSON object (truncated line?)", "one JSON record per line") from None
            if not isinstance(rec, dict):
                raise UserError(where, "", "not a JSON object", "one JSON record per line")
            for field, tp in _FIELDS.items():
                v = rec.get(field)
                if not isinstance(v, tp) or isinstance(v, bool):
                    raise UserError(where, field, f"missing or not {tp.__name__}: {v!r}",
                                    "records carry dataset, problem_id, layer, token_idx, experts, gating_probs")
            if rec["layer"] < 0 or rec["token_idx"] < 0:
                raise UserError(where, "layer" if rec["layer"] < 0 else "token_idx", "is negative", "use indices from 0")
            yield where, rec
