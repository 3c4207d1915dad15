"""Benchmark: how long a kimi-k3.1-pro plan takes on this machine, and how close it gets to a 10x longer search.

For each profile, `strata-plan plan` runs as a user runs it (a fresh process: model, prior statistics,
Optuna study, polish, bound, plan YAML) at a ladder of trial counts, timed by wall clock; then once with 10x
the default trial count, the reference. Reported per profile: the seconds of each rung, the most trials that
finished under the 60 s target, the default's seconds, and the gap of each rung's predicted decode tok/s to
the reference's (predicted figures: the cost model's, not measurements). The priors give every layer the
same statistics; a trace with layers that differ is a harder search (tests/test_planner_search.py).

    python benchmarks/bench_planner.py [--profiles rtx-pro-6000 rtx-4090] [--ladder 50 100 200 400 800]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _result import write_result  # noqa: E402

MODEL = "kimi-k3.1-pro"
DEFAULT_TRIALS = 200          # `strata-plan plan --trials` default
TARGET_S = 60.0


def run_plan(profile: str, prior: str, trials: int, out: Path) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "strata_plan.cli", "plan", "--profile", profile, "--model", MODEL, "--prior", prior,
           "--trials", str(trials), "--seed", "0", "--out", str(out), "--json"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"plan failed ({' '.join(cmd)}): {r.stderr.strip()}")
    return wall, json.loads(r.stdout)


def main() -> None:
    from strata_plan.core.routing import SKEWED_PRIOR
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", nargs="+", default=["rtx-pro-6000", "rtx-4090"])
    ap.add_argument("--prior", default=SKEWED_PRIOR)
    ap.add_argument("--ladder", nargs="+", type=int, default=[50, 100, 200, 400, 800])
    args = ap.parse_args()
    metrics: dict = {"load_avg_1min_at_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory() as d:
        for prof in args.profiles:
            ref_trials = 10 * DEFAULT_TRIALS
            ref_s, ref = run_plan(prof, args.prior, ref_trials, Path(d) / "ref.yaml")
            rungs = []
            for n in sorted(set(args.ladder) | {DEFAULT_TRIALS}):
                wall, s = run_plan(prof, args.prior, n, Path(d) / f"{n}.yaml")
                gap = 1.0 - s["decode_tok_s"] / ref["decode_tok_s"]
                rungs.append({"trials": n, "seconds": round(wall, 2), "decode_tok_s": s["decode_tok_s"],
                              "gap_to_10x": round(gap, 5)})
                print(f"{prof}: {n:5d} trials {wall:6.1f} s  decode {s['decode_tok_s']:.4f} tok/s (predicted)  "
                      f"gap to {ref_trials} trials {gap:+.2%}", flush=True)
            default = next(r for r in rungs if r["trials"] == DEFAULT_TRIALS)
            under = [r["trials"] for r in rungs if r["seconds"] < TARGET_S] + [ref_trials] * (ref_s < TARGET_S)
            metrics[prof] = {"prior": args.prior, "default_trials": DEFAULT_TRIALS, "default_seconds": default["seconds"],
                             "default_gap_to_10x": default["gap_to_10x"], "most_trials_run_under_60s": max(under, default=0),
                             "reference_trials": ref_trials, "reference_seconds": round(ref_s, 2),
                             "reference_decode_tok_s": ref["decode_tok_s"], "reference_binding": ref["decode_binding"],
                             "rungs": rungs}
            print(f"{prof}: reference {ref_trials} trials {ref_s:.1f} s, decode {ref['decode_tok_s']:.4f} tok/s "
                  f"({ref['decode_binding']})", flush=True)
    metrics["load_avg_1min_at_end"] = round(os.getloadavg()[0], 2)
    path = write_result("planner", metrics, notes="wall-clock seconds of `strata-plan plan` in a fresh process "
                        "(stats from the prior, TPE study, polish, bound, plan YAML); decode tok/s are predictions; "
                        "other processes share the cores (load averages recorded)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
