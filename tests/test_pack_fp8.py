"""`strata-plan pack` on an FP8 block-quantized checkpoint (DeepSeek-V3 / R1 / Kimi-K2 style): every FP8 weight
comes back as codes x its 128 x 128 block factor, experts into the packed blobs, everything else as BF16 in
dense.safetensors; scale tensors and the multi-token-prediction layer are left out."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import load_file, save_file  # noqa: E402

from strata_plan.cli import main as cli_main  # noqa: E402
from strata_plan.engine.packed import load_index, verify_all  # noqa: E402
from strata_plan.kernels import dequantize, unpack_expert  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "fixture-moe"
BLOCK = 128
FP8_MAX = 448.0


def _to_fp8_blocks(w: torch.Tensor):
    """w [N, K] -> (float8_e4m3fn codes, float32 factors [ceil(N/128), ceil(K/128)]), per-block absmax / 448."""
    n, k = w.shape
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    padded = torch.zeros(nb * BLOCK, kb * BLOCK)
    padded[:n, :k] = w.float()
    blocks = padded.view(nb, BLOCK, kb, BLOCK)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-12)                 # [nb, kb]
    codes = (blocks / scale[:, None, :, None]).view(nb * BLOCK, kb * BLOCK)[:n, :k].to(torch.float8_e4m3fn)
    return codes, scale


def _reference_dequant(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Independent of strata_plan/engine/fp8.py: pad to whole blocks, multiply block views, crop."""
    n, k = codes.shape
    nb, kb = scale.shape
    padded = torch.zeros(nb * BLOCK, kb * BLOCK)
    padded[:n, :k] = codes.float()
    return (padded.view(nb, BLOCK, kb, BLOCK) * scale[:, None, :, None]).view(nb * BLOCK, kb * BLOCK)[:n, :k]


def _is_fp8_target(name: str, t: torch.Tensor) -> bool:
    # as DeepSeek-V3 ships: linear projections (attention, experts, shared experts, dense MLP) in FP8;
    # embeddings, lm_head, norms, router gate and its bias stay as they are
    return t.dim() == 2 and name.endswith("proj.weight")


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp8ckpt")
    original = load_file(str(FIXTURE / "model.safetensors"))
    tensors, codes = {}, {}
    for name, t in original.items():
        if _is_fp8_target(name, t):
            c, s = _to_fp8_blocks(t)
            tensors[name], tensors[name + "_scale_inv"] = c, s
            codes[name] = (c, s)
        else:
            tensors[name] = t
    mtp = "model.layers.6.eh_proj.weight"              # DeepSeek-V3's multi-token-prediction layer: not packed
    tensors[mtp] = torch.ones(8, 8, dtype=torch.bfloat16)
    save_file(tensors, str(d / "model.safetensors"))
    cfg = json.loads((FIXTURE / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [BLOCK, BLOCK]}
    (d / "config.json").write_text(json.dumps(cfg))
    out = d / "packed"
    torch.set_num_threads(1)
    assert cli_main(["pack", str(d), "--out", str(out), "--format", "bf16", "--device", "cpu", "--json"]) == 0
    return d, out, original, codes


def test_fp8_experts_are_dequantized_per_block(fp8_checkpoint):
    _, out, _, codes = fp8_checkpoint
    index = load_index(out)
    for r in index.entries[::23]:
        blob = torch.from_numpy(np.fromfile(out / r.file, dtype=np.uint8, count=r.nbytes, offset=r.offset))
        mats = unpack_expert(blob, "bf16", index.hidden, index.moe_intermediate)
        base = f"model.layers.{r.layer}.mlp.experts.{r.expert}"
        for m, proj in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            want = _reference_dequant(*codes[f"{base}.{proj}.weight"]).to(torch.bfloat16)
            assert torch.equal(dequantize(mats[m]).to(torch.bfloat16), want)


def test_fp8_dense_is_bf16_without_scales_or_mtp(fp8_checkpoint):
    _, out, original, codes = fp8_checkpoint
    dense = load_file(str(out / "dense.safetensors"))
    assert not any(n.endswith("_scale_inv") for n in dense)
    assert not any(n.startswith("model.layers.6.") for n in dense)
    assert set(dense) == {n for n in original if ".mlp.experts." not in n}
    fp8_dense = [n for n in dense if n in codes]
    assert len(fp8_dense) > 10                                     # attention, shared experts, dense MLP
    for n in fp8_dense:
        assert dense[n].dtype == torch.bfloat16
        assert torch.equal(dense[n], _reference_dequant(*codes[n]).to(torch.bfloat16))
        # and close to the weight the FP8 copy was made from (e4m3: 3 mantissa bits)
        assert float((dense[n].float() - original[n].float()).norm() / original[n].float().norm()) < 0.05
    for n in set(dense) - set(codes):
        assert torch.equal(dense[n], original[n])
    verify_all(load_index(out))


def test_fp8_without_scale_or_with_wrong_scale_shape_is_refused(fp8_checkpoint, tmp_path, capsys):
    d, _, _, _ = fp8_checkpoint
    tensors = load_file(str(d / "model.safetensors"))
    victim = "model.layers.1.mlp.experts.0.up_proj.weight_scale_inv"
    for case, change in (("missing", lambda t: t.pop(victim)),
                         ("shape", lambda t: t.__setitem__(victim, torch.ones(3, 3)))):
        bad = tmp_path / case
        bad.mkdir()
        t = dict(tensors)
        change(t)
        save_file(t, str(bad / "model.safetensors"))
        (bad / "config.json").write_text((d / "config.json").read_text())
        assert cli_main(["pack", str(bad), "--out", str(bad / "o"), "--format", "bf16", "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "up_proj.weight" in err[0] and "fix:" in err[0]
