"""Write the shipped two-GPU profiles (the seed table's two-GPU rows) from sourced figures.

Sources are the tags of ../shared/reference/hardware-specs.md (its section 7). As in
make_shipped_profiles.py, a figure someone measured on another machine is marked `estimate` here, with the
measurement named in the source. Run: python scripts/make_multi_gpu_profiles.py

Seed rows (../shared/seeds/000_*.txt):
  * "2x RTX 3090 / 4090 (48 GB) + 192 GB DDR5 + Gen5 NVMe": 7.5-9 tok/s decode claimed -> rtx-4090-x2
  * "2x PRO 6000 / 2x H100 (192 GB) + 512 GB DDR5": 18-22 tok/s decode claimed -> rtx-pro-6000-x2, h100-nvl-x2.
    192 GB is 2 x 96 GB (PRO 6000); two H100 reach it only as H100 NVL (2 x 94 GB = 188 GB; 2 x 80 GB SXM or
    PCIe is 160 GB, hardware-specs R5), so the H100 row is the NVL: a PCIe card whose pairs join over an
    NVLink bridge.
"""
from __future__ import annotations

import dataclasses

from make_shipped_profiles import MiB, OUT, ds, est, nvme_gen4, pinned, scaled_curve  # noqa: E402

from strata_plan.profiles.schema import (CPU, NVMe, Figure, HardwareProfile, Host, HostLinks,  # noqa: E402
                                         PeerLink, SCHEMA_NAME, SCHEMA_VERSION, Surface, Topology,
                                         default_calibration, load_profile, save_profile)


def nvme_gen5():
    """A Gen5 drive of the 9100 PRO / SN8100 class: the Gen4 surface's shape scaled to 8.8 GB/s at 16 MiB QD8."""
    src = ("[S26c][S27] colibri iobench, 19 MB O_DIRECT random reads, 8 threads: 8.05 / 8.71 / 8.81 / 10.51 / "
           "11.48 GB/s on Samsung 9100 PRO (median 8.81); the Gen4 surface's shape over block and queue depth "
           "scaled by 8.8 / 6.0 (estimate)")
    g4 = nvme_gen4()
    f = 8.8 / 6.0
    pts = tuple((b, q, round(v * f, 2)) for b, q, v in g4.rand_read.points)
    seq = ((1 * MiB, 32, 12.4), (16 * MiB, 32, 12.4))
    return NVMe("Gen5 NVMe (Samsung 9100 PRO class)", est(2000, "typical 2 TB drive (estimate)"),
                Surface(pts, "estimate", src),
                Surface(seq, "estimate", "Crucial T700 spec 12.4 GB/s sequential [S29] (estimate for the class)"))


def server_host():
    return Host(ram_gb=ds(512, "seed table row: 512 GB DDR5"),
                ram_gbps=est(487, "[S19] STREAM Triad 486.7 GB/s on a 2-socket Sapphire Rapids H100 node "
                             "(8 channels x 2 sockets DDR5-4800; third-party measurement)"),
                pinnable_gb=est(435, "85% of RAM (estimate)"))


def server_cpu():
    return CPU("2-socket server CPU (unspecified)", est(64, "typical 2-socket server (estimate)"))


def two(name, description, gpu, host, nvme, cpu, topology):
    return HardwareProfile(SCHEMA_NAME, SCHEMA_VERSION, name, (gpu, gpu), host, (nvme,), cpu, default_calibration(),
                           description, topology=topology)


def profiles() -> list[HardwareProfile]:
    out = []
    # ---- 2x RTX 4090, x8/x8 on a consumer board, no P2P, 192 GB DDR5, Gen5 NVMe ----------------------
    one = load_profile("rtx-4090").gpu
    x8 = 12.5 / 23.9            # Gen4 x8: ~12-13 GB/s H2D estimated (hardware-specs 2, caveats)
    g4090 = dataclasses.replace(
        one, pcie_width=ds(8, "x8/x8: two GPUs on a consumer board split the CPU's 16 lanes [S23]"),
        h2d_pinned=scaled_curve(one.h2d_pinned, x8, "Gen4 x8 of an x8/x8 board: ~12-13 GB/s estimated "
                                "(hardware-specs 2); the x16 shmoo [S14] scaled to 12.5 GB/s"),
        h2d_pageable=scaled_curve(one.h2d_pageable, x8, "the x16 pageable curve [S14] scaled as pinned (estimate)"),
        d2h_pinned=scaled_curve(one.d2h_pinned, x8, "the x16 D2H [S13] scaled to x8 (estimate)"))
    out.append(two(
        "rtx-4090-x2", "Seed row 2: 2x RTX 4090 (2 x 24 GB, x8/x8, no P2P) + 192 GB DDR5 + Gen5 NVMe", g4090,
        Host(ds(192, "seed table row: 192 GB DDR5"),
             est(62, "2 DIMMs per channel lower the rate: 55-70 GB/s estimated (hardware-specs R2)"),
             est(163, "85% of RAM (estimate)")),
        nvme_gen5(), CPU("desktop CPU (unspecified)", est(16, "typical desktop (estimate)")),
        Topology(PeerLink("none"),
                 HostLinks(True, est(23.9, "both x8 links are halves of the CPU's x16 lanes: together at most one "
                                     "Gen4 x16 link, 23.9 GB/s [S14] (estimate)"),
                           "estimate", "x8/x8 bifurcation of the CPU's 16 lanes on a consumer board [S23] "
                           "(assumed: one root complex)"))))
    # ---- 2x RTX PRO 6000 Blackwell, x16 each, PCIe P2P, 512 GB DDR5 -----------------------------------
    pro = load_profile("rtx-pro-6000").gpu
    out.append(two(
        "rtx-pro-6000-x2", "Seed row 5: 2x RTX PRO 6000 Blackwell (2 x 96 GB, x16 each, PCIe P2P, no NVLink) "
        "+ 512 GB DDR5", pro, server_host(), nvme_gen4("Gen4 NVMe (the row names none; 990 PRO class assumed)"),
        server_cpu(),
        Topology(PeerLink("pcie", est(45, "PCIe P2P supported, no NVLink [S10][S12]; unmeasured: ~85% of the "
                                      "53 GB/s Gen5 x16 H2D estimate (estimate)")),
                 HostLinks(False, est(106, "two Gen5 x16 links at 53 GB/s each (hardware-specs R4/R5), "
                                      "below the 487 GB/s of RAM (estimate)"),
                           "estimate", "server: each GPU on its own x16 root port (assumed; the row does not say)"))))
    # ---- 2x H100 NVL 94 GB (PCIe Gen5 x16 each, NVLink bridge), 512 GB DDR5 -------------------------------
    h = load_profile("h100-80g").gpu
    nvl = dataclasses.replace(
        h, name="NVIDIA H100 NVL",
        vram_gb=ds(94, "[S1c] H100 NVL: 94 GB HBM3 a card (2 x 94 = 188 GB, the seed's '192 GB')"),
        hbm_gbps=ds(3900, "NVIDIA H100 NVL datasheet: 3.9 TB/s (not in hardware-specs.md)"),
        bf16_tflops=ds(835, "NVIDIA H100 NVL datasheet: BF16 1,671 TFLOPS with sparsity, 835 dense "
                       "(not in hardware-specs.md)"),
        h2d_pinned=pinned(54.8, "PCIe Gen5 x16 like the H100 SXM's 54.8 GB/s [S19] (estimate for the PCIe card)"),
        h2d_pageable=scaled_curve(h.h2d_pageable, 1.0, "as h100-80g (estimate)"),
        d2h_pinned=pinned(46.8, "as the H100 SXM's D2H 46.8 GB/s [S19] (estimate)"))
    out.append(two(
        "h100-nvl-x2", "Seed row 5: 2x H100 NVL (2 x 94 GB, PCIe Gen5 x16 each, NVLink bridge) + 512 GB DDR5", nvl,
        server_host(), nvme_gen4("Gen4 NVMe (the row names none; 990 PRO class assumed)"), server_cpu(),
        Topology(PeerLink("nvlink", ds(300, "NVLink bridge 600 GB/s bidirectional, 300 one way (NVIDIA H100 NVL "
                                       "datasheet); an SXM pair measured 380 one way [S24]"),
                          Figure(5.0, "estimate", "a small NVLink copy, ~5 us assumed; unmeasured")),
                 HostLinks(False, est(109.6, "two Gen5 x16 links at 54.8 GB/s [S19] (estimate)"),
                           "estimate", "server: each GPU on its own x16 root port (assumed; the row does not say)"))))
    return out


def main() -> None:
    for p in profiles():
        save_profile(p, OUT / f"{p.name}.yaml")
        print("wrote", OUT / f"{p.name}.yaml")


if __name__ == "__main__":
    main()
