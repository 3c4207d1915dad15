"""Routing traces of a trained model on held-out text, in the planner's trace format (v1, see
strata_plan/core/routing/TRACE.md): per token and MoE layer the top-k experts and gate weights, and the
router-lookahead guesses at depths 1..D.

Lookahead, exactly: for MoE layer i (the i-th MoE layer) and depth d, take h = the output of that decoder
layer (the residual stream after its MoE block), normalise it with the `post_attention_layernorm` of the
decoder layer that holds MoE layer i+d (the RMSNorm whose output that layer's router normally reads), and
apply MoE layer i+d's router to it, bias and group limit included. Its top-k (sorted by gate weight) is the
guess at depth d; the attention and MoE blocks between the two layers are skipped. Where i+d >= L the ids
are -1 and the scores 0.

Traces are computed in float32 (weights as saved in bf16, upcast) with the reference ("eager") experts, so
that a CPU forward reproduces them; each held-out file is its own sequence, fed whole (teacher forcing):
the routing of a token depends only on the tokens before it, so it is what a decode step would choose had
the model produced this text.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .model import GateTap, moe_blocks, moe_layer_indices


def _sorted(weights: torch.Tensor, ids: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    w, order = torch.sort(weights.float(), dim=-1, descending=True, stable=True)
    return ids.gather(-1, order).cpu().numpy().astype(np.int32), w.cpu().numpy().astype(np.float32)


@torch.no_grad()
def route_sequence(model, tokens: np.ndarray, depth: int = 4) -> dict[str, np.ndarray]:
    """Routing of one sequence: experts/weights [T, L, k], lookahead_experts/scores [T, L, depth, k]."""
    blocks, layer_ids = moe_blocks(model), moe_layer_indices(model)
    n_moe, k = len(blocks), model.config.num_experts_per_tok
    device = next(model.parameters()).device
    hidden: dict[int, torch.Tensor] = {}
    hooks = [model.model.layers[j].register_forward_hook(
        lambda _m, _i, out, j=j: hidden.__setitem__(j, out[0] if isinstance(out, tuple) else out))
        for j in layer_ids]
    tap = GateTap(model)
    try:
        model.model(input_ids=torch.as_tensor(tokens, dtype=torch.long, device=device)[None], use_cache=False)
        real = [(w, idx) for _, w, idx in tap.out]
    finally:
        tap.close()
        for h in hooks:
            h.remove()
    n_tok = len(tokens)
    experts = np.empty((n_tok, n_moe, k), np.int32)
    weights = np.empty((n_tok, n_moe, k), np.float32)
    for i, (w, idx) in enumerate(real):
        experts[:, i], weights[:, i] = _sorted(w, idx)
    la_ids = np.full((n_tok, n_moe, depth, k), -1, np.int32)
    la_scores = np.zeros((n_tok, n_moe, depth, k), np.float32)
    for i in range(n_moe):
        h = hidden[layer_ids[i]].reshape(n_tok, -1)
        for d in range(1, depth + 1):
            if i + d >= n_moe:
                break
            target = model.model.layers[layer_ids[i + d]]
            _, w, idx = target.mlp.gate(target.post_attention_layernorm(h))
            la_ids[:, i, d - 1], la_scores[:, i, d - 1] = _sorted(w, idx)
    return {"experts": experts, "weights": weights, "lookahead_experts": la_ids, "lookahead_scores": la_scores}


def routing_trace(model, sequences: list[np.ndarray], depth: int = 4) -> dict[str, np.ndarray]:
    """The trace arrays of several sequences, concatenated in order, with `sequence` ids."""
    parts = [route_sequence(model, s, depth) for s in sequences]
    out = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    out["sequence"] = np.concatenate([np.full(len(s), i, np.int32) for i, s in enumerate(sequences)])
    return out


def write_trace(path: Path, model, name: str, arrays: dict[str, np.ndarray], source: str) -> Path:
    """Write the trace through the planner's writer (which checks it against the format)."""
    from strata_plan.core.routing import Trace, save_trace
    trace = Trace(experts=arrays["experts"], weights=arrays["weights"], sequence=arrays["sequence"], model=name,
                  n_experts=int(model.config.n_routed_experts), phase="decode", source=source,
                  lookahead_experts=arrays["lookahead_experts"], lookahead_scores=arrays["lookahead_scores"])
    path.parent.mkdir(parents=True, exist_ok=True)
    save_trace(trace, path)
    return path


def heldout_sequences(tok, files, seq_len: int, max_tokens: int, min_tokens: int = 64,
                      eot_id: int = 0) -> tuple[list[np.ndarray], list[str]]:
    """Held-out files as sequences (EOT, then the file's first tokens), until `max_tokens` in total."""
    seqs, keys, total = [], [], 0
    for f in files:
        room = min(seq_len, max_tokens - total)
        if room < min_tokens:
            break
        ids = tok.encode(f.text).ids[:room - 1]
        if len(ids) + 1 < min_tokens:
            continue
        seqs.append(np.asarray([eot_id] + ids, dtype=np.int32))
        keys.append(f.key)
        total += len(seqs[-1])
    return seqs, keys
