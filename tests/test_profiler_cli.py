"""`strata-plan profile`: bad arguments (one line, exit 2) and a tiny host-only run end to end."""
import json
import os

import pytest

from strata_plan import __version__
from strata_plan.cli import main
from strata_plan.profiler import nvme, run
from strata_plan.profiler.timing import MiB, today
from strata_plan.profiles.schema import load_profile

TINY = run.Preset("tiny", 8 * MiB, 2, 0.0625, 0.0625,
                  nvme.DiskSettings((MiB,), (1, 2), (MiB,), (1,), 0.03, 2),
                  (256 << 10, MiB), (MiB,), 2, 4 * MiB, 8, 16 * MiB)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("value", ["-1", "0", "abc", "nan", "inf"])
def test_max_gib_must_be_positive(capsys, tmp_path, value):
    with pytest.raises(SystemExit) as e:
        main(["profile", "--nvme-dir", str(tmp_path), f"--max-gib={value}"])
    assert e.value.code == 2
    assert "--max-gib" in one_line_error(capsys)


def test_pin_cap_must_be_positive(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["profile", "--nvme-dir", str(tmp_path), "--pin-cap-gib=-3"])
    assert e.value.code == 2 and "--pin-cap-gib" in one_line_error(capsys)


def test_missing_nvme_dir(capsys, tmp_path):
    assert main(["profile", "--nvme-dir", str(tmp_path / "missing")]) == 2
    err = one_line_error(capsys)
    assert "--nvme-dir" in err and "does not exist" in err and "fix:" in err


def test_read_only_nvme_dir(capsys, tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr(nvme.tempfile, "mkstemp", refuse)
    assert main(["profile", "--nvme-dir", str(tmp_path)]) == 2
    assert "not writable" in one_line_error(capsys)


def test_out_folder_missing(capsys, tmp_path):
    assert main(["profile", "--nvme-dir", str(tmp_path), "--out", str(tmp_path / "no" / "p.yaml")]) == 2
    assert "--out" in one_line_error(capsys)


@pytest.fixture
def tiny_host_only(monkeypatch):
    monkeypatch.setattr(run, "QUICK", TINY)
    monkeypatch.setattr(run, "_gpu_available", lambda: False)


def test_host_only_profile_end_to_end(capsys, tmp_path, tiny_host_only):
    out = tmp_path / "me.yaml"
    assert main(["profile", "--quick", "--nvme-dir", str(tmp_path), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpu_found"] is False and any("no GPU found" in n for n in report["notes"])
    assert [p.name for p in tmp_path.iterdir()] == ["me.yaml"]          # the test file is gone

    p = load_profile(str(out))
    assert p.gpus == () and p.strata_plan_version == __version__ and p.created == today()
    for fig in (p.host.ram_gb, p.host.ram_gbps, p.host.available_gb, p.nvme[0].capacity_gb, p.cpu.cores):
        assert fig.provenance == "measured" and fig.date == today() and __version__ in fig.source
    assert p.host.pinnable_gb.provenance == "estimate"                  # nothing to pin with, and it says so
    rr = p.nvme[0].rand_read
    assert rr.provenance == "measured" and rr.queue_depths == (1, 2) and rr.at(MiB, 2) > 0
    assert p.nvme[0].path == str(tmp_path.resolve())
    st = report["stats"]["disk_rand_1MiB_qd2_gbps"]
    assert st["repeats"] == 2 and st["median"] == pytest.approx(rr.at(MiB, 2), rel=1e-3)

    combined = p.with_gpu(load_profile("h100-80g").gpu)                 # what plan --gpu-preset does
    assert combined.gpu.name.startswith("NVIDIA H100") and combined.host == p.host


def test_max_gib_clamped_with_warning(capsys, tmp_path, tiny_host_only, monkeypatch):
    free = 200 * MiB
    monkeypatch.setattr(nvme.psutil, "disk_usage", lambda p: type("U", (), {"free": free, "total": free})())
    out = tmp_path / "p.yaml"
    assert main(["profile", "--quick", "--nvme-dir", str(tmp_path), "--max-gib", "50", "--out", str(out),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any("clamped" in n for n in report["notes"])
    assert "0.12 GiB test file" in load_profile(str(out)).nvme[0].rand_read.source


def test_default_out_is_named_after_the_machine(capsys, tmp_path, tiny_host_only, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["profile", "--quick", "--nvme-dir", ".", "--name", "laptop"]) == 0
    assert (tmp_path / "laptop.yaml").exists()
    assert "laptop.yaml" in capsys.readouterr().out
    assert os.listdir(tmp_path) == ["laptop.yaml"]


def test_help_lists_the_flags(cli):
    r = cli("profile", "--help")
    assert r.returncode == 0
    for flag in ("--quick", "--nvme-dir", "--max-gib", "--pin-cap-gib", "--out", "--json"):
        assert flag in r.stdout


def test_progress_reports_phases_in_order_up_to_done(tmp_path, tiny_host_only):
    seen = []
    run.profile_machine(run.Options(quick=True, nvme_dir=tmp_path), show_progress=False,
                        on_progress=lambda phase, frac: seen.append((phase, frac)))
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and 0 <= fractions[0] and seen[-1] == ("done", 1.0)
    phases = list(dict.fromkeys(p for p, _ in seen))
    assert phases == ["host RAM copy", *nvme.PHASES, "done"]
