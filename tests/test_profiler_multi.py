"""The profiler on a machine with several GPUs, mocked on the CPU: every GPU measured, the links between them
and the host turned into the profile's topology (shared root complex from sysfs or inferred, the peer kind
and its slowest pair), and a two-GPU profile written end to end that the planner plans over both GPUs."""
from __future__ import annotations

import json

import pytest

from strata_plan.cli import main
from strata_plan.profiler import gpu as gpu_mod
from strata_plan.profiler import multi, run
from strata_plan.profiler.timing import MiB, Stats
from strata_plan.profiles.schema import load_profile

from test_profiler_cli import TINY


def links(ports=("pci0000:00/0000:00:01.1", "pci0000:00/0000:00:03.1"), peer=None, nvlink=False,
          alone=(25.0, 24.0), together=48.0):
    peer = peer if peer is not None else {}
    return multi.LinkResult(256 * MiB, {g: Stats((v, v)) for g, v in enumerate(alone)}, Stats((together, together)),
                            {k: Stats((v, v)) for k, v in peer.items()}, {k: nvlink for k in peer},
                            dict(enumerate(ports)))


def test_root_port_from_sysfs_paths():
    assert multi.root_port("/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0") == "pci0000:00/0000:00:01.1"
    assert multi.root_port("/sys/devices/pci0000:40/0000:40:03.1/0000:41:00.0/0000:42:00.0") == "pci0000:40/0000:40:03.1"
    assert multi.root_port("/sys/devices/platform/foo") is None


def test_topology_from_measured_links():
    t = multi.topology_from(links())
    assert t.peer.kind == "none" and not t.host_links.shared_root_complex
    assert t.host_links.provenance == "measured" and t.host_links.concurrent_h2d_gbps.value == 48.0
    same = multi.topology_from(links(ports=("pci0000:00/0000:00:01.1",) * 2, together=25.0))
    assert same.host_links.shared_root_complex and "sysfs" in same.host_links.source
    inferred = multi.topology_from(links(ports=(None, None), together=30.0))     # 30 < 0.8 x 49
    assert inferred.host_links.shared_root_complex and "inferred" in inferred.host_links.source
    assert not multi.topology_from(links(ports=(None, None), together=45.0)).host_links.shared_root_complex
    pcie = multi.topology_from(links(peer={(0, 1): 41.0, (1, 0): 39.5}))
    assert pcie.peer.kind == "pcie" and pcie.peer.gbps.value == 39.5 and "1->0 39.5" in pcie.peer.gbps.source
    assert multi.topology_from(links(peer={(0, 1): 380.0, (1, 0): 379.0}, nvlink=True)).peer.kind == "nvlink"


def fake_gpu(index: int, h2d: float):
    st = lambda v: Stats((v, v))  # noqa: E731
    curve = {z: st(h2d * (0.8 if z < MiB else 1.0)) for z in (256 << 10, MiB)}
    ident = gpu_mod.Identity(f"NVIDIA Fake GPU {index}", 24 * 10**9, 23 * 10**9, "999.0", 4, 8, 1, 4, 16, "mock")
    return gpu_mod.GpuResult(ident, st(1000.0), st(1800.0), st(150.0),
                             {k: dict(curve) for k in ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable",
                                                       "h2d_during_kernel")}, None, {})


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine whose torch sees two GPUs: every GPU measurement and the link measurement are mocked."""
    measured = []

    def measure_gpu(settings, pin_cap, step, index=0):
        for name in gpu_mod.PHASES:
            step(name)
        measured.append((index, pin_cap))
        return fake_gpu(index, 12.5 + index)
    monkeypatch.setattr(run, "QUICK", TINY)
    monkeypatch.setattr(run, "_gpu_available", lambda: True)
    monkeypatch.setattr(gpu_mod, "device_count", lambda: 2)
    monkeypatch.setattr(gpu_mod, "measure_gpu", measure_gpu)
    monkeypatch.setattr(multi, "measure_links", lambda n, size, repeats, tick: links(
        ports=("pci0000:00/0000:00:01.1",) * 2, alone=(12.5, 13.5), together=24.0))
    monkeypatch.setattr("torch.cuda.get_device_name", lambda i=0: "NVIDIA Fake GPU 0")
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    return measured


def test_two_gpu_machine_end_to_end(capsys, tmp_path, two_gpus):
    out = tmp_path / "two.yaml"
    assert main(["profile", "--quick", "--nvme-dir", str(tmp_path), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert two_gpus == [(0, two_gpus[0][1]), (1, 0)]             # both GPUs measured; only the first pins RAM
    assert report["stats"]["h2d_all_gpus_at_once_gbps"]["median"] == 24.0 and "h2d_alone_gpu1_gbps" in report["stats"]
    p = load_profile(str(out))
    assert p.n_gpus == 2 and [g.name for g in p.gpus] == ["NVIDIA Fake GPU 0", "NVIDIA Fake GPU 1"]
    assert p.gpus[1].h2d_pinned.at(MiB) == pytest.approx(13.5)
    assert p.topology.host_links.shared_root_complex and p.peer.kind == "none"
    assert p.name == "fake-gpu-0-x2"
    from strata_plan.planner.capacity import Budget
    assert Budget.from_profile(p, gpus=2).gpus == (24 * 10**9, 24 * 10**9)
