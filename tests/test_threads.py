"""torch's thread count for the commands that compute with it (strata_plan/threads.py): the usable cores from
the affinity and a cgroup quota, one left free on two cores or fewer, the user's OMP_NUM_THREADS kept, and the
CLI setting it once before those commands only."""
from __future__ import annotations

import pytest

from strata_plan import threads
from strata_plan.cli import TORCH_COMMANDS, main


@pytest.mark.parametrize("cores,want", [(1, 1), (2, 1), (3, 3), (4, 4), (64, 64)])
def test_one_core_is_left_free_on_two_cores_or_fewer(cores, want):
    assert threads.torch_threads(cores) == want


def test_usable_cores_is_the_affinity_capped_by_the_cgroup_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    assert threads.usable_cores(tmp_path) == 8                         # no cgroup files: the affinity
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.usable_cores(tmp_path) == 8                         # no quota
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads.usable_cores(tmp_path) == 2                         # 1.5 cores: rounded up
    (tmp_path / "cpu.max").write_text("5000000 100000\n")
    assert threads.usable_cores(tmp_path) == 8                         # a quota above the affinity
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()                                         # cgroup v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.usable_cores(tmp_path) == 3
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.usable_cores(tmp_path) == 8
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {3})
    assert threads.usable_cores(tmp_path) == 1


@pytest.fixture
def torch_threads_kept():
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    yield torch
    torch.set_num_threads(n)


def test_limit_sets_torch_lowers_only_and_leaves_the_users_choice(torch_threads_kept, monkeypatch):
    torch = torch_threads_kept
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    torch.set_num_threads(2)
    assert threads.limit_torch_threads({}) == 1 and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert threads.limit_torch_threads({"OMP_NUM_THREADS": "2"}) is None and torch.get_num_threads() == 2
    assert threads.limit_torch_threads({"MKL_NUM_THREADS": "2"}) is None and torch.get_num_threads() == 2
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    torch.set_num_threads(1)                               # set lower before (a caller's choice): kept
    assert threads.limit_torch_threads({}) == 1 and torch.get_num_threads() == 1


def test_the_cli_sets_it_once_for_the_commands_that_compute_with_torch(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(threads, "limit_torch_threads", lambda: calls.append(1))
    assert set(TORCH_COMMANDS) == {"pack", "run", "bench", "eval", "profile"}
    assert main(["pack", "--synthetic", "nope", "--format", "bf16", "--out", str(tmp_path / "o")]) == 2
    assert calls == [1]
    assert main(["models"]) == 0 and main(["formats"]) == 0
    assert calls == [1]
    capsys.readouterr()
