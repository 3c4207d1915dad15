"""The profiler's zero-copy curve: its sizes, its probe (run here in Triton's interpreter on an unregistered
region), the profile field it becomes (provenance, YAML round trip, absent from the shipped profiles) and the
describe row. The timed path needs a GPU: tests/test_profiler_gpu.py."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from strata_plan.profiler import gpu as gpu_mod
from strata_plan.profiler import run
from strata_plan.profiler.timing import GB, MiB, Stats
from strata_plan.profiles.schema import load_profile, save_profile, shipped_profiles
from strata_plan.schema import to_data

SMALL = gpu_mod.GpuSettings(sizes=(64 << 10, MiB), during_sizes=(MiB,), repeats=2, target_bytes=4 * MiB,
                            max_iters=5, hbm_bytes=MiB, matmul_n=64, gemv_shape=(64, 64))


@pytest.mark.parametrize("preset", [run.QUICK, run.FULL], ids=["quick", "full"])
def test_sizes_hold_the_transfer_sizes_and_layer_sized_reads(preset):
    sizes = gpu_mod.zero_copy_sizes(dataclasses.replace(SMALL, sizes=preset.gpu_sizes))
    assert sizes == tuple(sorted(set(sizes)))
    assert set(preset.gpu_sizes) <= set(sizes) and {64 * MiB, 128 * MiB, 256 * MiB} <= set(sizes)


def test_phase_plan_counts_the_zero_copy_samples():
    copies = dict((name, ticks) for name, _, ticks in gpu_mod.phase_plan(SMALL, 0))[gpu_mod.PHASES[1]]
    assert copies == (4 * len(SMALL.sizes) + len(gpu_mod.zero_copy_sizes(SMALL))) * SMALL.repeats


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the probe reads registered memory (test_profiler_gpu)")
def test_probe_reads_its_region_and_checks_the_bytes(monkeypatch):
    """On the CPU (interpreted kernel): distinct non-zero words, the checksum check passes (and fails when the
    kernel reads other bytes), and a timed sample reads `_iters` slots that cycle inside the region."""
    probe = gpu_mod.ZeroCopyProbe(4 * MiB, "cpu")
    try:
        words = probe.region.tensor.view(torch.int32)
        assert words[0] == 1 and words[-1] == words.numel() and bool((words[1:] - words[:-1] == 1).all())
        del words
        probe.check(4 * MiB)
        reads = []
        real = probe.read
        monkeypatch.setattr(probe, "read", lambda off, size: reads.append((off, size)) or real(off, size))
        monkeypatch.setattr(gpu_mod, "_event_seconds", lambda go, ops: go() or 0.5)
        size = MiB
        assert probe.gbps(size, SMALL) == pytest.approx(size * 4 / 0.5 / GB)       # 4 MiB target: 4 reads
        assert reads == [(0, size), (size, size), (2 * size, size), (3 * size, size)]
        probe.base += 16                                 # the kernel reads the wrong bytes: the check says so
        with pytest.raises(RuntimeError, match="zero-copy check failed"):
            probe.check(2 * MiB)
    finally:
        probe.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_probe_skips_with_a_note_where_it_cannot_run():
    notes: list[str] = []
    assert gpu_mod.zero_copy_probe(SMALL, notes) is None
    assert len(notes) == 1 and notes[0].startswith("zero-copy reads skipped: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the probe reads registered memory (test_profiler_gpu)")
def test_the_probe_notes_its_regions_share_on_huge_pages(monkeypatch):
    """The GPU's reads of 4 KiB pages take more address translations than of huge pages: the profile says which it
    measured (the share `HostRegion.huge_share` reads from the process's smaps)."""
    real = gpu_mod.ZeroCopyProbe
    monkeypatch.setattr(gpu_mod, "ZeroCopyProbe", lambda nbytes: real(nbytes, "cpu"))
    notes: list[str] = []
    probe = gpu_mod.zero_copy_probe(SMALL, notes)
    try:
        share = probe.region.huge_share()
        assert len(notes) == 1 and notes[0].startswith(f"zero-copy reads: {share:.0%} of the probe's")
        assert "huge pages" in notes[0]
    finally:
        probe.close()


def fake_result(zero_copy: bool) -> gpu_mod.GpuResult:
    st = lambda v: Stats((v, 0.98 * v, 1.01 * v))  # noqa: E731
    copies = {z: st(20.0 if z < MiB else 25.0) for z in (256 << 10, MiB, 16 * MiB)}
    curves = {k: dict(copies) for k in ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable", "h2d_during_kernel")}
    if zero_copy:
        curves["zero_copy"] = {z: st(22.0) for z in (256 << 10, 16 * MiB, 64 * MiB, 256 * MiB)}
    ident = gpu_mod.Identity("NVIDIA Fake", 24 * 10**9, 23 * 10**9, "999.0", 4, 16, 1, 4, 16, "mock")
    return gpu_mod.GpuResult(ident, st(1000.0), st(1800.0), st(150.0), curves, None, {})


def test_profile_entry_round_trips_through_yaml(tmp_path):
    entry = run._gpu_entry(fake_result(True), run.QUICK)
    zc = entry.zero_copy
    assert zc.provenance == "measured" and zc.date and "stream_read" in zc.source and "zero-copy" in zc.source
    assert zc.points == ((256 << 10, 22.0), (16 * MiB, 22.0), (64 * MiB, 22.0), (256 * MiB, 22.0))
    prof = load_profile("rtx-4090").with_gpu(entry, "fake")
    out = save_profile(prof, tmp_path / "fake.yaml")
    assert "zero_copy" in yaml.safe_load(out.read_text())["gpus"][0]
    assert load_profile(str(out)) == prof
    stats = run.collect_stats(Stats((1.0,)), type("D", (), {"rand": {}, "seq": {}})(), fake_result(True))
    assert stats["zero_copy_64MiB_gbps"].median == 22.0


def test_the_graph_launch_floor_goes_into_the_entry_and_an_absent_one_is_the_estimate():
    import dataclasses
    entry = run._gpu_entry(dataclasses.replace(fake_result(False), graph_launch=Stats((2.0, 2.1, 1.9))), run.QUICK)
    assert entry.graph_launch_us.value == 2.0 and entry.graph_launch_us.provenance == "measured"
    assert entry.launch_us().value == 2.0 and "CUDA graph" in entry.graph_launch_us.source
    plain = run._gpu_entry(fake_result(False), run.QUICK)
    assert plain.graph_launch_us is None and plain.launch_us().provenance == "estimate"
    assert all("graph_launch_us" not in g for name in shipped_profiles() for g in to_data(load_profile(name))["gpus"])


@pytest.mark.parametrize("field, figure, source", [("lookahead_layer", "lookahead_layer_us", "resolve_step (slots"),
                                                    ("cache_layer", "cache_layer_us", "lru_step and fill_slots"),
                                                    ("stage_layer", "stage_layer_us", "stage_wait and stage_done")])
def test_the_main_stream_kernel_probes_go_into_the_entry_and_an_absent_one_is_the_estimate(tmp_path, field, figure,
                                                                                           source):
    entry = run._gpu_entry(dataclasses.replace(fake_result(False), **{field: Stats((7.0, 7.5, 6.5))}), run.QUICK)
    assert getattr(entry, figure).value == 7.0 and getattr(entry, figure).provenance == "measured"
    assert getattr(entry, field)().value == 7.0 and source in getattr(entry, figure).source
    prof = load_profile("rtx-4090").with_gpu(entry, "fake")
    assert load_profile(str(save_profile(prof, tmp_path / "fake.yaml"))) == prof
    plain = run._gpu_entry(fake_result(False), run.QUICK)
    assert getattr(plain, figure) is None and getattr(plain, field)().provenance == "estimate"


def test_profiles_without_it_load_and_save_as_before(tmp_path):
    assert run._gpu_entry(fake_result(False), run.QUICK).zero_copy is None
    for name in shipped_profiles():
        p = load_profile(name)
        assert all(g.zero_copy is None for g in p.gpus)
        assert all("zero_copy" not in g for g in to_data(p)["gpus"])


def test_describe_shows_zero_copy_only_when_measured():
    from strata_plan.tui.describe import profile_rows
    plain = load_profile("h200")
    assert not any(label == "zero-copy" for label, _ in profile_rows(plain))
    prof = plain.with_gpu(run._gpu_entry(fake_result(True), run.QUICK), "fake")
    rows = dict(profile_rows(prof))
    assert rows["zero-copy"] == "22.0 GB/s at 128 MiB (measured)"
