"""Diagnostic (CPU, seconds): a trained-model run's rows predicted again by this checkout's cost model, with the run's
own profile and plans (the call's trained-artifacts.tar), beside what the run measured.

    tar -C DIR -xf <files_at>/trained-artifacts.tar
    python benchmarks/tools/repredict_trained.py benchmarks/results/engine-trained-<time>.json DIR [--stager-measured]
        [--own-routing]

DIR holds plan-<budget>.yaml, profile-predict.yaml (the profile the run predicted with: its quick profile and the
model's layer times) and bench-moe/ (the routing trace the plans name). `--stager-measured`: the stager's host time
measured by each budget's rows (`<budget>.stager_wake_us_measured`, `.stager_read_us_measured`) in place of the
profile's. `--own-routing`: each row on the routing of its own text where DIR holds it (run-routing/<row>.npz, the
`run_routing` stage's traces; its first counted step from the results' runs.<row>.context), its experts ranked as
the plan ranks them (`trained/run_routing.row_stats`). Prints per row: measured tok/s, the run's prediction, this
checkout's, measured / this checkout's. Not a benchmark: no results file."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _plans import forced_depth  # noqa: E402
from trained.predict import Predictor  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("artifacts")
    ap.add_argument("--stager-measured", action="store_true")
    ap.add_argument("--own-routing", action="store_true")
    a = ap.parse_args()
    from strata_plan.core.modes import MODES, baseline
    from strata_plan.core.plan import load_plan
    from strata_plan.core.routing import load_trace
    from strata_plan.profiles.schema import Figure, load_profile
    from trained.run_routing import row_stats
    result = json.loads(Path(a.results).read_text())
    m = result["metrics"]
    folder = Path(a.artifacts)
    prof = load_profile(str(folder / "profile-predict.yaml"))
    print(f"{'row':22s} {'measured':>9s} {'run pred':>9s} {'now pred':>9s} {'meas/now':>9s}")
    for path in sorted(folder.glob("plan-*.yaml")):
        name = path.stem.split("-", 1)[1]
        if f"{name}.plan.decode_tok_s_measured" not in m:
            continue
        p = prof
        if a.stager_measured and f"{name}.stager_wake_us_measured" in m:
            fig = lambda k: Figure(m[f"{name}.{k}_measured"], "measured", a.results, "2026-12-05")  # noqa: E731
            p = dataclasses.replace(prof, calibration=dataclasses.replace(
                prof.calibration, stager_wake_us=fig("stager_wake_us"), stager_read_us=fig("stager_read_us"),
                stager_publish_us=fig("stager_publish_us") if f"{name}.stager_publish_us_measured" in m
                else prof.calibration.stager_publish_us))
        sampled = (result.get("settings") or {}).get("sample", "greedy") != "greedy"    # the rows drew their tokens
        pred, plan = Predictor(path, p, sampled=sampled), load_plan(path)
        rows = [(mode, baseline(plan, mode), mode) for mode in MODES]
        rows += [(again, plan, "plan") for again in ("plan_again", "plan_deepest", "plan_aio", "plan_threads")]
        rows += [(f"depth{d}", forced_depth(plan, d), "plan") for d in range(1, 9)]
        for key, executed, mode in rows:
            got = m.get(f"{name}.{key}.decode_tok_s_measured")
            if got is None:
                continue
            trace = folder / "run-routing" / f"{name}.{key}.npz"
            stats = None
            if a.own_routing and trace.is_file():
                stats = row_stats(load_trace(trace), result["runs"][f"{name}.{key}"]["context"], executed)
            now = pred.for_plan(executed, mode, stats=stats)["decode_tok_s"]
            print(f"{name + '.' + key:22s} {got:9.1f} {m[f'{name}.{key}.decode_tok_s_predicted']:9.1f} {now:9.1f} "
                  f"{got / now:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
