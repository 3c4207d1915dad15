"""The one-launch RMSNorm (kernels/norm.py: interpreted on a CPU, compiled on a GPU) against
`engine.layers.rms_norm_reference`, the plain torch expression the CPU engine runs: the same values (bit for bit under
the interpreter) but where the GPU's sum of squares in another order or its approximate rsqrt rounds an element the
other way (a unit or two in the last place of the model dtype, in a few % of the elements), on strided rows and 3-D
tensors."""
from __future__ import annotations

import pytest
import torch

from strata_plan.engine.layers import rms_norm_reference as reference
from strata_plan.kernels.norm import rms_norm

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("shape,dtype,wdtype", [((1, 7168), torch.bfloat16, torch.bfloat16),
                                                ((5, 96), torch.bfloat16, torch.bfloat16),
                                                ((3, 4, 128), torch.bfloat16, torch.bfloat16),
                                                ((2, 96), torch.float32, torch.float32),
                                                ((2, 96), torch.bfloat16, torch.float32)])
def test_the_kernel_is_the_reference_to_its_rounding(shape, dtype, wdtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(*shape, generator=g) * 4).to(dtype).to(DEV)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(wdtype).to(DEV)
    want, got = reference(x, w, 1e-6), rms_norm(x, w, 1e-6)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 2 ** -6 if dtype == torch.bfloat16 else 2 ** -20      # two bf16 roundings (y, then weight * y) apart at most
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    if dtype == torch.bfloat16:                                   # float32 shows every last-place difference
        assert (got != want).float().mean() < 0.05               # most elements bit for bit


def test_a_strided_slice_is_normalised_in_place_of_a_copy():
    g = torch.Generator().manual_seed(4)
    wide = torch.randn(3, 160, generator=g).to(torch.bfloat16).to(DEV)
    w = torch.ones(128, dtype=torch.bfloat16, device=DEV)
    x = wide[:, :128]                                             # MLA's latent: the first r of each row
    torch.testing.assert_close(rms_norm(x, w, 1e-6), reference(x, w, 1e-6), rtol=2 ** -6, atol=2 ** -6)
