"""`kernels.draw.gumbel_argmax`: the sampled draw in one kernel, held to `engine.picks.GumbelPick`'s torch draw (the
same splitmix64 bits, the same Gumbel-max): interpreted on a CPU, compiled on a GPU."""
from __future__ import annotations

import pytest
import torch

from strata_plan.engine.picks import GumbelPick, hash_uniform
from strata_plan.kernels.draw import gumbel_argmax

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def reference(z: torch.Tensor, seed: int, counter: int) -> int:
    u = hash_uniform(seed, torch.tensor(counter, dtype=torch.int64), z.numel())
    return int((z.double() - torch.log(-torch.log(u))).argmax())


@pytest.mark.parametrize("V", [1, 37, 2048, 5000])
def test_the_kernel_draws_the_torch_draws(V):
    """Draw after draw (the device counter advancing), with a nucleus mask (-inf) on some logits: the same index
    as the torch Gumbel-max over `hash_uniform`."""
    g = torch.Generator().manual_seed(V)
    for seed in (0, 7):
        z = torch.randn(V, generator=g) * 3
        if V > 4:
            z[torch.randperm(V, generator=g)[: V // 3]] = float("-inf")
        salt = GumbelPick(1.0, 1.0, seed).salt
        counter = torch.zeros(1, dtype=torch.int64, device=DEV)
        out = torch.empty(1, dtype=torch.int64, device=DEV)
        for c in range(4):
            gumbel_argmax(z.to(DEV), salt, counter, out)
            assert int(out) == reference(z, seed, c), (V, seed, c)
            assert int(counter) == c + 1


def test_the_fused_pick_draws_the_torch_picks_tokens():
    """`GumbelPick(fused=True)` (the kernel after the nucleus) and the torch pick, from the same seed: the same
    tokens, draw after draw, with top-p below 1 and without."""
    g = torch.Generator().manual_seed(1)
    for top_p in (1.0, 0.9):
        plain, fused = GumbelPick(0.8, top_p, 3), GumbelPick(0.8, top_p, 3, fused=True)
        assert fused.key != plain.key
        for _ in range(5):
            logits = (torch.randn(3000, generator=g) * 2).to(DEV)
            assert int(fused(logits)) == int(plain(logits))


def test_wrong_shapes_are_refused():
    c = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="float32"):
        gumbel_argmax(torch.zeros(4, dtype=torch.float64), 0, c, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="int64"):
        gumbel_argmax(torch.zeros(4), 0, c, torch.zeros(1, dtype=torch.int32))
