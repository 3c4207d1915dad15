"""Nothing damaged reaches a kernel, nothing half-packed is left behind, and a plan edited to wrong values is
refused: the committed fixture MoE packed in BF16 with small hashed parts (16 KiB: three parts a 48 KiB blob,
so a blob's NVMe reads, split five ways, straddle its parts), run on the CPU.

- Every static (VRAM) and RAM blob is checked at start, every NVMe blob at its first read, dense.safetensors
  when the engine opens: a damaged byte anywhere stops `run` with one line naming the file and exit code 2
  before any token is printed, and the damaged blob never lands in the arena.
- `pack` writes into a temporary folder beside its target: Ctrl-C (or a full disk) leaves no folder, or the
  old pack intact under `--force`.
- A plan whose top-k, model name or memory figures were edited to wrong but well-formed values is refused in
  one line naming the field."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from strata_plan.cli import main
from strata_plan.core.plan import CachePlan, NvmeRead, load_plan, save_plan
from strata_plan.core.spec import load_spec
from strata_plan.engine.pack import formats_from_mix, pack_checkpoint
from strata_plan.engine.packed import load_index, verify_all
from strata_plan.engine.store import ExpertStore, StoreOptions
from strata_plan.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"
PART = 16 << 10             # bytes a hashed part (the index's part_bytes; packs default to 1 MiB)
PROMPT = "def main():"


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    out = tmp_path_factory.mktemp("integrity") / "packed"
    spec = load_spec(str(FIXTURE))
    pack_checkpoint(FIXTURE, out, formats_from_mix(spec, None, "bf16", None), device="cpu", part_bytes=PART)
    return out


def tiered(vram: int = 4, ram: int = 10, cache: int = 3, depth: int = 1):
    """The fixture's plan in BF16 (as packed): per layer `vram` static experts, the next `ram` in RAM, the rest
    on NVMe, each NVMe blob read as 5 requests (12 KiB, across the 16 KiB parts)."""
    plan = load_plan(FIXTURE / "plan-rtx-4090.yaml")
    layers = []
    for l in plan.layers:
        order = l.vram + l.ram + l.nvme
        layers.append(dataclasses.replace(l, vram=order[:vram], ram=order[vram:vram + ram], nvme=order[vram + ram:],
                                          cache_slots=cache, formats={"bf16": tuple(range(plan.n_experts))}))
    reads = {"bf16": NvmeRead(split=5, queue_depth=8)}
    staging = dataclasses.replace(plan.staging, nvme_reads=reads, nvme_reads_prefill=reads)
    return dataclasses.replace(plan, layers=tuple(layers), prefetch_depth=depth, prefill_chunk=5, context=64,
                               staging=staging, cache=CachePlan("lru", plan.cache.slot_bytes, cache * len(layers)))


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    return save_plan(tiered(), tmp_path_factory.mktemp("plans") / "plan.yaml")


def copy(packed: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(packed, tmp_path / "copy"))


def flip(path: Path, offset: int, n: int = 1) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


def run(capsys, folder: Path, plan: Path, *extra: str) -> tuple[int, str, list[str]]:
    rc = main(["run", "--packed", str(folder), "--plan", str(plan), "--prompt", PROMPT, "--max-tokens", "4",
               "--device", "cpu", *extra])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err.strip().splitlines()


def test_the_clean_pack_runs_and_every_part_verifies(packed, plan_file, capsys):
    index = load_index(packed)
    assert index.part_bytes == PART and all(len(e.parts) == 3 for e in index.entries)
    assert verify_all(index) == index.expert_bytes + index.dense_nbytes
    rc, out, err = run(capsys, packed, plan_file)
    assert rc == 0 and len(out.strip()) > len(PROMPT), err


# ---- damaged bytes ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tier", ["vram", "ram", "nvme"])
def test_a_damaged_blob_of_any_tier_stops_run_in_one_line_before_a_token(packed, plan_file, tmp_path, capsys, tier):
    """Every blob of the tier damaged in its last part (the issue's case for NVMe: without a check the run
    printed garbage tokens): one line naming the file, the layer, the expert and the fix; exit code 2; stdout
    holds at most the prompt's echo."""
    folder = copy(packed, tmp_path)
    plan, index = load_plan(plan_file), load_index(folder)
    victims = [index.entry(l.layer, e) for l in plan.layers for e in getattr(l, tier)]
    for ent in victims:
        flip(folder / ent.file, ent.offset + ent.nbytes - 100)
    rc, out, err = run(capsys, folder, plan_file)
    assert rc == 2 and len(err) == 1, err
    assert "checksum mismatch in bytes 32768..49152" in err[0] and "experts-layer" in err[0]
    assert "expert" in err[0] and "--force" in err[0] and "Traceback" not in err[0]
    assert out.strip() in ("", PROMPT)


def test_a_damaged_nvme_blob_never_reaches_the_arena_and_each_blob_is_checked_once(packed, tmp_path):
    """At the store: a blob read before is not hashed again in the same run; a damaged one (its middle part)
    fails its fetch before the copy, so the arena holds none of its bytes."""
    folder = copy(packed, tmp_path)
    plan = tiered(vram=0, ram=0, cache=0, depth=0)
    layer = plan.layers[0].layer
    bad = load_index(folder).entry(layer, 5)
    flip(folder / bad.file, bad.offset + PART + 7)
    with ExpertStore.open(folder, plan, "cpu", StoreOptions(prefetch=False), "plan.yaml") as store:
        sent = []
        submit = store.transfers.submit
        store.transfers.submit = lambda f: submit(f) if sent.append(f) is None else None
        for _ in range(2):
            list(store.waves(0, [3]))
        assert [bool(f.parts) for f in sent] == [True, False] and store.verified[0, 3]
        before = store.arena.clone()
        with pytest.raises(UserError) as e:
            list(store.waves(0, [5]))
        line = e.value.line()
        assert f"{bad.file}: layer {layer} expert 5: checksum mismatch in bytes {PART}..{2 * PART}" in line
        assert torch.equal(store.arena, before) and not store.verified[0, 5]


def test_damaged_dense_weights_stop_run_and_eval_in_one_line(packed, plan_file, tmp_path, capsys):
    """4 KiB flipped in dense.safetensors (the issue's case: undetected, then read by eval as quantization
    loss) is refused when the engine opens, before any weight is loaded."""
    folder = copy(packed, tmp_path)
    flip(folder / "dense.safetensors", 3 * PART + 100, 4096)
    rc, out, err = run(capsys, folder, plan_file)
    assert rc == 2 and len(err) == 1 and out == "", err
    assert "dense.safetensors" in err[0] and f"checksum mismatch in bytes {3 * PART}..{4 * PART}" in err[0]
    rc = main(["eval", "--packed", str(folder), "--reference", str(FIXTURE), "--tokens", "32", "--chunk", "32",
               "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "dense.safetensors" in err[0] and "checksum mismatch" in err[0]
    from strata_plan.engine.config import ModelConfig
    from strata_plan.engine.eval import dequantized_model
    with pytest.raises(UserError, match="dense.safetensors.*checksum mismatch"):
        dequantized_model(folder, ModelConfig.load(folder), 32, torch.device("cpu"))


def test_a_pack_of_the_previous_index_version_asks_for_a_repack(packed, plan_file, tmp_path, capsys):
    folder = copy(packed, tmp_path)
    data = json.loads((folder / "index.json").read_text())
    (folder / "index.json").write_text(json.dumps({**data, "version": 3}))
    rc, out, err = run(capsys, folder, plan_file)
    assert rc == 2 and len(err) == 1 and "v3" in err[0] and f"--out {folder} --force" in err[0]


# ---- interrupted packs ------------------------------------------------------------------------------------------
def fail_blob_writes_after(monkeypatch, n: int, exc) -> None:
    """The n+1-th blob handed to the pack's writer raises `exc` (Ctrl-C, a full disk) in the packing thread."""
    from strata_plan.engine import files
    real, calls = files.BlobWriter.put, []

    def put(self, data):
        calls.append(1)
        if len(calls) > n:
            raise exc
        return real(self, data)
    monkeypatch.setattr(files.BlobWriter, "put", put)


def pack(out: Path, *extra: str) -> int:
    return main(["pack", str(FIXTURE), "--out", str(out), "--format", "bf16", "--device", "cpu", "--json", *extra])


def test_ctrl_c_during_pack_leaves_nothing(tmp_path, capsys, monkeypatch):
    fail_blob_writes_after(monkeypatch, 40, KeyboardInterrupt())        # in the second MoE layer
    assert pack(tmp_path / "new" / "packed") == 130
    assert "interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []          # no folder, no temporary one, not even the parent it made


def test_ctrl_c_or_a_full_disk_during_pack_force_leaves_the_old_pack_intact(packed, plan_file, tmp_path, capsys,
                                                                              monkeypatch):
    old = copy(packed, tmp_path)
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    inode = old.stat().st_ino
    fail_blob_writes_after(monkeypatch, 40, KeyboardInterrupt())
    assert pack(old, "--force") == 130
    monkeypatch.undo()
    fail_blob_writes_after(monkeypatch, 100, OSError(28, "No space left on device"))
    assert pack(old, "--force") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "No space left on device" in err[-1] and len([l for l in err if "error" in l]) == 1
    assert old.stat().st_ino == inode and {p.name: p.read_bytes() for p in old.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["copy"]            # no temporary folder beside it
    rc, out, err = run(capsys, old, plan_file)
    assert rc == 0, err


def test_pack_force_replaces_the_old_pack_whole_keeping_other_files(packed, tmp_path, capsys):
    old = copy(packed, tmp_path)
    (old / "notes.txt").write_text("mine\n")
    (old / "experts-layer009.bin").write_bytes(b"a stale blob of another pack")
    assert pack(old, "--force") == 0
    names = sorted(p.name for p in old.iterdir())
    assert "notes.txt" in names and "experts-layer009.bin" not in names and "index.json" in names
    assert (old / "notes.txt").read_text() == "mine\n"
    assert [p.name for p in tmp_path.iterdir()] == ["copy"]
    index = load_index(old)
    assert index.part_bytes == 1 << 20 and verify_all(index) == index.expert_bytes + index.dense_nbytes


def test_pack_into_a_mount_point_is_refused_before_the_work(tmp_path, capsys, monkeypatch):
    """The temporary folder goes beside the target: for a mount point that is another disk, and the rename into
    place cannot work, so the mount point is refused at once (a folder inside it is the fix)."""
    import os
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    real = os.stat

    def stat(p, *a, **k):                      # mnt on another device than its parent
        r = real(p, *a, **k)
        return os.stat_result((*r[:2], r.st_dev + 1, *r[3:10])) if Path(p) == mnt else r
    monkeypatch.setattr(os, "stat", stat)
    assert pack(mnt) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mount point" in err[0] and str(mnt / "packed") in err[0]
    assert list(tmp_path.iterdir()) == [mnt] and not any(mnt.iterdir())


# ---- plans edited to wrong values ---------------------------------------------------------------------------------
@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(top_k=8), "top_k"),
    (lambda d: d.update(model="mixtral-8x7b"), "model"),
    (lambda d: d["memory"]["vram"].update(dense_resident=-5), "memory.vram.dense_resident"),
    (lambda d: d["memory"]["ram"].update(embeddings=-1), "memory.ram.embeddings"),
])
def test_a_plan_edited_to_wrong_values_is_refused_in_one_line(packed, plan_file, tmp_path, capsys, edit, field):
    data = yaml.safe_load(plan_file.read_text())
    edit(data)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, out, err = run(capsys, packed, path)
    assert rc == 2 and len(err) == 1 and out == "", err
    assert f"{path}: {field}:" in err[0] and "fix:" in err[0]


def test_a_packed_config_edited_after_packing_is_refused(packed, plan_file, tmp_path, capsys):
    folder = copy(packed, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_experts_per_tok": 8}))
    rc, out, err = run(capsys, folder, plan_file)
    assert rc == 2 and len(err) == 1 and out == "", err
    assert "config.json" in err[0]
