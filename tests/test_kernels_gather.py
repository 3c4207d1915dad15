"""`kernels.gather.gather_rows`: a table's rows read at an arena offset (in the interpreter on CPU; on a GPU also
from registered pinned RAM, as the device loop reads a RAM-held embedding table)."""
from __future__ import annotations

import pytest
import torch

from strata_plan.kernels.gather import gather_rows


@pytest.mark.parametrize("H", [64, 1500])
def test_rows_at_an_offset_are_the_tables_rows(H):
    g = torch.Generator().manual_seed(H)
    V = 37
    table = torch.randn(V, H, generator=g).to(torch.bfloat16)
    lead = 4096                                         # the table starts inside the arena, past other bytes
    arena = torch.randint(0, 256, (lead + V * H * 2,), dtype=torch.uint8, generator=g)
    arena[lead:] = table.view(-1).view(torch.uint8)
    ids = torch.tensor([5, 0, 36, 5], dtype=torch.int64)
    out = torch.full((4, H), float("nan"), dtype=torch.bfloat16)
    dev = "cuda" if torch.cuda.is_available() else "cpu"    # the kernel: compiled on a GPU, interpreted on a CPU
    got = out.to(dev)
    gather_rows(arena.to(dev), lead, ids.to(dev), got)
    assert torch.equal(got.cpu(), table[ids])


def test_wrong_shapes_are_refused():
    arena = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(ValueError, match="2-byte"):
        gather_rows(arena, 0, torch.zeros(1, dtype=torch.int64), torch.zeros(1, 4, dtype=torch.float32))
    with pytest.raises(ValueError, match="int64"):
        gather_rows(arena, 0, torch.zeros(2, dtype=torch.int32), torch.zeros(2, 4, dtype=torch.bfloat16))


@pytest.mark.gpu
def test_rows_from_registered_pinned_ram():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from strata_plan.pinned import HostRegion
    V, H = 1000, 7168
    table = torch.randn(V, H).to(torch.bfloat16)
    with HostRegion(V * H * 2, "cuda") as r:
        r.tensor.copy_(table.view(-1).view(torch.uint8))
        arena = torch.empty(256, dtype=torch.uint8, device="cuda")
        ids = torch.tensor([999, 3, 3], device="cuda")
        out = torch.empty(3, H, dtype=torch.bfloat16, device="cuda")
        gather_rows(arena, r.device_ptr - arena.data_ptr(), ids, out)
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), table[ids.cpu()])
