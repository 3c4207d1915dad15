"""`strata-plan pack` on the committed trained MoE: every routed expert becomes one 4 KiB-aligned blob of
its planned format, the index says where, the dense weights are carried over unchanged."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from strata_plan.cli import main as cli_main  # noqa: E402
from strata_plan.kernels import dequantize, pack_expert, unpack_expert  # noqa: E402
from strata_plan.kernels.formats import EXPERT_ALIGN, tier_mix  # noqa: E402
from strata_plan.engine.pack import formats_from_mix  # noqa: E402
from strata_plan.engine.packed import check_plan_matches, load_index, read_blob, verify_all  # noqa: E402
from strata_plan.errors import UserError  # noqa: E402
from strata_plan.core.spec import load_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"
TRACE = ROOT / "tests" / "data" / "fixture-moe.trace.npz"


@pytest.fixture(scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)          # tiny experts: threads only add overhead on a busy 2-core runner
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def original():
    return load_file(str(FIXTURE / "model.safetensors"))


@pytest.fixture(scope="module")
def planned(tmp_path_factory, one_thread):
    pytest.importorskip("optuna")
    d = tmp_path_factory.mktemp("pack")
    plan = d / "plan.yaml"
    assert cli_main(["plan", "--profile", "rtx-4090", "--model", str(FIXTURE), "--stats", str(TRACE), "--trials", "5",
                     "--out", str(plan), "--json"]) == 0
    # on the CPU: the blobs are compared bit for bit with pack_expert on the CPU below
    assert cli_main(["pack", str(FIXTURE), "--out", str(d / "packed"), "--plan", str(plan), "--device", "cpu",
                     "--json"]) == 0
    return plan, d / "packed"


def _expert(original, layer, e):
    base = f"model.layers.{layer}.mlp.experts.{e}"
    return tuple(original[f"{base}.{m}.weight"] for m in ("gate_proj", "up_proj", "down_proj"))


def test_pack_with_a_plan_lays_out_every_expert(planned, original):
    plan_path, out = planned
    from strata_plan.core.plan import load_plan
    spec = load_spec(str(FIXTURE))
    plan = load_plan(plan_path, spec)
    index = load_index(out)
    assert len(index.entries) == spec.n_moe_layers * spec.n_routed
    for lp in plan.layers:
        rows = [e for e in index.entries if e.layer == lp.layer]
        assert [e.expert for e in rows] == list(range(spec.n_routed))
        offset = 0
        for r in rows:
            assert r.format == lp.format_of(r.expert)
            assert r.offset == offset and r.offset % EXPERT_ALIGN == 0
            assert r.nbytes == spec.routed_expert_bytes(r.format)
            offset += r.nbytes
        assert (out / rows[0].file).stat().st_size == offset
    assert len({e.format for e in index.entries}) == 3        # the plan's tier mix


def test_blobs_are_what_pack_expert_makes_of_the_checkpoint(planned, original):
    _, out = planned
    index = load_index(out)
    for r in index.entries[::37]:                             # a spread of layers, experts and formats
        blob = np.fromfile(out / r.file, dtype=np.uint8, count=r.nbytes, offset=r.offset)
        gate, up, down = (w.float() for w in _expert(original, r.layer, r.expert))
        assert np.array_equal(blob, pack_expert(gate, up, down, r.format).numpy())
        w = dequantize(unpack_expert(torch.from_numpy(blob), r.format, index.hidden, index.moe_intermediate)["up"])
        assert float((w.float() - up.float()).norm() / up.float().norm()) < 0.8   # a quantized copy, not noise


def test_dense_weights_carried_over_unchanged(planned, original):
    _, out = planned
    dense = load_file(str(out / "dense.safetensors"))
    assert not any(".mlp.experts." in n for n in dense)
    expected = {n for n in original if ".mlp.experts." not in n}
    assert set(dense) == expected
    assert all(torch.equal(dense[n], original[n]) for n in expected)
    assert any(n.endswith("e_score_correction_bias") and dense[n].dtype == torch.float32 for n in dense)
    assert json.loads((out / "config.json").read_text()) == json.loads((FIXTURE / "config.json").read_text())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "q4_g128_f16", "bf16"])
def test_pack_expert_on_the_gpu_is_as_good_as_on_the_cpu(original, fmt):
    # packing quantizes on the GPU when there is one: same layout, same error (reductions may round differently)
    weights = [w.float() for w in _expert(original, 3, 5)]
    inter, hidden = weights[0].shape

    def errors(blob):
        mats = unpack_expert(blob, fmt, hidden, inter)
        return [float((dequantize(mats[m]) - w).norm() / w.norm()) for m, w in zip(("gate", "up", "down"), weights)]

    cpu = pack_expert(*weights, fmt)
    gpu = pack_expert(*(w.cuda() for w in weights), fmt)
    assert gpu.device.type == "cuda" and gpu.shape == cpu.shape
    assert all(g <= c * 1.02 + 1e-6 for g, c in zip(errors(gpu.cpu()), errors(cpu)))


def test_bf16_format_round_trips_exactly(tmp_path, original, one_thread):
    assert cli_main(["pack", str(FIXTURE), "--out", str(tmp_path), "--format", "bf16", "--json"]) == 0
    index = load_index(tmp_path)
    r = index.entries[-1]
    blob = torch.from_numpy(np.fromfile(tmp_path / r.file, dtype=np.uint8, count=r.nbytes, offset=r.offset))
    mats = unpack_expert(blob, "bf16", index.hidden, index.moe_intermediate)
    for name, w in zip(("gate", "up", "down"), _expert(original, r.layer, r.expert)):
        assert torch.equal(dequantize(mats[name]).to(torch.bfloat16), w)


def test_tier_mix_gives_the_most_used_experts_the_first_tier():
    from strata_plan.core.routing import compute_stats, load_trace
    spec = load_spec(str(FIXTURE))
    stats = compute_stats(load_trace(TRACE, spec))
    mix = tier_mix(1.92)
    first = mix.counts(spec.n_routed)[0]
    fmts = formats_from_mix(spec, 1.92, None, str(TRACE))
    for layer, f in zip(stats.layers, fmts):
        assert {e for e, name in f.items() if name == mix.formats[0]} == set(layer.order[:first])
    plain = formats_from_mix(spec, 1.92, None, None)
    assert {e for e, name in plain[0].items() if name == mix.formats[0]} == set(range(first))


@pytest.mark.parametrize("args, field", [
    (["--format", "q3_nope"], "--format"),
    (["--bpw", "9"], "--bpw"),
    (["--format", "bf16", "--stats", "x.npz"], "--stats"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, field):
    assert cli_main(["pack", str(FIXTURE), "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and "fix:" in err[0]


def test_folder_without_weights_is_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text((FIXTURE / "config.json").read_text())
    assert cli_main(["pack", str(tmp_path), "--out", str(tmp_path / "o"), "--format", "bf16"]) == 2
    assert "model.safetensors" in capsys.readouterr().err


def test_plan_for_another_model_is_refused(planned, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((FIXTURE / "config.json").read_text())
    cfg["n_routed_experts"] = 16
    (other / "config.json").write_text(json.dumps(cfg))
    (other / "model.safetensors").symlink_to(FIXTURE / "model.safetensors")
    plan, _ = planned
    assert cli_main(["pack", str(other), "--out", str(tmp_path / "o"), "--plan", str(plan)]) == 2
    assert "n_experts" in capsys.readouterr().err


def test_index_of_an_older_version_is_refused(tmp_path):
    # version 1 blobs (byte-ordered codes, row-major tensors) would decode to garbage; version 2 has no checksums;
    # version 3 has one sha256 a blob (v4: one a 1 MiB part, checked as the parts are read)
    for v in (1, 2, 3):
        (tmp_path / "index.json").write_text(json.dumps({"format": "strata-plan/packed-experts", "version": v,
                                                         "entries": []}))
        with pytest.raises(UserError) as e:
            load_index(tmp_path)
        line = e.value.line()
        assert "pack the checkpoint again" in line and f"v{v}" in line and "\n" not in line
        assert f"--out {tmp_path} --force" in line


def test_checksums_of_every_blob_dense_and_plan(planned):
    plan_path, out = planned
    index = load_index(out)
    assert index.plan_sha256 == hashlib.sha256(plan_path.read_bytes()).hexdigest()
    assert verify_all(index) == index.expert_bytes + (out / "dense.safetensors").stat().st_size
    assert len({e.parts for e in index.entries}) == len(index.entries)
    assert all(len(e.parts) == -(-e.nbytes // index.part_bytes) for e in index.entries)
    assert len(index.dense_parts) == -(-index.dense_nbytes // index.part_bytes) > 1


def _copy(out, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(out, dst)
    return dst


def test_a_damaged_blob_names_its_layer_expert_and_file(planned, tmp_path):
    _, out = planned
    dst = _copy(out, tmp_path)
    index = load_index(dst)
    r = index.entries[100]
    with open(dst / r.file, "r+b") as f:
        f.seek(r.offset + 5000)
        b = f.read(1)
        f.seek(r.offset + 5000)
        f.write(bytes([b[0] ^ 1]))
    read_blob(index, index.entries[99])                       # the neighbours are fine
    with pytest.raises(UserError) as e:
        read_blob(index, r)
    line = e.value.line()
    assert r.file in line and f"layer {r.layer} expert {r.expert}" in line and "fix:" in line
    with pytest.raises(UserError):
        verify_all(index)


@pytest.mark.parametrize("damage, field", [
    (lambda d: (d / "experts-layer003.bin").unlink(), "missing"),
    (lambda d: os.truncate(d / "experts-layer005.bin", 4096 * 3), "truncated"),
    (lambda d: (d / "dense.safetensors").unlink(), "dense.safetensors"),
    (lambda d: (d / "index.json").write_text((d / "index.json").read_text()[:-50]), "JSONDecodeError"),
    (lambda d: (d / "index.json").write_text((d / "index.json").read_text().replace('"parts"', '"part"', 1)),
     "entries[0].part"),
    (lambda d: (d / "index.json").write_text(json.dumps({**json.loads((d / "index.json").read_text()),
                                                         "dense_parts": ["0" * 64]})), "dense_parts"),
])
def test_a_damaged_folder_is_refused_in_one_line(planned, tmp_path, damage, field):
    _, out = planned
    dst = _copy(out, tmp_path)
    damage(dst)
    with pytest.raises(UserError) as e:
        load_index(dst)
    line = e.value.line()
    assert field in line and "fix:" in line and "\n" not in line


def test_a_plan_with_other_tiers_runs_a_plan_with_other_formats_is_refused(planned):
    from strata_plan.core.plan import load_plan
    plan_path, out = planned
    index = load_index(out)
    plan = load_plan(plan_path)
    check_plan_matches(index, plan, str(plan_path))
    # other budgets: every expert moved to another tier, cache slots dropped; formats kept
    moved = tuple(dataclasses.replace(lp, vram=(), ram=lp.nvme, nvme=lp.vram + lp.ram, cache_slots=0)
                  for lp in plan.layers)
    other = dataclasses.replace(plan, layers=moved, cache=dataclasses.replace(plan.cache, total_slots=0))
    check_plan_matches(index, other, "other.yaml")
    # one expert in another format
    lp = plan.layers[2]
    f_old = lp.format_of(7)
    f_new = next(f for f in lp.formats if f != f_old)
    fmts = {f: tuple(e for e in ids if e != 7) + ((7,) if f == f_new else ()) for f, ids in lp.formats.items()}
    changed = dataclasses.replace(plan, layers=plan.layers[:2] + (dataclasses.replace(lp, formats=fmts),)
                                  + plan.layers[3:])
    with pytest.raises(UserError) as e:
        check_plan_matches(index, changed, "changed.yaml")
    assert "expert 7" in str(e.value) and f_new in str(e.value) and f"layer={lp.layer}" in str(e.value)
    # another model's config
    src = dataclasses.replace(plan.sources, model=dataclasses.replace(plan.sources.model, sha256="0" * 64))
    with pytest.raises(UserError) as e:
        check_plan_matches(index, dataclasses.replace(plan, sources=src), "another.yaml")
    assert "sources.model.sha256" in str(e.value)
