"""bench_prefetch_copy on the CPU: the interpreted copy kernel at two program counts (and a program a chunk) puts the
experts' bytes in their slots (the script checks them; its rates mean something only on a GPU)."""
from __future__ import annotations

import sys


def test_the_copy_bench_moves_the_bytes_at_every_program_count(monkeypatch, capsys):
    import bench_prefetch_copy
    monkeypatch.setattr(sys, "argv", ["bench_prefetch_copy.py", "--programs", "1,3,all"])
    assert bench_prefetch_copy.main() == 0
    out = capsys.readouterr().out
    assert "programs.p1" in out and "programs.p3" in out and "programs.pall" in out
