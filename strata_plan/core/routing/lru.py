"""Static set + LRU cache hit rates of one layer's access stream, from stack distances (the fast path).

The cache model (the brute-force twin is `reference.simulate_cache`): the `s` most popular experts of a
layer are resident for good (the static set); the others go through one LRU cache of `c` experts. Tokens
are processed in order; a token's k experts are looked up against the cache as it stood after the
previous token, then touched in slot order (highest gate weight first). So the cache after a token holds
the `c` most recently touched non-static experts, ordered by (token, slot), and an access hits iff fewer
than `c` other non-static experts were touched after this expert's last touch and before this token:
its stack distance. One pass over the stream gives every access's distance, hence the hit rate of every
cache size at once; distances for all static-set sizes come from the same pass (one column per size).
"""
from __future__ import annotations

import numpy as np

COLD = np.iinfo(np.int32).max   # stack distance of a first touch: a miss at every cache size
CHUNK = 1 << 23                 # accesses x experts compared at once (32 MiB of float32)


def stack_distances(experts: np.ndarray, rank: np.ndarray, static_sizes: np.ndarray, first: int = 0) -> np.ndarray:
    """Stack distances of the accesses of tokens `first`.. of one layer, for each static-set size.

    experts      int [T, k]  the layer's experts per token (all tokens: earlier ones set the cache state)
    rank         int [E]     popularity rank of each expert (0 = most used); static set of size s = rank < s
    static_sizes int [S]
    returns      int32 [T - first, k, S]: -1 where the expert is static, COLD on a first touch, else the
                 number of distinct non-static experts touched after its last touch, before this token.
    """
    T, k = experts.shape
    E = len(rank)
    pos = np.arange(T * k, dtype=np.int64).reshape(T, k)          # touch order: (token, slot)
    touched = np.full((T + 1, E), -1, dtype=np.int64)             # [T+1, E] position of x in token t-1
    touched[np.arange(1, T + 1)[:, None], experts] = pos
    last = np.maximum.accumulate(touched, axis=0)[first:T]        # [T', E] last touch of x before token t
    mine = experts[first:]                                        # [T', k]
    prev = np.take_along_axis(last, mine, axis=1)                 # [T', k] this expert's last touch
    nonstatic = (rank[:, None] >= static_sizes[None, :]).astype(np.float32)   # [E, S]
    d = np.empty((len(mine), k, len(static_sizes)), dtype=np.int32)
    step = max(1, CHUNK // (k * E))                               # tokens per chunk: bounded memory
    for a in range(0, len(mine), step):
        newer = (last[a:a + step, None, :] > prev[a:a + step, :, None]).astype(np.float32)  # [t, k, E] touched since
        d[a:a + step] = np.rint(newer @ nonstatic)                # [t, k, S] exact: sums of 0/1 below 2^24
    d[prev < 0] = COLD
    d[rank[mine][:, :, None] < static_sizes[None, None, :]] = -1
    return d


def hit_counts(d: np.ndarray, cache_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """From `stack_distances` output: (static hits [S], LRU hits [S, C], accesses n), as counts."""
    n = d.shape[0] * d.shape[1]
    flat = d.reshape(n, -1)                                       # [N, S]
    static = (flat < 0).sum(axis=0)                               # [S]
    lru = np.empty((flat.shape[1], len(cache_sizes)), dtype=np.int64)
    for j in range(flat.shape[1]):
        dist = np.sort(flat[flat[:, j] >= 0, j])
        lru[j] = np.searchsorted(dist, cache_sizes, side="left")  # accesses with distance < c
    return static, lru, n


def hit_grid(d: np.ndarray, cache_sizes: np.ndarray) -> np.ndarray:
    """Total hit rate [S, C] (static hits plus LRU hits, over all accesses) from `stack_distances` output."""
    static, lru, n = hit_counts(d, cache_sizes)
    return (static[:, None] + lru) / n
