"""Profiles with several GPUs: the seed's two-GPU rows load with their topology; one-GPU profiles are as before."""
from __future__ import annotations

import pytest
import yaml

from strata_plan.errors import UserError
from strata_plan.profiles.schema import PROFILES_DIR, load_profile, shipped_profiles
from strata_plan.schema import to_data
from strata_plan.yamlio import read_yaml

TWO_GPU_ROWS = {"rtx-4090-x2": (24, 8, "none", True), "rtx-pro-6000-x2": (96, 16, "pcie", False),
                "h100-nvl-x2": (94, 16, "nvlink", False)}


@pytest.mark.parametrize("name", sorted(TWO_GPU_ROWS))
def test_two_gpu_rows_load_with_topology(name):
    vram, lanes, peer, shared = TWO_GPU_ROWS[name]
    p = load_profile(name)
    assert p.n_gpus == 2 and all(g.vram_gb.value == vram and g.pcie_width.value == lanes for g in p.gpus)
    assert p.peer.kind == peer and p.topology.host_links.shared_root_complex is shared
    assert (p.peer.gbps is None) == (peer == "none")
    assert p.topology.host_links.source and p.topology.host_links.concurrent_h2d_gbps.source
    assert p.gpu.vram_gb.source and p.host.ram_gb.source


def test_x8_links_carry_half_the_x16_rate():
    x16, x8 = load_profile("rtx-4090").gpu, load_profile("rtx-4090-x2").gpu
    assert x8.h2d_pinned.at(16 << 20) == pytest.approx(x16.h2d_pinned.at(16 << 20) * 12.5 / 23.9, rel=0.01)
    assert load_profile("rtx-4090-x2").concurrent_h2d().value < 2 * x8.h2d_pinned.at(1 << 30)   # one root complex


@pytest.mark.parametrize("name", [n for n in shipped_profiles() if n not in TWO_GPU_ROWS])
def test_one_gpu_profiles_unchanged(name):
    """A one-GPU profile has no topology, writes back exactly the YAML it was read from, and `peer` says none."""
    p = load_profile(name)
    assert p.topology is None and p.peer.kind == "none"
    assert to_data(p) == read_yaml(PROFILES_DIR / f"{name}.yaml")


def _write(tmp_path, data):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(data))
    return str(f)


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.update(gpus=d["gpus"][:1]), "(top level)"),                       # topology with one GPU
    (lambda d: d["topology"]["peer"].pop("gbps"), "topology.peer"),                # pcie without a rate
    (lambda d: d["topology"]["peer"].update(kind="bridge"), "topology.peer.kind"),
    (lambda d: d["topology"]["host_links"].update(source=""), "topology.host_links"),
])
def test_bad_topology_is_one_line(tmp_path, edit, field):
    d = to_data(load_profile("rtx-pro-6000-x2"))
    edit(d)
    with pytest.raises(UserError) as e:
        load_profile(_write(tmp_path, d))
    assert e.value.field == field and e.value.fix


def test_gpu_preset_and_first_gpus_drop_the_topology():
    p = load_profile("h100-nvl-x2")
    assert p.with_gpu(p.gpu).topology is None and p.first_gpus(1).topology is None
    assert p.first_gpus(2) is p
