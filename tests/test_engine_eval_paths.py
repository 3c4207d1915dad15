"""The two other ways strata_plan/engine/eval.py runs a packed model: token by token (`evaluate(..., packed_chunk=1)`: on a
GPU the fused MoE's batch-1 decode kernels) and over its dequantized weights (`evaluate_dequantized`: weight
quantization alone, fast on any device). benchmarks/bench_fidelity.py uses both. On the CPU the engine's path
is the same float32 math over the same weights, so all three must agree."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from strata_plan.cli import main  # noqa: E402
from strata_plan.engine.eval import evaluate, evaluate_dequantized  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "fixture-moe"
CHUNK = 48

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_torch_thread):
    import numpy as np
    packed = tmp_path_factory.mktemp("eval") / "q4"
    assert main(["pack", str(FIXTURE), "--out", str(packed), "--format", "q4_g128_f16", "--device", "cpu", "--json"]) == 0
    tokens = np.load(FIXTURE / "heldout_tokens.npz")["tokens"].tolist()
    return {"batched": evaluate(packed, FIXTURE, tokens, CHUNK, CHUNK, device="cpu"),
            "stepped": evaluate(packed, FIXTURE, tokens, CHUNK, CHUNK, device="cpu", packed_chunk=1),
            "dequantized": evaluate_dequantized(packed, FIXTURE, tokens, CHUNK, CHUNK, device="cpu")}


@pytest.mark.parametrize("other", ["stepped", "dequantized"])
def test_every_path_agrees_with_the_batched_prefill_on_the_cpu(runs, other):
    a, b = runs["batched"], runs[other]
    assert b.predictions == a.predictions == CHUNK - 1
    assert b.top1 == a.top1 and b.top5 == a.top5
    # measured: KL 0.0062946 everywhere, relative differences 2.2e-6 (float32 summation order only)
    assert b.kl_mean == pytest.approx(a.kl_mean, rel=1e-4)
    assert b.ppl_packed == pytest.approx(a.ppl_packed, rel=1e-5)
    assert a.kl_mean > 1e-4               # 4-bit weights: a real difference from the reference to agree on
