"""The committed routing traces against the model code that took them (benchmarks/moe/trace.py): a CPU
forward of the fixture reproduces the trace taken on the GPU, and the benchmark model's record and trace
agree."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from moe.trace import route_sequence  # noqa: E402

from strata_plan.core.routing import load_trace  # noqa: E402
from strata_plan.core.spec import load_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"
BENCH = ROOT / "benchmarks" / "data" / "trained-20261203" / "bench-moe"   # the 260M model the trained bench runs


@pytest.fixture(scope="module")
def model():
    return transformers.AutoModelForCausalLM.from_pretrained(FIXTURE, dtype=torch.float32,
                                                             experts_implementation="eager").eval()


@pytest.fixture(scope="module")
def heldout():
    h = np.load(FIXTURE / "heldout_tokens.npz")
    return h["tokens"], h["sequence"], json.loads(str(h["files"]))


def test_cpu_forward_reproduces_the_committed_trace(model, heldout):
    """Routing and lookahead of the first 48 tokens of 4 held-out files, recomputed here on the CPU, equal
    what the GPU wrote (the trace was taken in float32 from the same bf16 weights)."""
    tokens, sequence, _ = heldout
    trace = load_trace(ROOT / "tests" / "data" / "fixture-moe.trace.npz", load_spec(str(FIXTURE)))
    assert np.array_equal(trace.sequence, sequence)
    for s in range(4):
        rows = np.flatnonzero(sequence == s)[:48]
        got = route_sequence(model, tokens[rows], depth=4)
        assert np.array_equal(got["experts"], trace.experts[rows])
        assert np.allclose(got["weights"], trace.weights[rows], atol=1e-4)
        assert np.array_equal(got["lookahead_experts"], trace.lookahead_experts[rows])
        assert np.allclose(got["lookahead_scores"], trace.lookahead_scores[rows], atol=1e-4)


def test_bench_model_record_and_trace():
    log = json.loads((BENCH / "train_log.json").read_text())
    spec = load_spec(str(BENCH))
    assert 100e6 <= log["parameters"] <= 300e6 and (spec.n_routed, spec.top_k) == (64, 6)
    biases = spec.n_moe_layers * spec.n_routed
    assert spec.total_params == log["parameters"] + biases
    assert log["train"]["seconds"] <= 360 and "H200" in log["device"]
    trace = load_trace(BENCH / "bench-moe.trace.npz", spec)
    assert trace.n_tokens == log["trace"]["tokens"] and trace.depth == 4
