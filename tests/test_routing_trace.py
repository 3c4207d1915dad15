"""Routing trace format v1: round trip, the Mixtral JSONL converter, and every kind of bad trace refused
with one UserError line (and exit code 2 through the CLI)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from strata_plan.errors import UserError
from strata_plan.core.routing import Trace, load_trace, save_trace
from strata_plan.core.routing.convert import trace_from_jsonl
from strata_plan.core.routing.sample import sample_trace
from strata_plan.core.spec import load_spec

SLICE = Path(__file__).parent / "data" / "routing_mixtral_slice.jsonl"


def _small(lookahead: bool = True) -> Trace:
    t = sample_trace(0.8, 0.3, n_layers=5, n_experts=12, top_k=3, tokens=40, seed=1, model="toy")
    if not lookahead:
        return t
    rng = np.random.default_rng(0)
    le = rng.integers(0, 12, size=(40, 5, 2, 3)).astype(np.int32)
    le[:, 4, 0] = -1                       # layer 4 + 1 does not exist
    le[:, 3:, 1] = -1                      # layers 3, 4 + 2 do not exist
    return Trace(t.experts, t.weights, t.sequence, "toy", 12, source="toy", lookahead_experts=le,
                 lookahead_scores=rng.random(le.shape).astype(np.float32))


def test_round_trip_keeps_arrays_and_meta(tmp_path):
    t = _small()
    out = save_trace(t, tmp_path / "t.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.npz"]          # no temporary file left
    back = load_trace(out)
    for name in ("experts", "weights", "sequence", "lookahead_experts", "lookahead_scores"):
        assert np.array_equal(getattr(back, name), getattr(t, name)), name
    assert back.meta == t.meta and back.sha256 == t.sha256 and back.depth == 2


def test_converter_drops_incomplete_tokens_and_splits_sequences():
    t = trace_from_jsonl([SLICE])
    assert t.experts.shape == (17, 32, 2)                                  # 20 tokens, 3 incomplete
    assert t.sequence.tolist() == [0] * 8 + [1] * 9
    first = [json.loads(line) for line in SLICE.read_text().splitlines()]
    rec = next(r for r in first if r["problem_id"] == 1 and r["token_idx"] == 69 and r["layer"] == 5)
    assert t.experts[8, 5].tolist() == rec["experts"]
    assert t.weights[8, 5].tolist() == pytest.approx(rec["gating_probs"])
    t.check_model(load_spec("mixtral-8x7b"))


def test_converter_on_the_whole_shared_trace(shared_data):
    files = sorted((shared_data / "routing" / "mixtral8x7b_vllm_routing").glob("*_routing.jsonl"))
    t = trace_from_jsonl(files)
    assert t.experts.shape == (166 + 78 + 81 + 252, 32, 2)                 # the README's counts less dropped tokens
    assert len(np.unique(t.sequence)) == 4


def test_converter_refuses_bad_records(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"dataset": "x", "problem_id": 0, "layer": 0, "token_idx": 0, "experts": [1, 2]}\n')
    with pytest.raises(UserError, match="r.jsonl:1: gating_probs"):
        trace_from_jsonl([f])
    f.write_text('{"dataset": "x", "problem_id": 0, "layer": 0, "token_idx": 0, "experts": [1, 2], "gating_pro')
    with pytest.raises(UserError, match="truncated"):
        trace_from_jsonl([f])


def _save_raw(path: Path, **arrays) -> Path:
    np.savez_compressed(path, **arrays)
    return path


def _arrays(t: Trace) -> dict:
    return {"experts": t.experts, "weights": t.weights, "sequence": t.sequence, "meta": np.array(json.dumps(t.meta)),
            "lookahead_experts": t.lookahead_experts, "lookahead_scores": t.lookahead_scores}


def _meta(t: Trace, **kw) -> np.ndarray:
    return np.array(json.dumps({**t.meta, **kw}))


BAD = {
    "id >= E": (lambda a, t: {**a, "experts": np.where(a["experts"] == 0, 12, a["experts"])}, "experts: expert id 12"),
    "negative id": (lambda a, t: {**a, "experts": -a["experts"] - 1}, "outside \\[0, 12\\)"),
    "repeated id": (lambda a, t: {**a, "experts": np.repeat(a["experts"][:, :, :1], 3, axis=2)}, "twice"),
    "weights shape": (lambda a, t: {**a, "weights": a["weights"][:-1]}, "weights: must be a float32"),
    "sequence shape": (lambda a, t: {**a, "sequence": a["sequence"][:5]}, "sequence: must be an int32"),
    "sequence not contiguous": (lambda a, t: {**a, "sequence": np.arange(40, dtype=np.int32) % 2}, "not contiguous"),
    "missing array": (lambda a, t: {k: v for k, v in a.items() if k != "weights"}, "weights: missing array"),
    "unknown array": (lambda a, t: {**a, "extra": np.zeros(1)}, "extra: unknown array"),
    "half lookahead": (lambda a, t: {k: v for k, v in a.items() if k != "lookahead_scores"}, "lookahead_scores: is missing"),
    "lookahead past end": (lambda a, t: {**a, "lookahead_experts": np.zeros_like(a["lookahead_experts"])}, "past the last"),
    "lookahead id": (lambda a, t: {**a, "lookahead_experts": a["lookahead_experts"] + 20}, "lookahead_experts: expert id"),
    "meta format": (lambda a, t: {**a, "meta": _meta(t, format="other")}, "meta.format"),
    "meta version": (lambda a, t: {**a, "meta": _meta(t, version=2)}, "meta.version: version 2"),
    "meta layers": (lambda a, t: {**a, "meta": _meta(t, n_layers=6)}, "meta.n_layers: says 6"),
    "meta type": (lambda a, t: {**a, "meta": _meta(t, n_experts="12")}, "meta.n_experts: must be an integer"),
    "meta json": (lambda a, t: {**a, "meta": np.array("{not json")}, "meta: is not valid JSON"),
    "meta phase": (lambda a, t: {**a, "meta": _meta(t, phase="training")}, "meta.phase"),
    "meta not 0-d": (lambda a, t: {**a, "meta": np.array([json.dumps(t.meta)])}, "0-d string array"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_trace_is_one_user_error(tmp_path, case):
    t = _small()
    change, message = BAD[case]
    path = _save_raw(tmp_path / "bad.npz", **change(_arrays(t), t))
    with pytest.raises(UserError, match=message) as e:
        load_trace(path)
    assert "\n" not in e.value.line() and str(path) in e.value.line() and "fix:" in e.value.line()


def test_truncated_file_and_wrong_model(tmp_path):
    t = _small(lookahead=False)
    good = save_trace(t, tmp_path / "t.npz")
    data = good.read_bytes()
    for cut in (len(data) // 2, len(data) - 40, 30):
        bad = tmp_path / f"cut{cut}.npz"
        bad.write_bytes(data[:cut])
        with pytest.raises(UserError, match="truncated|not a readable"):
            load_trace(bad)
    mixtral = load_spec("mixtral-8x7b")
    with pytest.raises(UserError, match="12 experts, but mixtral-8x7b has 8"):
        load_trace(good, mixtral)
    eight = save_trace(sample_trace(0.5, 0.1, 4, 8, 2, 10), tmp_path / "eight.npz")
    with pytest.raises(UserError, match="4 MoE layers, but mixtral-8x7b has 32"):
        load_trace(eight, mixtral)


def test_cli_refuses_bad_traces_with_exit_2_and_one_line(tmp_path, cli):
    t = _small()
    a = _arrays(t)
    bad = _save_raw(tmp_path / "bad.npz", **{**a, "experts": a["experts"] + 12})
    cut = tmp_path / "cut.npz"
    cut.write_bytes(save_trace(t, tmp_path / "ok.npz").read_bytes()[:500])
    layers = save_trace(sample_trace(0.5, 0.1, 31, 8, 2, 10), tmp_path / "layers.npz")
    for path, model, words in ((bad, "mixtral-8x7b", "outside [0, 12)"), (cut, "mixtral-8x7b", "cut.npz"),
                               (layers, "mixtral-8x7b", "31 MoE layers, but mixtral-8x7b has 32"),
                               (tmp_path / "ok.npz", "mixtral-8x7b", "12 experts, but mixtral-8x7b has 8")):
        r = cli("stats", str(path), "--model", model, "--out", str(tmp_path / "s.yaml"))
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "s.yaml").exists()
