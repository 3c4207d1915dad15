"""Write the shipped hardware profiles (strata_plan/profiles/*.yaml) from sourced figures.

Sources are the tags of ../shared/reference/hardware-specs.md (its section 7 lists them). Figures that
someone measured on another machine are marked `estimate` here (we did not measure them), with the
measurement named in the source. Run: python scripts/make_shipped_profiles.py
"""
from __future__ import annotations

from pathlib import Path

from strata_plan.profiles.schema import (CPU, GPU, NVMe, Curve, Figure, HardwareProfile, Host, SCHEMA_NAME,
                                         SCHEMA_VERSION, Surface, default_calibration, save_profile)

MiB = 1 << 20
OUT = Path(__file__).resolve().parents[1] / "profiles"


def ds(v, src):
    return Figure(float(v), "datasheet", src)


def est(v, src):
    return Figure(float(v), "estimate", src)


def curve(points_mib, src):
    return Curve(tuple((int(s * MiB), float(v)) for s, v in points_mib), "estimate", src)


def scaled_curve(c: Curve, factor, src):
    return Curve(tuple((s, round(v * factor, 2)) for s, v in c.points), "estimate", src)


# Shape of pinned H2D over transfer size, as a fraction of the plateau (from the RTX 4090 shmoo [S14]:
# 22.5 / 23.6 / 23.9 / 23.9 at 1 / 4 / 16 / 64 MiB) and the A100 bandwidthTest [S17] (0.2-1 GB plateau).
SHAPE = ((0.25, 0.80), (1, 0.93), (4, 0.975), (16, 0.99), (64, 1.0), (256, 1.0), (1024, 0.98))


def pinned(plateau, src):
    return curve([(s, round(plateau * f, 2)) for s, f in SHAPE],
                 f"{src}; curve shape below the plateau from the RTX 4090 shmoo [S14] (estimate)")


def nvme_gen4(name="Gen4 NVMe (Samsung 990 PRO class)"):
    src = ("[S26c] colibri iobench, 19 MB O_DIRECT random reads, 8 threads: 5.87-6.70 GB/s on 990 PRO; "
           "QD1 and small-block points estimated from [S28] (Phison E27T: 1.06 GB/s at QD1)")
    pts = ((1 * MiB, 1, 1.0), (4 * MiB, 1, 2.0), (16 * MiB, 1, 2.8), (1 * MiB, 8, 4.5), (4 * MiB, 8, 5.6),
           (16 * MiB, 8, 6.0), (32 * MiB, 8, 6.0), (4 * MiB, 32, 6.0), (16 * MiB, 32, 6.2))
    seq = ((1 * MiB, 32, 7.0), (16 * MiB, 32, 7.0))
    return NVMe(name, est(2000, "typical 2 TB drive (estimate)"), Surface(pts, "estimate", src),
                Surface(seq, "estimate", "990 PRO spec 7.45 GB/s sequential; ~94% reached with fio (estimate)"))


def desktop_host(ram_gb=128):
    return Host(ram_gb=ds(ram_gb, "seed table row: 128 GB DDR5"),
                ram_gbps=est(63, "[S16] i9-14900KF 2x48 GB DDR5-4800, all-core memcpy 63 GB/s (read+write)"),
                pinnable_gb=est(round(ram_gb * 0.85), "85% of RAM: leave room for the OS and page cache (estimate)"))


def profile(name, description, gpu, host, nvme, cpu):
    return HardwareProfile(SCHEMA_NAME, SCHEMA_VERSION, name, (gpu,), host, (nvme,), cpu, default_calibration(),
                           description)


def main() -> None:
    profiles = []
    # ---- RTX 4090 + 128 GB DDR5 + Gen4 NVMe (seed row 1) -------------------------------------------
    p4090 = curve([(1, 22.5), (4, 23.6), (16, 23.9), (64, 23.9), (256, 23.9)],
                  "[S14] RTX 4090 Gen4 x16 pinned H2D shmoo (third-party measurement)")
    profiles.append(profile(
        "rtx-4090", "Seed row 1: 1x RTX 4090 (24 GB) + 128 GB DDR5 + Gen4 NVMe",
        GPU("NVIDIA GeForce RTX 4090", ds(24, "[S6]"), ds(1008, "[S6]"), ds(165.2, "[S6][S9b] FP32 accumulate"),
            ds(4, "[S6] PCIe Gen4"), ds(16, "[S6] x16"), p4090,
            curve([(1, 13.7), (4, 17.1), (16, 18.4), (64, 12.9)], "[S14] RTX 4090 pageable H2D (third-party measurement)"),
            curve([(4, 26.3), (64, 26.7)], "[S13] nvbandwidth CE D2H 26.3-27.1 GB/s on 8 cards (third-party)"),
            p2p_gbps=None),
        desktop_host(), nvme_gen4(), CPU("desktop CPU (unspecified)", est(16, "typical desktop (estimate)"))))
    # ---- RTX 5090 + 128 GB DDR5 + Gen4 NVMe (seed row 1) -------------------------------------------
    h5090 = pinned(56.3, "[S15] RTX 5090 Gen5 x16 nvbandwidth CE H2D 56.3 GB/s (third-party measurement)")
    profiles.append(profile(
        "rtx-5090", "Seed row 1: 1x RTX 5090 (32 GB) + 128 GB DDR5 + Gen4 NVMe",
        GPU("NVIDIA GeForce RTX 5090", ds(32, "[S7]"), ds(1792, "[S7]"), ds(209.5, "[S7b]"),
            ds(5, "[S7] PCIe Gen5"), ds(16, "[S7] x16"), h5090,
            scaled_curve(h5090, 0.6, "pageable ~55-75% of pinned as on the 4090 [S14]; 60% assumed"),
            pinned(57.3, "[S15] nvbandwidth CE D2H 57.3 GB/s (third-party)")),
        desktop_host(), nvme_gen4(), CPU("desktop CPU (unspecified)", est(16, "typical desktop (estimate)"))))
    # ---- A100 80 GB + 160 GB RAM + Gen4 NVMe (seed row 3) -------------------------------------------
    a100 = curve([(1, 20.0), (4, 23.0), (16, 24.1), (96, 24.1), (256, 25.8), (1024, 26.2)],
                 "[S17] A100 bandwidthTest: 24.1 GB/s at 100 MB, 25.8-26.2 at 0.2-1 GB (third-party); <=16 MiB estimated")
    profiles.append(profile(
        "a100-80g", "Seed row 3: 1x A100 80 GB (SXM4) + 160 GB RAM + Gen4 NVMe",
        GPU("NVIDIA A100-SXM4-80GB", ds(80, "[S3]"), ds(2039, "[S3][S4] SXM4"), ds(312, "[S3]"),
            ds(4, "PCIe Gen4"), ds(16, "x16"), a100,
            curve([(16, 10.0), (256, 10.0)], "DGX A100 bandwidthTest pageable 10.0 GB/s (kernels-and-measurement 1.4, third-party)"),
            curve([(16, 25.8), (256, 25.8)], "DGX A100 bandwidthTest D2H 25.8 GB/s (third-party)"),
            p2p_gbps=None),
        Host(ds(160, "seed table row: 160 GB RAM"), est(100, "cloud VM slice, unknown; 100 GB/s estimated (hardware-specs R3)"),
             est(136, "85% of RAM (estimate)")),
        nvme_gen4("Gen4 NVMe (cloud local SSD, assumed 990 PRO class)"),
        CPU("server CPU (unspecified)", est(32, "typical A100 VM slice (estimate)"))))
    # ---- H100 80 GB SXM + 160 GB RAM + Gen4 NVMe (seed row 3) ---------------------------------------
    h100 = pinned(54.8, "[S19] H100 SXM5 Gen5 H2D 54.8 GB/s (third-party measurement)")
    profiles.append(profile(
        "h100-80g", "Seed row 3: 1x H100 80 GB (SXM5) + 160 GB RAM + Gen4 NVMe",
        GPU("NVIDIA H100 80GB HBM3", ds(80, "[S1]"), ds(3350, "[S1] SXM5"), ds(989, "[S1][S2]"),
            ds(5, "PCIe Gen5"), ds(16, "x16"), h100,
            scaled_curve(h100, 0.4, "pageable ~40% of pinned (DGX A100 10.0 vs 25.7, kernels-and-measurement 1.10)"),
            pinned(46.8, "[S19] D2H 46.8 GB/s (third-party)")),
        Host(ds(160, "seed table row: 160 GB RAM"), est(100, "unknown; 100 GB/s estimated"), est(136, "85% of RAM (estimate)")),
        nvme_gen4("Gen4 NVMe (assumed 990 PRO class)"),
        CPU("server CPU (unspecified)", est(32, "typical VM slice (estimate)"))))
    # ---- RTX PRO 6000 Blackwell + 176 GB (Colab G4, the seed's tested row) -----------------------------
    pro = pinned(53.0, "Gen5 x16, unmeasured: UCX assumes 50 GB/s [S12]; 53 GB/s estimated (hardware-specs R4)")
    tit = ("[S11] GCP Titanium SSD limit for g4-standard-48: 2,500 MiB/s read. Colab's disk is unknown: "
           "this assumes Titanium SSD is attached (estimate)")
    profiles.append(profile(
        "rtx-pro-6000", "Seed row 4 (the seed's tested setup): 1x RTX PRO 6000 Blackwell Server (96 GB) + 176 GB RAM, Colab G4",
        GPU("NVIDIA RTX PRO 6000 Blackwell Server Edition", ds(96, "[S9][S10]"), ds(1792, "[S9]"),
            ds(503.8, "[S9a] (417 TFLOPS measured by a third party on the Server Edition [S21])"),
            ds(5, "[S10] PCIe Gen5"), ds(16, "x16"), pro,
            scaled_curve(pro, 0.5, "pageable ~40-75% of pinned elsewhere; 50% assumed"), pro),
        Host(ds(176, "seed: 176 GB visible (180 GB provisioned [S10])"),
             est(125, "48-vCPU slice of an EPYC Turin host, 100-150 GB/s estimated (hardware-specs R4)"),
             est(150, "85% of RAM (estimate)")),
        NVMe("GCP Titanium SSD (assumed)", est(1610, "4 x 375 GiB Titanium SSD [S10]"),
             Surface(((1 * MiB, 1, 0.8), (4 * MiB, 1, 1.5), (1 * MiB, 8, 2.4), (16 * MiB, 8, 2.6), (16 * MiB, 32, 2.6)),
                     "estimate", tit)),
        CPU("AMD EPYC 9B45 (Turin), 24 cores / 48 threads (unverified [S10b])", est(24, "[S10b] unverified"),
            est(48, "[S10] 48 vCPUs"))))
    for p in profiles:
        save_profile(p, OUT / f"{p.name}.yaml")
        print("wrote", OUT / f"{p.name}.yaml")


if __name__ == "__main__":
    main()
