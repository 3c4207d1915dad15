"""How a decode step picks its next token, as the step's last operation (inside the device loop's CUDA graph).

    model.decode_step(token, pick=GREEDY)                           # the argmax
    model.decode_step(token, pick=GumbelPick(0.7, 0.9, seed=1))     # a sampled token (temperature, top-p)

A pick is a callable logits float32 [V] -> int64 [1] with a `key` naming its graph (`device_loop.DeviceDecode` captures
one graph a key). `GumbelPick` holds no generator state: its draws come from a hash of (seed, a device counter, the
token index), so a replayed graph draws anew at every step.
"""
from __future__ import annotations

import torch


class ArgmaxPick:
    """Greedy decoding as a step's last operation: logits float32 [V] -> their argmax, int64 [1]."""

    key = "greedy"

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax().reshape(1)


GREEDY = ArgmaxPick()
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)                 # splitmix64's constants as signed int64
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64)


def _srl(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def hash_uniform(seed: int, counter: torch.Tensor, n: int) -> torch.Tensor:
    """float64 [n] uniform in (0, 1) from (seed, draw counter, index) by splitmix64: no generator state, so a CUDA
    graph replays it with a device counter (`GumbelPick`)."""
    salt = ((seed + 1) * _GOLDEN + (1 << 63)) % (1 << 64) - (1 << 63)     # the seed's offset, as a signed int64
    x = counter * n + torch.arange(n, device=counter.device) + salt + _GOLDEN
    x = (x ^ _srl(x, 30)) * _MIX1
    x = (x ^ _srl(x, 27)) * _MIX2
    x = x ^ _srl(x, 31)
    return (_srl(x, 11).double() + 0.5) / float(1 << 53)


class GumbelPick:
    """Sampling (temperature, top-p) as a step's last operation, graph-safe: the Gumbel-max draw argmax(z + g) over
    z = logits / T (outside the nucleus -inf) with g = -log(-log(u)), u from `hash_uniform` at a device counter the
    draw advances; a token with probability p is drawn with probability p (tested against `generate.sample`)."""

    def __init__(self, temperature: float, top_p: float, seed: int):
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.key = f"sample:{temperature}:{top_p}:{seed}"
        self.counter: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.counter is None or self.counter.device != logits.device:
            self.counter = torch.zeros(1, dtype=torch.int64, device=logits.device)
        z = logits.float() / self.temperature
        if self.top_p < 1:
            p, order = torch.softmax(z, -1).sort(descending=True)
            drop = (p.cumsum(0) - p) >= self.top_p              # the mass before this token already reaches top_p
            z = z.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
        u = hash_uniform(self.seed, self.counter, z.numel())
        self.counter.add_(1)
        return (z.double() - torch.log(-torch.log(u))).argmax().reshape(1)
