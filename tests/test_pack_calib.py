"""`pack --calib` (strata_plan/engine/calib.py: activation statistics of the routed experts for the quantizer's
importance input) and `pack --rtn` (quantize(..., rtn=True): plain round-to-nearest with min/max scales)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from strata_plan.cli import main  # noqa: E402
from strata_plan.engine.calib import activation_stats, calibration_tokens  # noqa: E402
from strata_plan.engine.config import ModelConfig  # noqa: E402
from strata_plan.engine.pack import Checkpoint, expert_weights  # noqa: E402
from strata_plan.kernels.formats import FORMATS  # noqa: E402
from strata_plan.kernels.quantizer import dequantize, quantize  # noqa: E402
from strata_plan.kernels.reference import rtn_minmax  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def stats():
    tokens = np.load(FIXTURE / "heldout_tokens.npz")["tokens"][:256].tolist()
    return activation_stats(FIXTURE, tokens, chunk=128), tokens


def test_rtn_is_the_min_max_baseline_and_the_fit_never_loses_to_it():
    torch.manual_seed(0)
    w = torch.randn(64, 512)
    assert torch.equal(dequantize(quantize(w, "q4_g128_f16", rtn=True)), rtn_minmax(w, 4, 128))
    for f in FORMATS:
        if f == "bf16":
            continue
        fit, rtn = (float((dequantize(quantize(w, f, rtn=r)) - w).norm()) for r in (False, True))
        assert fit <= rtn, f


def test_statistics_count_every_routed_pair(stats):
    s, tokens = stats
    cfg = ModelConfig.load(FIXTURE)
    assert s.tokens == len(tokens)
    assert s.counts.sum(1).tolist() == [len(tokens) * cfg.router.top_k] * cfg.n_moe_layers
    imp = s.importance(0, 0)
    assert imp["gate"].shape == (cfg.hidden,) and imp["down"].shape == (cfg.spec.moe_intermediate,)
    assert all(bool((v >= 0).all()) and float(v.sum()) > 0 for v in imp.values())


def test_calibrated_importance_lowers_the_error_on_the_experts_own_inputs(stats):
    """The quantizer weights errors by the statistics: on inputs drawn with those per-feature scales, the
    output error of the busiest expert's gate is lower with them than without."""
    s, _ = stats
    cfg = ModelConfig.load(FIXTURE)
    e = int(s.counts[0].argmax())
    _, get = expert_weights(Checkpoint(FIXTURE), cfg.moe_layers[0], cfg.spec.n_routed)
    gate = get(e)[0]
    imp = s.importance(0, e)["gate"]
    x = torch.randn(4096, cfg.hidden, generator=torch.Generator().manual_seed(1)) * imp.sqrt()
    err = {k: float((x @ (dequantize(quantize(gate, "q2_g32_s8m8", i)) - gate).T).norm())
           for k, i in (("plain", None), ("calibrated", imp))}
    assert err["calibrated"] < err["plain"], err


def test_pack_with_calibration_text(tmp_path, capsys):
    text = tmp_path / "calib.txt"
    text.write_text("".join(p.read_text() for p in sorted((ROOT / "strata_plan" / "engine").glob("*.py"))[:4]))
    assert len(calibration_tokens(FIXTURE, text, 10 ** 9)) > 256
    out = tmp_path / "packed"
    assert main(["pack", str(FIXTURE), "--out", str(out), "--format", "q1_g32_s8m4", "--calib", str(text),
                 "--calib-tokens", "256", "--device", "cpu", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["calibration_tokens"] == 256 and summary["quantizer"] == "fit"


@pytest.mark.parametrize("extra,field", [(["--calib", "nowhere.txt"], "nowhere.txt"),
                                         (["--synthetic", "deepseek-v3", "--moe-layers", "1", "--rtn"], "--rtn"),
                                         (["--calib", "x.txt", "--rtn"], "--rtn")])
def test_bad_calibration_input_is_one_line(tmp_path, capsys, extra, field):
    args = ["pack"] + ([] if "--synthetic" in extra else [str(FIXTURE)]) + ["--out", str(tmp_path / "o"),
                                                                            "--format", "q1_g32_s8m4", "--device", "cpu"]
    if "--rtn" in extra and "--calib" in extra:
        with pytest.raises(SystemExit) as e:
            main(args + extra)
        assert e.value.code == 2
    else:
        assert main(args + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0], err
