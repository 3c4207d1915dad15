"""A sampled token's draw in one kernel: the Gumbel-max over splitmix64 noise that `engine.picks.GumbelPick` draws
in torch, where the hash and the noise alone are about 25 small kernels in a decode step's graph.

    gumbel_argmax(z, salt, counter, out)    # out[0] = argmax_i z[i] - log(-log(u_i)); then counter += 1

z: float32 [V], the logits over the temperature (-inf outside the nucleus); counter: int64 [1] on z's device;
u_i = ((splitmix64(counter * V + i + salt + GOLDEN) >> 11) + 0.5) / 2^53, exactly `engine.picks.hash_uniform`'s bits
(uint64 arithmetic wraps as torch's int64 does; its logical shifts are torch's `_srl`). One program walks V in blocks;
ties go to the lowest index, as torch's argmax. Graph-safe: no allocation, no host sync.
"""
from __future__ import annotations

import torch

from .triton_common import tl, triton

BLOCK = 2048                      # logits a step of the walk reads


def wrap64(x: int) -> int:
    """`x` as the signed int64 with the same low 64 bits (the wrap of int64 arithmetic)."""
    return (x + (1 << 63)) % (1 << 64) - (1 << 63)


GOLDEN, MIX1, MIX2 = (wrap64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))   # splitmix64


@triton.jit
def gumbel_argmax_kernel(z_p, counter_p, out_p, V, start_k, mix1_k, mix2_k, BLOCK: tl.constexpr):
    # z_p: float32 [V]; counter_p: int64 [1] (read, then advanced by one); out_p: int64 [1]
    # start_k: int64, salt + GOLDEN (wrapped); mix1_k, mix2_k: int64 bit patterns of splitmix64's multipliers
    # grid (1,): the one program walks V in BLOCK steps, each lane keeping its best score and index
    c = tl.load(counter_p)
    base = (c * V + start_k).to(tl.uint64, bitcast=True)
    mix1 = mix1_k.to(tl.uint64, bitcast=True)
    mix2 = mix2_k.to(tl.uint64, bitcast=True)
    best = tl.full([BLOCK], float("-inf"), tl.float64)                          # [BLOCK]
    best_i = tl.zeros([BLOCK], dtype=tl.int64)                                  # [BLOCK]
    for s in range(0, V, BLOCK):
        i = s + tl.arange(0, BLOCK).to(tl.int64)                                # [BLOCK]
        m = i < V
        x = base + i.to(tl.uint64, bitcast=True)
        x = (x ^ (x >> 30)) * mix1
        x = (x ^ (x >> 27)) * mix2
        x = x ^ (x >> 31)
        u = ((x >> 11).to(tl.float64) + 0.5) / 9007199254740992.0              # (0, 1), 2^53 steps
        zz = tl.load(z_p + i, mask=m, other=float("-inf")).to(tl.float64)
        score = tl.where(m, zz - tl.log(-tl.log(u)), float("-inf"))
        better = score > best                                                    # a lane keeps its first maximum
        best = tl.where(better, score, best)
        best_i = tl.where(better, i, best_i)
    top = tl.max(best, 0)
    idx = tl.min(tl.where(best == top, best_i, V), 0)                          # ties: the lowest index
    tl.store(out_p, idx)
    tl.store(counter_p, c + 1)


def gumbel_argmax(z: torch.Tensor, salt: int, counter: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out int64 [1] = the index of the largest z[i] - log(-log(u_i)) (module doc), counter advanced; `salt` the seed's
    signed int64 offset (`engine.picks.hash_uniform`'s). Returns out."""
    if z.dtype != torch.float32 or z.dim() != 1 or not z.is_contiguous():
        raise ValueError(f"gumbel_argmax: z must be a contiguous float32 vector, got {z.dtype} {tuple(z.shape)}")
    if counter.dtype != torch.int64 or out.dtype != torch.int64 or counter.numel() != 1 or out.numel() != 1:
        raise ValueError("gumbel_argmax: counter and out must be int64 [1]")
    gumbel_argmax_kernel[(1,)](z, counter, out, z.numel(), wrap64(salt + GOLDEN), MIX1, MIX2, BLOCK=BLOCK)
    return out
