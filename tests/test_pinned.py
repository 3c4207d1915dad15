"""`strata_plan.pinned.HostRegion`: page-locked memory of the size asked, readable by kernels in place."""
from __future__ import annotations

import pytest
import torch

from strata_plan.kernels.formats import EXPERT_ALIGN
from strata_plan.pinned import HUGE, HostRegion


@pytest.mark.parametrize("nbytes", [1, HUGE, HUGE + 1, 5 * HUGE - 4096])
def test_a_region_holds_what_was_asked_in_whole_2mib_pages(nbytes):
    with HostRegion(nbytes) as r:
        assert r.tensor.numel() == nbytes and r.mapped % HUGE == 0 and 0 <= r.mapped - max(nbytes, 1) < HUGE
        assert r.host_ptr % EXPERT_ALIGN == 0 and not r.registered and r.device_ptr == 0
        data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
        r.tensor.copy_(data)
        assert torch.equal(r.tensor, data)


def test_the_huge_page_share_counts_the_regions_own_mappings():
    """Untouched, nothing is backed; touched, the share is what smaps says of those pages (THP may be off here)."""
    with HostRegion(4 * HUGE) as r:
        assert r.huge_share() in (0.0, None)
        r.tensor.fill_(1)
        share = r.huge_share()
        assert share is None or 0.0 <= share <= 1.0


def test_close_is_idempotent_and_survives_a_live_view():
    r = HostRegion(3 * HUGE)
    view = r.tensor[:10]
    view.fill_(7)
    r.close()
    r.close()
    assert int(view.sum()) == 70          # the mapping lives as long as a view of it


@pytest.mark.gpu
def test_a_registered_region_is_pinned_and_read_in_place_by_a_kernel():
    """Registered: torch sees it as pinned memory, and fused_moe reads an expert blob there at the offset
    device_ptr - arena.data_ptr() bit-identically to the same blob in VRAM."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from strata_plan.kernels.formats import expert_layout
    from strata_plan.kernels.ops import fused_moe
    from strata_plan.kernels.quantizer import pack_expert
    H, I, E = 512, 256, 2
    g = torch.Generator().manual_seed(3)
    blobs = [pack_expert(torch.randn(I, H, generator=g) / 20, torch.randn(I, H, generator=g) / 20,
                         torch.randn(H, I, generator=g) / 20, "q2_g16_s8m4") for _ in range(E)]
    nb = expert_layout("q2_g16_s8m4", H, I).nbytes
    size = -(-nb // EXPERT_ALIGN) * EXPERT_ALIGN
    with HostRegion(E * size, "cuda") as r:
        assert r.registered and r.tensor.is_pinned() and r.register_s >= 0
        arena = torch.empty(E * size, dtype=torch.uint8, device="cuda")
        for e, b in enumerate(blobs):
            r.tensor[e * size:e * size + nb].copy_(b)
            arena[e * size:e * size + nb].copy_(b)
        x = torch.randn(1, H, generator=g).to("cuda", torch.bfloat16)
        ids = torch.tensor([[0, 1]], device="cuda")
        w = torch.tensor([[0.6, 0.4]], device="cuda")
        in_vram = torch.arange(E, device="cuda", dtype=torch.int64) * size
        in_ram = in_vram + (r.device_ptr - arena.data_ptr())
        a = fused_moe(x, ids, w, arena, in_vram, "q2_g16_s8m4", H, I)
        b = fused_moe(x, ids, w, arena, in_ram, "q2_g16_s8m4", H, I)
        torch.cuda.synchronize()
        assert torch.equal(a, b) and a.abs().sum() > 0
        del arena, a, b
