"""The committed trained MoE (tests/data/fixture-moe) and its routing trace (tests/data): they load with
transformers and with our ModelSpec reader, the tokenizer round-trips, the model is really trained, and the
files stay small. benchmarks/test_moe_trace.py recomputes the trace on the CPU."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from strata_plan.core.routing import load_trace  # noqa: E402
from strata_plan.core.spec import load_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"
DATA = ROOT / "tests" / "data"

MB = 10**6


@pytest.fixture(scope="module")
def model():
    return transformers.AutoModelForCausalLM.from_pretrained(FIXTURE, dtype=torch.float32,
                                                             experts_implementation="eager").eval()


@pytest.fixture(scope="module")
def heldout():
    h = np.load(FIXTURE / "heldout_tokens.npz")
    return h["tokens"], h["sequence"], json.loads(str(h["files"]))


@pytest.fixture(scope="module")
def train_log():
    return json.loads((FIXTURE / "train_log.json").read_text())


def test_files_within_size_limits():
    assert (FIXTURE / "model.safetensors").stat().st_size <= 16 * MB
    for trace in DATA.glob("*.trace.npz"):
        assert trace.stat().st_size <= 4 * MB, trace


def test_loads_with_transformers_and_load_spec_and_they_agree(model):
    spec = load_spec(str(FIXTURE))
    assert model.config.model_type == spec.model_type == "deepseek_v3"
    assert (spec.n_layers, spec.n_moe_layers, spec.n_routed, spec.top_k) == (6, 5, 32, 4)
    assert spec.attention.kind == "mla" and spec.shared_intermediate == 32 and spec.router_bias
    params = sum(p.numel() for p in model.parameters())
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert spec.total_params == params + biases
    assert tuple(spec.moe_layers) == tuple(i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate"))


def test_tokenizer_round_trips():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    hf = transformers.AutoTokenizer.from_pretrained(FIXTURE)
    assert tok.get_vocab_size() == 4096 and tok.token_to_id("<|endoftext|>") == 0
    texts = [(ROOT / "strata_plan" / "core" / "spec.py").read_text(), "x = 'naïve ☃ 数据'\n\tif a:  # tab\r\n  pass\n", ""]
    for text in texts:
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text
        assert hf(text)["input_ids"] == ids and hf.decode(ids) == text
    assert len(tok.encode(texts[0]).ids) < len(texts[0].encode()) / 2.5   # it learned code: > 2.5 bytes a token


def test_trace_meta_and_shape(heldout):
    trace = load_trace(DATA / "fixture-moe.trace.npz", load_spec(str(FIXTURE)))
    tokens, sequence, files = heldout
    assert trace.n_tokens == len(tokens) >= 8000 and trace.depth == 4 and trace.phase == "decode"
    assert len(files) == sequence.max() + 1
    assert (trace.lookahead_experts[:, -1] == -1).all()
    assert (trace.lookahead_experts[:, 0] >= 0).all()
    # the routed weights are normalised top-k scores times routed_scaling_factor (2.5)
    assert np.allclose(trace.weights.sum(-1), 2.5, atol=1e-4)


def test_the_model_is_trained(model, heldout, train_log):
    """On held-out text it beats the best unigram model of that very text (an oracle that knows the
    token frequencies); an untrained model is far worse (about ln 4096 = 8.3 nats)."""
    tokens, sequence, _ = heldout
    ids = np.concatenate([tokens[sequence == s][:128] for s in range(4)])
    losses = []
    with torch.no_grad():
        for s in range(4):
            x = torch.as_tensor(tokens[sequence == s][:128], dtype=torch.long)[None]
            logits = model(input_ids=x).logits[0, :-1]
            losses.append(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none"))
    loss = float(torch.cat(losses).mean())
    counts = np.bincount(ids, minlength=4096)
    p = counts[counts > 0] / counts.sum()
    unigram = float(-(p * np.log(p)).sum())
    assert loss < unigram - 1.0, (loss, unigram)
    held = train_log["held_out"]
    assert held["perplexity"] == pytest.approx(math.exp(held["loss"]))
    assert held["loss"] < unigram - 1.0


def test_train_log_records_a_real_run(train_log):
    t = train_log["train"]
    assert train_log["parameters"] == 7_425_664 and train_log["shape"]["n_routed"] == 32
    assert "H200" in train_log["device"] and t["seconds"] <= 180        # the limit for the fixture
    assert t["steps"] == len(t["loss"]) >= 1000
    assert np.mean(t["loss"][-100:]) < np.mean(t["loss"][:100]) - 2.0
    assert train_log["corpus"]["held_out_files"] > 100 and train_log["held_out"]["tokens"] >= 100_000
