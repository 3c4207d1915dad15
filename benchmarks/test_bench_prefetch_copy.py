"""bench_prefetch_copy on the CPU: the interpreted copy kernel at two chunk sizes puts the experts' bytes in their slots
(the script checks them; its rates mean something only on a GPU)."""
from __future__ import annotations

import sys


def test_the_copy_bench_moves_the_bytes_at_every_chunk_size(monkeypatch, capsys):
    import bench_prefetch_copy
    monkeypatch.setattr(sys, "argv", ["bench_prefetch_copy.py", "--chunks-kb", "16,64"])
    assert bench_prefetch_copy.main() == 0
    out = capsys.readouterr().out
    assert "blocks.chunk_16kb" in out and "blocks.chunk_64kb" in out
