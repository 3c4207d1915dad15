"""Disk: the test file (size, content, removal on every way out), O_DIRECT reads and the fallback."""
import errno
import os
import random
from pathlib import Path

import numpy as np
import pytest

from strata_plan.errors import UserError
from strata_plan.profiler import nvme
from strata_plan.profiler.timing import MiB

TINY = nvme.DiskSettings(rand_blocks=(MiB,), rand_qds=(1, 2), seq_blocks=(MiB,), seq_qds=(1,), seconds=0.03, repeats=2)


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(nvme.TEST_FILE_PREFIX)]


def test_check_dir_refuses_missing_file_and_read_only(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="does not exist"):
        nvme.check_dir(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="is not a folder"):
        nvme.check_dir(tmp_path / "f")

    def read_only(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(nvme.tempfile, "mkstemp", read_only)
    with pytest.raises(UserError, match="not writable") as e:
        nvme.check_dir(tmp_path)
    assert "\n" not in e.value.line() and "fix:" in e.value.line()


def test_check_dir_accepts_writable_and_leaves_nothing(tmp_path):
    assert nvme.check_dir(tmp_path) == tmp_path
    assert leftovers(tmp_path) == []


def test_clamp_size_to_free_space(tmp_path, monkeypatch):
    free = 1000 * MiB
    monkeypatch.setattr(nvme.psutil, "disk_usage", lambda p: type("U", (), {"free": free, "total": 4 * free})())
    size, warning = nvme.clamp_size(100 * MiB, tmp_path, 64 * MiB)
    assert size == 100 * MiB and warning == ""
    size, warning = nvme.clamp_size(10_000 * MiB, tmp_path, 64 * MiB)
    assert size <= 0.8 * free and size % nvme.WRITE_CHUNK == 0 and "clamped" in warning
    with pytest.raises(UserError, match="too little"):
        nvme.clamp_size(100 * MiB, tmp_path, 900 * MiB)


def test_test_file_is_full_size_incompressible_and_removed(tmp_path):
    size = 3 * MiB + 4096 * 5
    with nvme.TestFile(tmp_path, size) as tf:
        data = tf.path.read_bytes()
        assert len(data) == size and os.stat(tf.path).st_blocks * 512 >= size   # written, not sparse
        words = np.frombuffer(data[: 2 * MiB], dtype=np.uint64)
        assert len(np.unique(words)) > 0.99 * len(words)                         # no repeated or zero runs
    assert leftovers(tmp_path) == []


def test_test_file_removed_when_writing_is_interrupted(tmp_path):
    calls = []

    def write_then_interrupt(fd, buf):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return os.write(fd, buf)
    with pytest.raises(KeyboardInterrupt):
        with nvme.TestFile(tmp_path, 3 * nvme.WRITE_CHUNK, write=write_then_interrupt):
            pass
    assert leftovers(tmp_path) == []


def test_read_pass_reads_whole_blocks(tmp_path):
    with nvme.TestFile(tmp_path, 8 * MiB) as tf:
        fd, direct = nvme.open_reader(tf.path)
        offsets = []

        def read(fd_, bufs, off):
            offsets.append(off)
            return os.preadv(fd_, bufs, off)
        try:
            gbps = nvme.read_pass(fd, 8 * MiB, MiB, 2, 0.05, False, random.Random(1), read=read)
        finally:
            os.close(fd)
    assert gbps > 0
    assert all(o % MiB == 0 and o + MiB <= 8 * MiB for o in offsets)
    assert len(set(offsets[:8])) == min(8, len(offsets))            # a shuffled pass repeats no block


def test_measure_disk_interrupted_read_removes_file(tmp_path, monkeypatch):
    real = os.preadv
    count = [0]

    def preadv(fd, bufs, off):
        count[0] += 1
        if count[0] > 3:
            raise KeyboardInterrupt
        return real(fd, bufs, off)
    monkeypatch.setattr(nvme.os, "preadv", preadv)
    monkeypatch.setattr(nvme, "read_pass", lambda *a, **k: _real_read_pass(*a, **k, read=preadv))
    with pytest.raises(KeyboardInterrupt):
        nvme.measure_disk(tmp_path, 4 * MiB, TINY)
    assert leftovers(tmp_path) == []


_real_read_pass = nvme.read_pass


def test_measure_disk_small(tmp_path):
    r = nvme.measure_disk(tmp_path, 4 * MiB, TINY)
    assert set(r.rand) == {(MiB, 1), (MiB, 2)} and set(r.seq) == {(MiB, 1)}
    assert all(st.repeats == 2 and st.median > 0 for st in [*r.rand.values(), *r.seq.values()])
    assert r.file_bytes == 4 * MiB and r.info.capacity_bytes > 0
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("where", ["open", "read"])
def test_o_direct_refused_falls_back_to_fadvise(tmp_path, monkeypatch, where):
    real_open, real_preadv, real_fadvise = os.open, os.preadv, os.posix_fadvise
    direct_fds, drops = set(), []

    def fake_open(path, flags, *a):
        if flags & os.O_DIRECT and where == "open":
            raise OSError(errno.EINVAL, "Invalid argument")
        fd = real_open(path, flags & ~os.O_DIRECT if where == "read" else flags, *a)
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        else:
            direct_fds.discard(fd)             # a number reused after close
        return fd

    def fake_preadv(fd, bufs, off):
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, off)

    def fake_fadvise(fd, off, n, advice):
        drops.append(advice)
        return real_fadvise(fd, off, n, advice)
    monkeypatch.setattr(nvme.os, "open", fake_open)
    monkeypatch.setattr(nvme.os, "preadv", fake_preadv)
    monkeypatch.setattr(nvme.os, "posix_fadvise", fake_fadvise)
    monkeypatch.setattr(nvme, "read_pass", lambda *a, **k: _real_read_pass(*a, **k, read=fake_preadv))
    r = nvme.measure_disk(tmp_path, 4 * MiB, TINY)
    assert r.direct_io is False
    assert any("refused O_DIRECT" in n for n in r.notes)
    # one drop after writing, then one before every pass: 3 points x 2 repeats
    assert drops.count(os.POSIX_FADV_DONTNEED) >= 1 + 3 * 2
    assert leftovers(tmp_path) == []


def test_open_reader_flags_match_what_it_reports(tmp_path):
    import fcntl
    with nvme.TestFile(tmp_path, MiB) as tf:
        fd, direct = nvme.open_reader(tf.path)
        try:
            assert bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT) == direct
        finally:
            os.close(fd)
