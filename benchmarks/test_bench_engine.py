"""bench_engine end to end on the CPU: the committed fixture packed in BF16, a RAM-rich plan and an NVMe plan given
by path, every mode, the forced-depth run (mode `plan`), the drive's bound rows. Figures on a CPU mean nothing; the
test holds the script's rows (what the H200 run will write) to exist and add up."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from strata_plan.engine import aio
from test_bench_trained import one_torch_thread  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("io", ["threads", pytest.param("aio", marks=pytest.mark.skipif(not aio.available(),
                                                                                       reason="no Linux native AIO"))])
def test_the_engine_bench_writes_every_row_on_the_fixture(tmp_path, one_torch_thread, monkeypatch, io):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_engine_run import FIXTURE, bf16_plan
    from strata_plan.cli import main as cli
    from strata_plan.core.plan import load_plan, save_plan
    import bench_engine
    packed = tmp_path / "packed"
    assert cli(["pack", str(FIXTURE), "--out", str(packed), "--format", "bf16", "--json"]) == 0
    plans = {"ramrich": bf16_plan(4, 28, 2, 1, chunk=4), "seed": bf16_plan(4, 10, 0, 0, chunk=4)}
    paths = []
    for name, plan in plans.items():
        save_plan(dataclasses.replace(plan, context=96), tmp_path / f"{name}.yaml")
        paths.append(f"{name}={tmp_path / f'{name}.yaml'}")
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["bench_engine.py", "--dir", str(packed), "--plans", ",".join(paths),
                                      "--tokens", "3", "--warmup", "2", "--out-dir", str(out), "--keep",
                                      "--copy-programs", "0,2", "--whole-landing", "--stager-io", io,
                                      "--forced-points", "output,attention", "--deepest"])
    assert bench_engine.main() == 0
    (result,) = out.glob("engine-*.json")
    m = json.loads(result.read_text())["metrics"]
    modes = {"ramrich": ("plan", "lru", "on-demand"), "seed": ("plan", "lru", "on-demand"),
             "seed_forced_d2": ("plan",), "seed_forced_d2_p2": ("plan",),   # a forced depth: mode `plan` only
             "ramrich_whole": ("plan",), "seed_forced_d2_whole": ("plan",),  # lookahead rows without partial landing
             "seed_forced_d2_router": ("plan",),                  # the guesses taken at each layer's router
             "seed_forced_d2_deepest": ("plan",), "seed_forced_d2_router_deepest": ("plan",)}   # depth 2's alone
    for name, ms in modes.items():
        for mode in ms:
            assert m[f"{name}.{mode}.decode_tok_s"] > 0, (name, mode)
            assert m[f"{name}.{mode}.tokens_equal_resident"] == 1.0, (name, mode)   # the all-in-VRAM run's tokens
            assert m[f"{name}.{mode}.tokens_equal_resident_first"] == 3, (name, mode)
            assert m[f"{name}.{mode}.steps_equal_resident_first"] > 3, (name, mode)     # warm-up steps too
    for name in ("ramrich", "seed"):                                   # the reference run repeats its tokens
        assert m[f"{name}.resident_again.tokens_equal_resident"] == 1.0
    assert m["seed_forced_d2.plan_over_lru"] == m["seed_forced_d2.plan.decode_tok_s"] / m["seed.lru.decode_tok_s"]
    assert "ramrich_forced_d1.plan.decode_tok_s" not in m             # the RAM-rich plan has lookahead already
    assert m["ramrich_whole.plan_over_lru"] == m["ramrich_whole.plan.decode_tok_s"] / m["ramrich.lru.decode_tok_s"]
    assert "seed_forced_d2_p2_whole.plan.decode_tok_s" not in m       # one whole-landing row a lookahead row
    assert "seed_forced_d2_deepest_whole.plan.decode_tok_s" not in m   # (not for the deepest-only rows)
    for name in ("seed", "seed_forced_d2", "seed_forced_d2_p2", "seed_forced_d2_whole"):   # the drive's bound, the stager
        assert m[f"{name}.plain_odirect_repeats"] == len(modes[name]) and m[f"{name}.plain_odirect_gbps"] > 0
        for mode in modes[name]:
            k = f"{name}.{mode}"
            assert m[f"{k}.nvme_gb_per_token"] > 0 and m[f"{k}.bound_tok_s"] > 0
            assert m[f"{k}.page_cache_after"] is not None
    assert m["seed_forced_d2.plan.nvme_wasted_gb_per_token"] >= 0
    assert "seed_forced_d2.plan.lookahead_d2.precision" in m
    assert (out / "plan-kimi5-h200-seed_forced_d2.yaml").exists()
    points = {n: load_plan(out / f"plan-kimi5-h200-{n}.yaml").staging.point for n in ("seed_forced_d2", "seed_forced_d2_router")}
    assert points == {"seed_forced_d2": "output", "seed_forced_d2_router": "attention"}
    runs = json.loads(result.read_text())["runs"]                     # and the engine took its guesses there
    assert [runs[f"{n}/plan"]["lookahead_point"] for n in points] == ["output", "attention"]
    assert [runs[f"seed_forced_d2{x}/plan"]["stage_depths"] for x in ("", "_deepest", "_router_deepest")] == [
        "all", "deepest", "deepest"]
    assert m["stager_io"] == io


def test_a_run_that_fails_is_recorded_and_the_others_are_written(tmp_path, one_torch_thread, monkeypatch):
    """On the GPU machine a run may raise where the CPU never went: the error is one line in the result's `errors`,
    the runs before and after it are in the file, the script exits 1."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_engine_run import FIXTURE, bf16_plan
    from strata_plan.cli import main as cli
    from strata_plan.core.plan import save_plan
    import bench_engine
    packed = tmp_path / "packed"
    assert cli(["pack", str(FIXTURE), "--out", str(packed), "--format", "bf16", "--json"]) == 0
    save_plan(dataclasses.replace(bf16_plan(4, 28, 2, 0, chunk=4), context=96), tmp_path / "p.yaml")
    real = bench_engine.measure

    def measure(*args, **kw):
        if kw["mode"] == "lru":
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
        return real(*args, **kw)
    monkeypatch.setattr(bench_engine, "measure", measure)
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["bench_engine.py", "--dir", str(packed), "--plans", f"r={tmp_path / 'p.yaml'}",
                                      "--modes", "lru,on-demand", "--tokens", "2", "--warmup", "1", "--out-dir",
                                      str(out), "--keep"])
    assert bench_engine.main() == 1
    (result,) = out.glob("engine-*.json")
    data = json.loads(result.read_text())
    assert data["errors"] == ["r/lru: RuntimeError: CUDA error: an illegal memory access was encountered"]
    m = data["metrics"]
    assert m["r.on-demand.decode_tok_s"] > 0 and m["r.resident.decode_tok_s"] > 0
    assert "r.lru.decode_tok_s" not in m and not list(out.glob(".*.tmp"))


def test_the_drive_as_this_run_measured_it_reads_that_rate_at_the_stagers_requests():
    """`drive_as_measured`: the profile's drive scaled, every point alike, so that it reads the run's plain O_DIRECT
    rate at the stager's request size and requests in flight; nothing else in the profile changes."""
    import pytest
    sys.path.insert(0, str(ROOT / "tests"))
    from test_engine_run import bf16_plan
    from strata_plan.profiles.schema import load_profile
    import bench_engine
    plan = bf16_plan(4, 10, 0, 0, chunk=4)
    block, readers = bench_engine.stager_request(plan)
    assert block % 4096 == 0 and readers >= 4
    base = load_profile("h200")
    got = bench_engine.drive_as_measured("h200", plan, 1.25)
    assert got.nvme[0].rand_read.at(block, readers) == pytest.approx(1.25)
    factor = 1.25 / base.nvme[0].rand_read.at(block, readers)
    assert got.nvme[0].rand_read.at(1 << 20, 1) == pytest.approx(factor * base.nvme[0].rand_read.at(1 << 20, 1))
    assert got.gpus == base.gpus and got.calibration == base.calibration


def test_a_pack_cut_short_is_not_taken_for_a_pack(tmp_path):
    """bench_engine packs again where a folder's index lists a file that is gone (a warm machine's earlier call was
    stopped while it removed its pack): a run would fail on it in every mode."""
    import shutil
    sys.path.insert(0, str(ROOT / "tests"))
    from test_engine_run import FIXTURE
    from strata_plan.cli import main as cli
    from bench_engine import complete_pack, first_difference
    packed = tmp_path / "packed"
    assert not complete_pack(packed)
    assert cli(["pack", str(FIXTURE), "--out", str(packed), "--format", "bf16", "--json"]) == 0
    assert complete_pack(packed)
    cut = tmp_path / "cut"
    shutil.copytree(packed, cut)
    next(cut.glob("experts-*.bin")).unlink()
    assert not complete_pack(cut)
    assert first_difference([1, 2, 3], [1, 2, 3]) == 3 and first_difference([1, 5, 3], [1, 2, 3]) == 1
