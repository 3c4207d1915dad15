"""bench_device_loop's plans: the device loop's case (static share in VRAM, LRU slots, the rest in pinned RAM)."""
from __future__ import annotations

from bench_device_loop import device_plan

from strata_plan.core.modes import baseline


def test_plans_put_the_static_share_in_vram_the_rest_in_ram_with_slots(tmp_path):
    plan = device_plan("qwen3-30b-a3b", 2, tmp_path, static=0.1, cache=8, profile="h200")
    assert len(plan.layers) == 2 and plan.prefetch_depth == 0 and plan.cache.total_slots == 16
    for l in plan.layers:
        assert len(l.vram) == round(0.1 * plan.n_experts) and not l.nvme and l.cache_slots == 8
        assert sorted(l.vram + l.ram) == list(range(plan.n_experts))
    assert baseline(plan, "lru").cache.total_slots == 16 and baseline(plan, "on-demand").cache.total_slots == 0
