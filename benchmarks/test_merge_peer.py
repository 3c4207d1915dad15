"""benchmarks/peers/merge_peer.py: the rows of several peer calls in one results file, or one line and exit 2."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))

import merge_peer  # noqa: E402


def peer_file(path: Path, metrics: dict, sha: str = "abc", gpu: str = "H100") -> Path:
    path.write_text(json.dumps({"benchmark": "peer-llama-cpp", "date": "2026-12-05T18:47:26+00:00", "git_sha": sha,
                                "machine": {"gpu": gpu}, "command": f"bench_peer {path.stem}", "notes": "n",
                                "metrics": metrics, "runs": {path.stem: {}}, "errors": []}))
    return path


SHARED = {"budget.vram_share_of_expert_bytes": 1 / 3, "text.tokens": 37513}


def test_the_calls_rows_land_in_one_file_naming_its_sources(tmp_path, monkeypatch):
    a = peer_file(tmp_path / "a.json", {**SHARED, "llama.q2_k.gpu.decode_tok_s": 1065.7})
    b = peer_file(tmp_path / "b.json", {**SHARED, "llama.iq1_s.gpu.decode_tok_s": 1054.7})
    monkeypatch.setattr(merge_peer, "RESULTS", tmp_path)
    assert merge_peer.main([str(a), str(b)]) == 0
    out = json.loads(next(tmp_path.glob("peer-llama-cpp-*.json")).read_text())
    assert out["metrics"] == {**SHARED, "llama.q2_k.gpu.decode_tok_s": 1065.7, "llama.iq1_s.gpu.decode_tok_s": 1054.7}
    assert [s["file"] for s in out["sources"]] == ["a.json", "b.json"] and set(out["runs"]) == {"a", "b"}
    assert out["git_sha"] == "abc" and out["machine"] == {"gpu": "H100"} and "a.json" in out["notes"]


@pytest.mark.parametrize("other, field", [
    ({"metrics": {**SHARED, "text.tokens": 1}}, "text.tokens"),
    ({"metrics": {**SHARED, "llama.q2_k.gpu.decode_tok_s": 1.0}}, "measured in two files"),
    ({"sha": "def"}, "git_sha"),
    ({"gpu": "H200"}, "machine.gpu"),
])
def test_files_that_do_not_belong_together_are_one_line_and_exit_2(tmp_path, capsys, other, field):
    a = peer_file(tmp_path / "a.json", {**SHARED, "llama.q2_k.gpu.decode_tok_s": 1065.7})
    b = peer_file(tmp_path / "b.json", other.get("metrics", SHARED), other.get("sha", "abc"), other.get("gpu", "H100"))
    assert merge_peer.main([str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and "b.json" in err[0]
