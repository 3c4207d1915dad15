"""`strata-plan stats`: table and statistics file from a trace or a prior; user mistakes exit 2 in one line."""
from __future__ import annotations

import json
from pathlib import Path

from strata_plan.cli import main
from strata_plan.core.routing import load_stats, load_trace

SLICE = str(Path(__file__).parent / "data" / "routing_mixtral_slice.jsonl")


def test_jsonl_trace_to_table_statistics_and_npz(tmp_path, cli):
    out, npz = tmp_path / "s.yaml", tmp_path / "t.npz"
    r = cli("stats", SLICE, "--model", "mixtral-8x7b", "--out", str(out), "--save-trace", str(npz))
    assert r.returncode == 0, r.stderr
    assert "routing statistics of mixtral-8x7b" in r.stdout and "reuse" in r.stdout and "mean" in r.stdout
    st = load_stats(out)
    assert (st.kind, st.n_layers, st.n_experts, st.top_k, st.tokens) == ("trace", 32, 8, 2, 17)
    tr = load_trace(npz)
    assert tr.n_tokens == 17 and st.source_sha256 == tr.sha256
    r = cli("stats", str(npz), "--model", "mixtral-8x7b", "--out", str(tmp_path / "again.yaml"), "--json")
    data = json.loads(r.stdout)
    assert len(data["rows"]) == 33 and data["rows"][-1]["layers"] == "mean" and data["lookahead"][0]["provenance"] == "prior"
    assert load_stats(tmp_path / "again.yaml").layers == st.layers


def test_prior_for_a_model_prints_and_writes_only_when_asked(tmp_path, cli):
    r = cli("stats", "olmoe-like", "--model", "qwen3-30b-a3b", "--json", "--tokens", "512", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["kind"] == "prior" and len(data["rows"]) == 1 and data["rows"][0]["layers"] == "0-47"
    assert data["out"] == "" and list(tmp_path.iterdir()) == []          # without --out nothing is written
    out = tmp_path / "olmoe.yaml"
    r = cli("stats", "olmoe-like", "--model", "qwen3-30b-a3b", "--tokens", "512", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0 and f"wrote {out}" in r.stdout.replace("\n", "")
    st = load_stats(out)
    assert st.n_layers == 48 and st.n_experts == 128 and st.layers[0] == st.layers[47]
    r = cli("stats", str(out), "--model", "qwen3-30b-a3b", cwd=tmp_path)
    assert r.returncode == 0 and "0-47" in r.stdout and "not written" in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["olmoe.yaml"]


def test_user_mistakes_exit_2_with_one_line(tmp_path, cli, capsys, monkeypatch):
    stats = tmp_path / "s.yaml"
    assert cli("stats", "uniform", "--model", "mixtral-8x7b", "--out", str(stats)).returncode == 0
    cases = [
        (["stats", "zipfy", "--model", "mixtral-8x7b"], "neither a trace"),
        (["stats", "uniform", "olmoe-like", "--model", "mixtral-8x7b"], "several sources"),
        (["stats", SLICE, "--model", "mixtral-8x7b", "--tokens", "10"], "applies to priors only"),
        (["stats", SLICE, "--model", "mixtral-8x7b", "--warmup", "17"], "--warmup"),
        (["stats", SLICE, "--model", "olmoe-1b-7b"], "32 MoE layers, but olmoe-1b-7b has 16"),
        (["stats", str(stats), "--model", "mixtral-8x7b", "--save-trace", str(tmp_path / "x.npz")], "holds no trace"),
        (["stats", str(stats), "--model", "deepseek-v3"], "pass the --model the statistics were made for"),
        (["stats", "uniform", "--model", "mixtral-8x7b", "--tokens", "0"], "--tokens"),
        (["stats", "uniform", "--model", "no-such-model"], "unknown model name"),
        (["stats", str(tmp_path / "missing.jsonl"), "--model", "mixtral-8x7b"], "file not found"),
        (["stats", "uniform", "--model", "mixtral-8x7b", "--out", str(tmp_path / "no" / "s.yaml")], "does not exist"),
        (["stats", "uniform", "--model", "mixtral-8x7b", "--out", str(tmp_path)], "is a folder"),
        (["stats", "uniform", "--model", "mixtral-8x7b", "--out", str(stats)], "already exists"),
        (["stats", "uniform", "--model", "mixtral-8x7b", "--save-trace", str(stats)], "already exists"),
    ]
    monkeypatch.chdir(tmp_path)
    for args, words in cases:              # in-process: a user's mistake returns 2, anything else raises here
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2, (args, err)
        assert err.count("\n") == 1 and words in err and "Traceback" not in err, (args, err)
    before = stats.read_text()
    assert main(["stats", "olmoe-like", "--model", "mixtral-8x7b", "--out", str(stats), "--force"]) == 0
    assert stats.read_text() != before
