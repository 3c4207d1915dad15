"""Hardware profiles: the shipped rigs load; bad YAML of every kind gets one line and exit code 2."""
from __future__ import annotations

import pytest
import yaml

from strata_plan.errors import UserError
from strata_plan.profiles.schema import (Curve, HardwareProfile, Surface, load_profile, save_profile, shipped_profiles)
from strata_plan.schema import to_data

SEED_ROWS = {"rtx-4090": 24, "rtx-5090": 32, "a100-80g": 80, "rtx-pro-6000": 96, "h100-80g": 80}


@pytest.mark.parametrize("name", sorted(SEED_ROWS))
def test_shipped_profiles_load_with_provenance(name):
    p = load_profile(name)
    assert p.gpu.vram_gb.value == SEED_ROWS[name]
    assert p.gpu.h2d_pinned.source and p.host.ram_gb.source
    for fig in (p.gpu.vram_gb, p.gpu.hbm_gbps, p.host.ram_gbps, p.host.pinnable_gb):
        assert fig.provenance in ("measured", "datasheet", "estimate")
    assert 0 < p.nvme[0].rand_read.at(16 << 20, 8) < 20


def test_seed_rows_are_shipped():
    assert set(SEED_ROWS) <= set(shipped_profiles())


def test_round_trip(tmp_path):
    p = load_profile("rtx-4090")
    out = save_profile(p, tmp_path / "p.yaml")
    assert load_profile(str(out)) == p
    assert list(tmp_path.iterdir()) == [out]            # no temporary file left behind


def test_curve_interpolates_in_log_size_and_clamps():
    c = Curve(((1 << 20, 10.0), (1 << 22, 20.0)), "estimate", "test")
    assert c.at(1 << 21) == pytest.approx(15.0)
    assert c.at(1 << 30) == 20.0


def test_a_scaled_surface_reads_every_rate_times_the_factor():
    s = Surface(((131072, 1, 1.3), (131072, 8, 2.05), (1048576, 1, 1.9), (1048576, 8, 2.2)), "measured", "t", "d")
    half = s.scaled(0.5)
    assert half.at(300000, 8) == pytest.approx(s.at(300000, 8) / 2) and half.source == s.source


def test_below_the_first_point_a_transfer_takes_latency_plus_size_over_bandwidth():
    """Times (size / rate) of 1 MiB at 10 GB/s and 4 MiB at 20: 0.1 and 0.2 MiB-ns, a line of slope 1/30 ns a byte,
    so half a MiB takes 0.1 - 0.5/30 = 1/12 MiB-ns: 6 GB/s (all latency would be 5, all bandwidth 10)."""
    c = Curve(((1 << 20, 10.0), (1 << 22, 20.0)), "estimate", "test")
    assert c.at(1 << 19) == pytest.approx(6.0) and c.at(1 << 20) == pytest.approx(10.0)
    flat = Curve(((1 << 20, 10.0), (1 << 22, 10.0)), "estimate", "test")      # no latency: the first rate
    assert flat.at(1 << 12) == pytest.approx(10.0)
    faster = Curve(((1 << 20, 10.0), (1 << 21, 25.0)), "estimate", "test")   # 2 MiB in less time: all latency
    assert faster.at(1 << 19) == pytest.approx(5.0)
    assert Curve(((1 << 20, 10.0),), "estimate", "test").at(1 << 19) == pytest.approx(5.0)   # one point: latency


def _write(tmp_path, data, text=None):
    f = tmp_path / "bad.yaml"
    f.write_text(text if text is not None else yaml.safe_dump(data))
    return str(f)


def _good():
    return to_data(load_profile("rtx-4090"))


def _set(root, path, value):
    keys, d = path.split("."), root
    for k in keys[:-1]:
        d = d[int(k)] if k.isdigit() else d[k]
    d[keys[-1]] = value
    return root


@pytest.mark.parametrize("path,value,field", [
    ("gpus.0.vram_gb.value", -24, "gpus[0].vram_gb.value"),
    ("gpus.0.vram_gb.value", 1e9, "gpus[0].vram_gb.value"),
    ("gpus.0.vram_gb.value", "24GB", "gpus[0].vram_gb.value"),
    ("gpus.0.hbm_gbps.provenance", "guess", "gpus[0].hbm_gbps.provenance"),
    ("host.ram_gb.value", True, "host.ram_gb.value"),
    ("host.bogus", 1, "host.bogus"),
    ("version", 99, ""),
    ("gpus.0.h2d_pinned.points", [[1024, 10], [512, 10]], "gpus[0].h2d_pinned"),
    ("host.pinnable_gb.value", 500.0, "host"),
])
def test_bad_fields_are_refused_with_file_field_and_fix(tmp_path, path, value, field):
    f = _write(tmp_path, _set(_good(), path, value))
    with pytest.raises(UserError) as e:
        load_profile(f)
    assert e.value.where == f and e.value.fix
    if field:
        assert e.value.field == field


def test_measured_without_date_is_refused(tmp_path):
    d = _set(_good(), "gpus.0.vram_gb.provenance", "measured")
    with pytest.raises(UserError, match="date"):
        load_profile(_write(tmp_path, d))


def test_missing_field(tmp_path):
    d = _good()
    del d["host"]["ram_gb"]
    with pytest.raises(UserError) as e:
        load_profile(_write(tmp_path, d))
    assert e.value.field == "host.ram_gb" and "missing" in e.value.problem


@pytest.mark.parametrize("text", [
    "schema: [unclosed",
    "!!python/object/apply:os.system ['echo pwned']",
    "- just\n- a list\n",
    "",
    "schema: strata-plan/hardware-profile\nversion: 1\n",
])
def test_malformed_and_hostile_yaml(tmp_path, text):
    with pytest.raises(UserError):
        load_profile(_write(tmp_path, None, text))


def test_cli_prints_one_line_and_exits_2(tmp_path, cli):
    f = _write(tmp_path, _set(_good(), "gpus.0.vram_gb.value", -1))
    r = cli("profiles", f)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "vram_gb" in lines[0] and "fix:" in lines[0] and "Traceback" not in r.stderr
    r = cli("profiles", "no-such-rig")
    assert r.returncode == 2 and "rtx-4090" in r.stderr


def test_with_gpu_keeps_the_host():
    host = load_profile("a100-80g")
    combined = host.with_gpu(load_profile("rtx-4090").gpu)
    assert combined.host == host.host and combined.gpu.vram_gb.value == 24
    assert isinstance(combined, HardwareProfile)
