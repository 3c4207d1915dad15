"""GPU paths at small sizes (skipped without a CUDA GPU)."""
import pytest
import torch

from strata_plan.profiler import run
from strata_plan.profiler.timing import MiB

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]


def test_measure_gpu_small():
    from strata_plan.profiler import gpu
    s = gpu.GpuSettings(sizes=(256 << 10, 4 * MiB, 64 * MiB), during_sizes=(4 * MiB,), repeats=2,
                        target_bytes=64 * MiB, max_iters=16, hbm_bytes=256 * MiB, matmul_n=2048, gemv_shape=(1024, 1024))
    phases = []
    r = gpu.measure_gpu(s, pin_cap_bytes=2 * 1024 * MiB, step=lambda name: phases.append(name) or (lambda: None))
    assert phases == list(gpu.PHASES)
    assert 1 <= r.identity.pcie_gen <= 7 and r.identity.pcie_width in (1, 2, 4, 8, 16, 32)
    assert r.identity.total_bytes > r.identity.free_bytes > 0
    assert set(r.curves) == {"h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable", "h2d_during_kernel",
                             "zero_copy"}, r.notes
    for curve in r.curves.values():
        assert all(st.repeats == 2 and 0 < st.median < 1000 for st in curve.values())   # GB/s: below any link
    assert tuple(r.curves["zero_copy"]) == gpu.zero_copy_sizes(s) and 256 * MiB in r.curves["zero_copy"]
    assert not any("zero-copy reads skipped" in n for n in r.notes), r.notes     # (the huge-page share is noted)
    assert r.device_copy.median > r.curves["h2d_pinned"][64 * MiB].median
    assert r.hbm_read.median > 100 and r.bf16_tflops.median > 1
    assert r.pin is not None and r.pin.pinned_bytes == 2 * 1024 * MiB and r.pin.hit_cap
    assert r.graph_launch is not None and 0.3 < r.graph_launch.median < 50     # us: a launch floor, not a copy
    assert r.lookahead_layer is not None, r.notes                              # us a MoE layer: two kernels and a fork
    assert r.graph_launch.median < r.lookahead_layer.median < 200
    assert r.cache_layer is not None, r.notes                                  # us a MoE layer: two launches
    assert r.graph_launch.median < r.cache_layer.median < 200
    assert r.stage_layer is not None, r.notes                                  # us a MoE layer: two launches, PCIe
    assert r.graph_launch.median < r.stage_layer.median < 200


def test_full_profile_entry_loads():
    """A GPU entry built from real measurements passes the schema's checks."""
    from strata_plan.profiler import gpu
    s = gpu.GpuSettings((MiB, 16 * MiB), (16 * MiB,), 2, 32 * MiB, 8, 256 * MiB, 1024, (1024, 1024))
    r = gpu.measure_gpu(s, 0, lambda name: (lambda: None))
    entry = run._gpu_entry(r, run.QUICK)
    assert entry.h2d_pinned.provenance == "measured" and entry.h2d_pinned.at(16 * MiB) > 0
    assert entry.zero_copy.provenance == "measured" and entry.zero_copy.at(128 * MiB) > 0
    assert 0 < run._calibration(r, run.default_calibration()).copy_overlap.value <= 1
