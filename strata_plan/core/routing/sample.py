"""Sample a synthetic routing trace from a prior (Zipf popularity + temporal locality).

The generative model, per MoE layer (layers are independent):
- popularity rank r = 1..E has weight r^-s (s = `zipf_s`; s = 0 is uniform);
- the first token of a sequence draws k distinct experts by successive sampling: draw from the weights,
  skip an expert already chosen, repeat;
- every later token keeps each of the previous token's k experts with probability `locality`, then fills
  the remaining slots by successive sampling among the experts it did not keep.
Slots are ordered by weight; gate weights are the chosen experts' weights, normalised (synthetic).
Successive sampling uses candidate draws with replacement, duplicates skipped: exact, and O(k log E) per
token and layer rather than O(E). With `permute` each layer maps ranks to expert ids at random; without,
expert id = rank - 1 (expert 0 is the most popular), which is what priors use.
"""
from __future__ import annotations

import numpy as np

from .trace import Trace

SEQ_LEN = 256      # tokens per synthetic sequence (the Mixtral trace's decodes are 79..255 tokens)
BLOCK = 256        # tokens whose candidate draws are made at once


def rank_weights(n_experts: int, zipf_s: float) -> np.ndarray:
    """Normalised weight of each popularity rank (index 0 = rank 1)."""
    w = np.arange(1, n_experts + 1, dtype=np.float64) ** -float(zipf_s)
    return w / w.sum()


def sample_experts(zipf_s: float, locality: float, n_layers: int, n_experts: int, top_k: int, tokens: int,
                   seed: int = 0, seq_len: int = SEQ_LEN, permute: bool = True
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(experts int32 [T, L, k], weights float32 [T, L, k], sequence int32 [T]) from the model above."""
    L, E, k = n_layers, n_experts, top_k
    if not 1 <= k <= E or tokens < 1 or L < 1:
        raise ValueError(f"need 1 <= top_k ({k}) <= n_experts ({E}), tokens >= 1 and layers >= 1")
    rng = np.random.default_rng(seed)
    p = rank_weights(E, zipf_s)
    cdf = np.cumsum(p)
    to_id = np.argsort(rng.random((L, E)), axis=1) if permute else np.tile(np.arange(E), (L, 1))
    p_id = np.empty((L, E))
    p_id[np.arange(L)[:, None], to_id] = p                       # [L, E] weight of each expert id
    M = 2 * k + 8                                                # candidate draws per token and layer
    rows = np.arange(L)[:, None]
    chosen = np.empty((tokens, L, k), dtype=np.int64)
    for b in range(0, tokens, BLOCK):
        n = min(BLOCK, tokens - b)
        ranks = np.minimum(np.searchsorted(cdf, rng.random((n, L, M)) * cdf[-1], side="right"), E - 1)
        cand = to_id[rows[None], ranks]                          # [n, L, M] expert ids drawn by weight
        fresh = _first_occurrence(cand)                          # [n, L, M]
        keep = rng.random((n, L, k)) < locality                  # [n, L, k] keep the previous token's slot
        for i in range(n):
            t = b + i
            cont = t % seq_len != 0 and locality > 0             # continues a sequence with locality
            kept = np.where(keep[i], chosen[t - 1], -1) if cont else np.full((L, k), -1)
            chosen[t] = _fill(kept, cand[i], fresh[i], E)
            for l in np.flatnonzero((chosen[t] >= E).any(axis=1)):   # rare: too few distinct candidates
                chosen[t, l] = _slow_fill(rng, p_id[l], kept[l][kept[l] >= 0], k)
    order = np.argsort(-p_id[rows[None], chosen], axis=2, kind="stable")
    experts = np.take_along_axis(chosen, order, axis=2).astype(np.int32)   # slots by weight
    w = p_id[rows[None], experts]                                # [T, L, k]
    weights = (w / w.sum(axis=2, keepdims=True)).astype(np.float32)
    sequence = (np.arange(tokens) // seq_len).astype(np.int32)
    return experts, weights, sequence


def _first_occurrence(cand: np.ndarray) -> np.ndarray:
    """[..., M] True where cand[..., j] does not occur in cand[..., :j]."""
    idx = np.argsort(cand, axis=-1, kind="stable")               # equal ids keep their draw order
    s = np.take_along_axis(cand, idx, axis=-1)
    first = np.ones(cand.shape, dtype=bool)
    first[..., 1:] = s[..., 1:] != s[..., :-1]
    out = np.empty_like(first)
    np.put_along_axis(out, idx, first, axis=-1)
    return out


def _fill(kept: np.ndarray, cand: np.ndarray, fresh: np.ndarray, E: int) -> np.ndarray:
    """[L, k]: the kept ids (-1 = free slot) plus the first fresh candidates not kept; E where none is left."""
    L, k = kept.shape
    M = cand.shape[1]
    ok = fresh & ~(cand[:, :, None] == kept[:, None, :]).any(axis=2)        # [L, M]
    need = (kept < 0).sum(axis=1, keepdims=True)                            # [L, 1]
    take = ok & (np.cumsum(ok, axis=1) <= need)
    pool = np.concatenate([kept, cand], axis=1)                             # [L, k + M]
    key = np.concatenate([np.where(kept >= 0, 0, M + 1), np.where(take, 1 + np.arange(M), M + 1)], axis=1)
    idx = np.argsort(key, axis=1, kind="stable")[:, :k]
    out = np.take_along_axis(pool, idx, axis=1)
    return np.where(np.take_along_axis(key, idx, axis=1) > M, E, out)


def _slow_fill(rng: np.random.Generator, p: np.ndarray, kept: np.ndarray, k: int) -> np.ndarray:
    """Successive sampling of the free slots one draw at a time (the rare fallback of `_fill`)."""
    q = p.copy()
    q[kept] = 0.0
    out = list(kept)
    while len(out) < k:
        e = int(rng.choice(len(q), p=q / q.sum()))
        out.append(e)
        q[e] = 0.0
    return np.array(out)


def sample_trace(zipf_s: float, locality: float, n_layers: int, n_experts: int, top_k: int, tokens: int,
                 seed: int = 0, model: str = "", source: str = "", seq_len: int = SEQ_LEN,
                 permute: bool = True) -> Trace:
    experts, weights, sequence = sample_experts(zipf_s, locality, n_layers, n_experts, top_k, tokens, seed,
                                                seq_len, permute)
    return Trace(experts=experts, weights=weights, sequence=sequence, model=model, n_experts=n_experts,
                 phase="decode", source=source or f"sampled: zipf_s={zipf_s}, locality={locality}, seed={seed}")
