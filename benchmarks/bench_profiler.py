"""Profiler vs independent references, in one run on one machine.

Runs the full profile (and, with --quick-too, the quick one, timed), then the references of
benchmarks/profiler_reference.py, and compares the headline figures: pinned H2D at 16 and 256 MiB,
pageable H2D at 256 MiB, device (HBM) copy, and O_DIRECT reads at 16 MiB (sequential at one read in
flight against `dd iflag=direct`; random at one read in flight against a plain Python loop). A figure
agrees when the medians differ by at most 5%; where either side's spread of repeats exceeds 5% (a virtual
disk, say), the result says so instead of claiming agreement.

    python benchmarks/bench_profiler.py --nvme-dir DIR --max-gib 6 --pin-cap-gib 32 --name h200 --out-dir OUT

Writes OUT/<name>.yaml (the profile) and the result JSON (benchmarks/_result.py) in OUT.

`--paired N --skip-profile` instead alternates the profiler's own measuring functions with the references
N times on the same buffers and the same test file (benchmark `profiler_paired`): on a noisy machine
the ratio of each pair, taken moments apart, separates a bias of the method from drift of the machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent

import profiler_reference as ref  # noqa: E402
from _result import write_result  # noqa: E402

from strata_plan.profiler import nvme, run  # noqa: E402
from strata_plan.profiler.timing import GiB, MiB, Stats  # noqa: E402
from strata_plan.profiles.schema import load_profile, save_profile  # noqa: E402

TOLERANCE = 0.05
REPEATS = 5


def compare(name: str, prof: Stats | None, reference: list[float] | None) -> dict:
    row = {"figure": name}
    if prof is None or not reference:
        return {**row, "verdict": "not measured"}
    r = Stats(tuple(reference))
    diff = prof.median / r.median - 1
    noisy = max(prof.spread, r.spread) > TOLERANCE
    verdict = ("spread exceeds 5%: no agreement claimed" if noisy else
               "agrees within 5%" if abs(diff) <= TOLERANCE else "DISAGREES by more than 5%")
    return {**row, "profiler": round(prof.median, 3), "profiler_spread": round(prof.spread, 4),
            "reference": round(r.median, 3), "reference_spread": round(r.spread, 4), "diff": round(diff, 4),
            "verdict": verdict}


def paired_rows(prof: dict[str, list[float]], refs: dict[str, list[float]]) -> list[dict]:
    rows = []
    for name in prof:
        ratios = Stats(tuple(p / r for p, r in zip(prof[name], refs[name])))
        p, r = Stats(tuple(prof[name])), Stats(tuple(refs[name]))
        rows.append({"figure": name, "pairs": ratios.repeats, "profiler": round(p.median, 3),
                     "profiler_spread": round(p.spread, 4), "reference": round(r.median, 3),
                     "reference_spread": round(r.spread, 4), "median_ratio": round(ratios.median, 4),
                     "ratio_spread": round(ratios.spread, 4),
                     "verdict": "pair ratios spread over 5%: no agreement claimed" if ratios.spread > TOLERANCE
                     else "methods agree within 5% (paired)" if abs(ratios.median - 1) <= TOLERANCE
                     else "methods DIFFER by more than 5% (paired)"})
    return rows


def paired_gpu(n: int) -> tuple[dict, dict]:
    from strata_plan.profiler import gpu
    s = gpu.GpuSettings((16 * MiB, 256 * MiB), (16 * MiB,), 1, run.FULL.target_bytes, run.FULL.max_iters,
                        run.FULL.hbm_bytes, run.MATMUL_N, run.GEMV_SHAPE)
    pinned, pageable, dev = gpu.copy_buffers(GiB)
    c = ref.CupyCopies({"16MiB": 16 * MiB, "256MiB": 256 * MiB})
    keys = {f"{m}@{lab}": (m, z) for m in ("h2d_pinned", "h2d_pageable") for lab, z in
            (("16MiB", 16 * MiB), ("256MiB", 256 * MiB))}
    prof = {k: [] for k in keys}
    refs = {k: [] for k in keys}
    for _ in range(n):
        curves = gpu.copy_curves(s, pinned, pageable, dev)
        for k, (m, z) in keys.items():
            prof[k].append(curves[m][z].median)
            refs[k].append(c.sample(k))
    c.close()
    return prof, refs


def paired_disk(folder: Path, size: int, n: int) -> tuple[dict, dict]:
    import os
    import random
    prof = {"O_DIRECT rand 16MiB QD1 vs Python loop": [], "O_DIRECT seq 16MiB QD1 vs dd": []}
    refs = {k: [] for k in prof}
    rng = random.Random(3)
    count = int(min(size // 2, GiB // 2) // (16 * MiB))
    with nvme.TestFile(folder, size) as tf:
        fd, direct = nvme.open_reader(tf.path)
        try:
            for i in range(n):
                k1, k2 = prof
                prof[k1].append(nvme.read_pass(fd, size, 16 * MiB, 1, 0.4, False, rng))
                refs[k1].append(ref.python_direct_random(tf.path, 16 * MiB, count, 1, seed=i)[0])
                prof[k2].append(nvme.read_pass(fd, size, 16 * MiB, 1, 0.4, True, rng))
                refs[k2].append(ref.dd_direct(tf.path, 16 * MiB, count, 1, seed=i)[0])
        finally:
            os.close(fd)
    return prof, refs


def main_paired(args, out: Path) -> int:
    import torch
    prof, refs, notes = {}, {}, []
    gemv = {}
    if torch.cuda.is_available():
        p, r = paired_gpu(args.paired)
        prof.update(p)
        refs.update(r)
        from strata_plan.profiler import gpu
        gemv = {f: round(st.median, 1) for f, st in gpu.kernel_throughput(*run.GEMV_SHAPE, notes).items()}
    else:
        notes.append("no GPU: PCIe pairs not run")
    p, r = paired_disk(Path(args.nvme_dir), int(args.max_gib * GiB), args.paired)
    prof.update(p)
    refs.update(r)
    rows = paired_rows(prof, refs)
    metrics = {f"gemv_{f}_gbps": v for f, v in gemv.items()}
    for row in rows:
        key = row["figure"].replace(" ", "_").replace("@", "_").lower()
        for f in ("median_ratio", "ratio_spread", "profiler_spread", "reference_spread", "verdict"):
            metrics[f"{key}.{f}"] = row[f]
    command = " ".join(["python", "benchmarks/bench_profiler.py", *sys.argv[1:]])
    res = write_result("profiler_paired", metrics, command=command, out_dir=out, notes=(
        "The profiler's own functions (copy_curves; nvme.read_pass) alternated with the references (CuPy "
        "cudaMemcpy[Async] + CUDA events; Python O_DIRECT loop; dd iflag=direct) on the same buffers and file; "
        "median_ratio = median over pairs of strata_plan/profiler/reference. " + " | ".join(notes)),
        extra={"pairs": rows, "profiler_samples": prof, "reference_samples": refs})
    print(f"{'figure':<42} {'pairs':>5} {'profiler':>9} {'spread':>7} {'reference':>9} {'spread':>7} {'ratio':>7} "
          f"{'r.spread':>8}  verdict")
    for row in rows:
        print(f"{row['figure']:<42} {row['pairs']:>5} {row['profiler']:>9.2f} {row['profiler_spread']:>7.1%} "
              f"{row['reference']:>9.2f} {row['reference_spread']:>7.1%} {row['median_ratio']:>7.3f} "
              f"{row['ratio_spread']:>8.1%}  {row['verdict']}")
    print(f"packed-format GEMV GB/s: {gemv or 'none'}; notes: {notes}")
    print(f"wrote {res}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvme-dir", default=".")
    ap.add_argument("--max-gib", type=float, default=6.0)
    ap.add_argument("--pin-cap-gib", type=float, default=32.0)
    ap.add_argument("--name", default="")
    ap.add_argument("--quick-too", action="store_true", help="also time a --quick profile")
    ap.add_argument("--out-dir", default=str(HERE / "results"))
    ap.add_argument("--paired", type=int, default=0, metavar="N", help="also alternate methods N times")
    ap.add_argument("--skip-profile", action="store_true", help="with --paired: only the paired comparison")
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.skip_profile:
        return main_paired(args, out)
    notes: list[str] = []
    metrics: dict = {}

    t0 = time.perf_counter()
    full = run.profile_machine(run.Options(False, Path(args.nvme_dir), args.max_gib, args.pin_cap_gib, args.name))
    metrics["profile_full_seconds"] = round(time.perf_counter() - t0, 1)
    path = save_profile(full.profile, out / f"{full.profile.name}.yaml")
    load_profile(str(path))
    notes += full.notes
    print(f"full profile: {metrics['profile_full_seconds']} s -> {path}", flush=True)

    if args.quick_too:
        t0 = time.perf_counter()
        run.profile_machine(run.Options(True, Path(args.nvme_dir), 1.0, 4.0, args.name), show_progress=False)
        metrics["profile_quick_seconds"] = round(time.perf_counter() - t0, 1)
        print(f"quick profile: {metrics['profile_quick_seconds']} s", flush=True)

    st = full.stats
    refs: dict[str, list[float]] = {}
    if full.gpu_found:
        try:
            refs.update(ref.cupy_copies({"16MiB": 16 * MiB, "256MiB": 256 * MiB}, REPEATS,
                                        hbm_bytes=run.FULL.hbm_bytes))
        except Exception as e:  # noqa: BLE001 -- report what could not be run, keep the rest
            notes.append(f"cupy reference failed: {type(e).__name__}: {e}")
            traceback.print_exc()
    file_bytes = full.extra["test_file_bytes"]
    try:
        with nvme.TestFile(Path(args.nvme_dir), file_bytes) as tf:
            count = int(min(file_bytes // 2, GiB) // (16 * MiB))
            refs["dd_seq_16MiB_qd1"] = ref.dd_direct(tf.path, 16 * MiB, count, REPEATS)
            refs["py_rand_16MiB_qd1"] = ref.python_direct_random(tf.path, 16 * MiB, count, REPEATS)
    except Exception as e:  # noqa: BLE001
        notes.append(f"disk reference failed: {type(e).__name__}: {e}")
        traceback.print_exc()

    rows = [
        compare("pinned H2D 16 MiB (GB/s)", st.get("h2d_pinned_16MiB_gbps"), refs.get("h2d_pinned@16MiB")),
        compare("pinned H2D 256 MiB (GB/s)", st.get("h2d_pinned_256MiB_gbps"), refs.get("h2d_pinned@256MiB")),
        compare("pageable H2D 256 MiB (GB/s)", st.get("h2d_pageable_256MiB_gbps"), refs.get("h2d_pageable@256MiB")),
        compare("pageable H2D 16 MiB (GB/s)", st.get("h2d_pageable_16MiB_gbps"), refs.get("h2d_pageable@16MiB")),
        compare("pinned D2H 256 MiB (GB/s)", st.get("d2h_pinned_256MiB_gbps"), refs.get("d2h_pinned@256MiB")),
        compare("HBM device copy, read+write (GB/s)", st.get("device_copy_gbps"), refs.get("device_copy")),
        compare("O_DIRECT seq read 16 MiB QD1 vs dd (GB/s)", st.get("disk_seq_16MiB_qd1_gbps"),
                refs.get("dd_seq_16MiB_qd1")),
        compare("O_DIRECT rand read 16 MiB QD1 vs Python loop (GB/s)", st.get("disk_rand_16MiB_qd1_gbps"),
                refs.get("py_rand_16MiB_qd1")),
    ]
    for r in rows:
        key = r["figure"].split(" (")[0].replace(" ", "_").replace(",", "").replace("+", "_").lower()
        for field in ("profiler", "profiler_spread", "reference", "reference_spread", "diff", "verdict"):
            if field in r:
                metrics[f"{key}.{field}"] = r[field]
    for key in ("hbm_read_gbps", "bf16_tflops", "ram_copy_gbps", "disk_rand_16MiB_qd8_gbps",
                "disk_rand_16MiB_qd32_gbps", "h2d_during_kernel_16MiB_gbps"):
        if key in st:
            metrics[key] = round(st[key].median, 3)
    g = full.profile.gpu
    if g:
        metrics["pcie"] = f"Gen{g.pcie_gen.value:.0f} x{g.pcie_width.value:.0f}"
    metrics["pinnable_gb"] = full.profile.host.pinnable_gb.value
    notes_text = ("Headline figures of `strata-plan profile` (full) against references by other mechanisms "
                  "(CuPy cudaMemcpy/cudaMemcpyAsync + CUDA events; dd iflag=direct; Python O_DIRECT loop), "
                  "same run. diff = strata_plan/profiler/reference - 1; spreads are (max-min)/median of the repeats. "
                  + " | ".join(notes))
    command = " ".join(["python", "benchmarks/bench_profiler.py", *sys.argv[1:]])
    res = write_result("profiler", metrics, command=command, notes=notes_text, out_dir=out,
                       extra={"comparisons": rows, "profiler_stats": {k: s.to_dict() for k, s in st.items()},
                              "reference_samples": refs, "profile_file": path.name})
    print(f"{'figure':<52} {'profiler':>9} {'spread':>7} {'reference':>9} {'spread':>7} {'diff':>7}  verdict")
    for r in rows:
        if "profiler" in r:
            print(f"{r['figure']:<52} {r['profiler']:>9.2f} {r['profiler_spread']:>7.1%} {r['reference']:>9.2f} "
                  f"{r['reference_spread']:>7.1%} {r['diff']:>+7.1%}  {r['verdict']}")
        else:
            print(f"{r['figure']:<52} {r['verdict']}")
    print(f"wrote {res}")
    print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, str) or k == "pcie"}, indent=None)[:2000])
    return main_paired(args, out) if args.paired else 0


if __name__ == "__main__":
    sys.exit(main())
