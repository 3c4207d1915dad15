"""The training machinery of benchmarks/train_moe.py on CPU at toy sizes: determinism, the balance-bias rule,
the sequence-wise balance loss, the corpus split, the tokenizer's byte accounting, and the lookahead's
definition."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[1]

from moe import corpus as C  # noqa: E402
from moe.model import FIXTURE, GateTap, build_model, moe_blocks, moe_layer_indices, sequence_balance_loss, \
    update_balance_bias  # noqa: E402
from moe.trace import route_sequence  # noqa: E402
from moe.train import TrainSettings, batch_order, fit, windows  # noqa: E402

TOY = replace(FIXTURE, name="toy", vocab=300, hidden=64, layers=4, dense_intermediate=96, moe_intermediate=16,
              n_routed=8, top_k=2, heads=2, kv_lora_rank=16, qk_nope_dim=8, qk_rope_dim=8, v_dim=16)


def _repo_sources() -> list[C.SourceFile]:
    return C.read_sources([("strata_plan", ROOT / "strata_plan")])


@pytest.fixture(scope="module")
def toy_data():
    files = _repo_sources()
    tok = C.train_tokenizer([f.text for f in files], TOY.vocab)
    stream = C.stream(C.encode_files(tok, files))
    return tok, windows(stream, 32)


def test_same_seed_same_loss_curve_and_another_seed_differs(toy_data):
    _, wins = toy_data
    s = TrainSettings(seq_len=32, batch=4, lr=3e-3, seed=3)
    curves = [fit(build_model(TOY, 3), TOY, wins, s, 6, log=lambda *_: None).loss for _ in range(2)]
    assert curves[0] == curves[1]
    assert curves[0][-1] < curves[0][0]
    other = fit(build_model(TOY, 4), TOY, wins, replace(s, seed=4), 6, log=lambda *_: None).loss
    assert other != curves[0]


def test_batch_order_is_seeded_epochs():
    a = batch_order(10, 3, 7, seed=1)
    assert [len(x) for x in a] == [3] * 7
    assert len(set(np.concatenate(a[:3]).tolist())) == 9          # one epoch: no window twice
    assert all((x == y).all() for x, y in zip(a, batch_order(10, 3, 7, seed=1)))
    assert any((x != y).any() for x, y in zip(a, batch_order(10, 3, 7, seed=2)))


def test_balance_bias_moves_toward_balance():
    model = build_model(TOY, 0)
    n_moe = len(moe_blocks(model))
    loads = torch.tensor([[10, 2, 4, 4, 4, 4, 1, 3]] * n_moe)      # mean 4
    update_balance_bias(model, loads, gamma=0.01)
    bias = moe_blocks(model)[0].gate.e_score_correction_bias
    assert bias.dtype == torch.float32
    assert bias.tolist() == pytest.approx([-0.01, 0.01, 0, 0, 0, 0, 0.01, 0.01])


class _FakeTap:
    def __init__(self, logits, idx):
        self.out = [(logits, None, idx)]


def test_sequence_balance_loss_is_one_when_balanced_and_larger_when_not():
    batch, tokens, n_exp, k = 1, 8, 4, 2
    logits = torch.zeros(batch * tokens, n_exp)                     # equal affinities: P_i = 1/E
    balanced = torch.tensor([[0, 1], [2, 3]] * (tokens // 2))
    skewed = torch.tensor([[0, 1]] * tokens)
    assert float(sequence_balance_loss(_FakeTap(logits, balanced), batch, k)) == pytest.approx(1.0)
    logits_skewed = torch.tensor([[4.0, 4.0, -4.0, -4.0]] * tokens)
    assert float(sequence_balance_loss(_FakeTap(logits_skewed, skewed), batch, k)) > 1.9


def test_split_is_by_content_and_deduplicated(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for i in range(400):
        (tmp_path / "a" / f"m{i}.py").write_text(f"x = {i}\n")
    (tmp_path / "b" / "copy.py").write_text("x = 7\n")              # same content as a/m7.py
    (tmp_path / "b" / "bad.py").write_bytes(b"\xff\xfe not utf-8")
    files = C.read_sources([("t", tmp_path)])
    assert len(files) == 400
    corpus = C.split(files)
    assert 0 < len(corpus.held_out) < 30                            # about 2% of 400
    held = {f.text for f in corpus.held_out}
    assert not held & {f.text for f in corpus.train}
    again = C.split(list(reversed(C.read_sources([("other-name", tmp_path)]))))
    assert {f.text for f in again.held_out} == held                 # independent of paths and order


def test_token_byte_lengths_add_up_to_utf8_bytes(toy_data):
    tok, _ = toy_data
    text = 'def f(x):\n    return "häßlich ✓ 数据"  # ok\n'
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert int(C.token_byte_lengths(tok)[ids].sum()) == len(text.encode("utf-8"))


def test_lookahead_equals_real_routing_when_the_layers_between_do_nothing():
    """With the attention and MoE outputs of the layers after MoE layer 0 zeroed, the residual stream reaches
    layer i+d unchanged, so the depth-d guess from layer 0 must be exactly the real routing of layer d."""
    model = build_model(TOY, 1).eval()
    layer_ids = moe_layer_indices(model)
    with torch.no_grad():
        for j in layer_ids[1:]:
            layer = model.model.layers[j]
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.experts.down_proj.zero_()
            layer.mlp.shared_experts.down_proj.weight.zero_()
    tokens = np.arange(1, 25, dtype=np.int32)
    r = route_sequence(model, tokens, depth=4)
    n_moe = len(layer_ids)
    assert r["experts"].shape == (24, n_moe, TOY.top_k)
    for d in range(1, n_moe):
        assert (r["lookahead_experts"][:, 0, d - 1] == r["experts"][:, d]).all()
        assert np.allclose(r["lookahead_scores"][:, 0, d - 1], r["weights"][:, d], atol=1e-6)
    assert (r["lookahead_experts"][:, n_moe - 1] == -1).all()
    assert (np.diff(r["weights"], axis=-1) <= 0).all()              # descending gate weight


def test_gate_tap_sees_every_moe_layer():
    model = build_model(TOY, 0)
    tap = GateTap(model)
    model(input_ids=torch.arange(10)[None])
    tap.close()
    assert len(tap.out) == TOY.n_moe_layers and all(o[2].shape == (10, TOY.top_k) for o in tap.out)


def test_cli_refuses_a_folder_without_python_files(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_moe.py"), "--size", "fixture", "--out",
                        str(tmp_path / "o"), "--steps", "1", "--source-root", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln]
    assert len(lines) == 1 and "--source-root" in lines[0] and "fix:" in lines[0]
