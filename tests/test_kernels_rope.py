"""The one-launch rotary embedding of a decode step (kernels/rope.py: interpreted on a CPU, compiled on a GPU) against
`engine.rope.RotaryTable.apply`'s torch expression: bit for bit, both pair layouts, strided heads (MLA's rope slice of
each query head, the key's slice of the latent row), bf16 and float32 (on a GPU float32 within 1e-6: a product may
become an FMA)."""
from __future__ import annotations

import pytest
import torch

from strata_plan.engine.config import RopeConfig
from strata_plan.engine.rope import RotaryTable

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _table(dim: int, interleave: bool, dtype) -> RotaryTable:
    return RotaryTable(RopeConfig(kind="default", dim=dim, theta=10000.0, interleave=interleave), 64, DEV, dtype)


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_kernel_is_the_torch_rotation_bit_for_bit(interleave, dtype):
    g = torch.Generator().manual_seed(5)
    wide = (torch.randn(2, 5, 48, generator=g) * 3).to(dtype).to(DEV)
    x = wide[..., 32:]                                          # [T, H, 16]: the rope part of each head, strided
    at = torch.tensor([7, 40], dtype=torch.long, device=DEV)
    table = _table(16, interleave, dtype)
    want = table.apply(x, 0, at)
    table.fused = True
    got = table.apply(x, 0, at)
    assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
    if DEV.type == "cuda" and dtype == torch.float32:           # the compiler may fuse a product into an FMA
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(got, want)


def test_a_single_key_head_of_a_latent_row():
    g = torch.Generator().manual_seed(6)
    ckv = torch.randn(1, 64 + 16, generator=g).to(torch.bfloat16).to(DEV)
    at = torch.tensor([63], dtype=torch.long, device=DEV)
    table = _table(16, True, torch.bfloat16)
    want = table.apply(ckv[:, None, 64:], 0, at)
    table.fused = True
    assert torch.equal(table.apply(ckv[:, None, 64:], 0, at), want)
