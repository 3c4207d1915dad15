"""Diagnostic (CPU, seconds): a trained-model run's rows predicted again by this checkout's cost model, with the run's
own profile and plans (the call's trained-artifacts.tar), beside what the run measured.

    tar -C DIR -xf <files_at>/trained-artifacts.tar
    python benchmarks/tools/repredict_trained.py benchmarks/results/engine-trained-<time>.json DIR [--stager-measured]
        [--own-routing] [--waits]

DIR holds plan-<budget>.yaml, profile-predict.yaml (the profile the run predicted with: its quick profile and the
model's layer times) and bench-moe/ (the routing trace the plans name). `--stager-measured`: the stager's host time
measured by each budget's rows (`<budget>.stager_wake_us_measured`, `.stager_read_us_measured`) in place of the
profile's. `--own-routing`: each row on the routing of its own text where DIR holds it (run-routing/<row>.npz, the
`run_routing` stage's traces; its first counted step from the results' runs.<row>.context), its experts ranked as
the plan ranks them (`trained/run_routing.row_stats`). Prints per row: measured tok/s, the run's prediction, this
checkout's, measured / this checkout's. `--waits` (with `--own-routing`; rows without lookahead): the row's NVMe misses
counted on its own routing through an LRU staging cache of the plan's slots (the stager's policy at depth 0), each
(token, layer)'s batch priced by the cost model's `staged_batch_seconds`, summed a token, beside the model's own
expected-miss figure and the row's measured GPU wait: which of the miss count and the batch time the model has wrong.
Not a benchmark: no results file."""
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
    ap.add_argument("--waits", action="store_true")
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
        ahead = plan if plan.prefetch_depth else forced_depth(plan, int(m.get(f"{name}.lookahead_depth", 1)))
        for k in range(16):          # --lookahead-repeats' interleaved rows (--lookahead-point-ab: the router's too)
            rows += [(f"lookahead_r{k}", ahead, "plan"), (f"on-demand_r{k}", baseline(plan, "on-demand"), "on-demand"),
                     (f"lookahead_router_r{k}", ahead, "plan")]
        for key, executed, mode in rows:
            got = m.get(f"{name}.{key}.decode_tok_s_measured")
            if got is None:
                continue
            point = result["runs"][f"{name}.{key}"].get("lookahead_point")     # as the row ran (None: the plan's)
            trace = folder / "run-routing" / f"{name}.{key}.npz"
            stats = None
            if a.own_routing and trace.is_file():
                stats = row_stats(load_trace(trace), result["runs"][f"{name}.{key}"]["context"], executed)
            p_now = pred.for_plan(executed, mode, stats=stats, point=point)
            now = p_now["decode_tok_s"]
            print(f"{name + '.' + key:22s} {got:9.1f} {m[f'{name}.{key}.decode_tok_s_predicted']:9.1f} {now:9.1f} "
                  f"{got / now:9.3f}")
            if a.waits and stats is not None and not (mode == "plan" and executed.prefetch_depth):
                waits(pred, executed, load_trace(trace), result["runs"][f"{name}.{key}"]["context"], p_now,
                      m, f"{name}.{key}")
    return 0


def waits(pred, executed, trace, context: dict, predicted: dict, m: dict, key: str) -> None:
    """One row's NVMe wait a token: the cost model's batch time on the row's own per-(token, layer) misses (an LRU
    staging cache of the plan's slots, filled from the first decode step, counted from the first counted one),
    against the model's figure from expected misses and the measured wait."""
    import numpy as np
    from collections import OrderedDict
    from strata_plan.engine.staging import stage_slots
    cm = pred.cost
    fmts = list(cm.problem.mix.formats)
    fmt = [{e: fmts.index(f) for f, ids in (l.formats or {}).items() for e in ids} for l in executed.layers]
    nvme = [set(l.nvme) for l in executed.layers]
    slots, lru = stage_slots(executed), OrderedDict()
    start = int(context["counted_from"])
    counts = []                                      # [T, F, L] misses a counted token
    for t, step in enumerate(trace.experts):
        c = np.zeros((len(fmts), len(nvme)))
        for j, ids in enumerate(step):
            for e in map(int, ids):
                if e not in nvme[j]:
                    continue
                if (j, e) in lru:
                    lru.move_to_end((j, e))
                    continue
                c[fmt[j].get(e, 0), j] += 1
                lru[(j, e)] = True
                if len(lru) > slots:
                    lru.popitem(last=False)
        if t >= start:
            counts.append(c)
    counts = np.array(counts)
    actual = np.mean([cm.staged_batch_seconds(c)[0].sum() for c in counts])
    at_mean = cm.staged_batch_seconds(counts.mean(axis=0))[0].sum()
    nb = np.array([cm.problem.spec.routed_expert_bytes(f) for f in fmts])
    reads = m.get(f"{key}.demand_reads_per_token_measured", float("nan"))
    bpt = predicted["bytes_per_token"]
    model_mb = (bpt["nvme_read"] - bpt.get("nvme_wasted", 0.0)) / 1e6      # the misses read (not the wrong guesses)
    print(f"    waits: {counts.sum(axis=(1, 2)).mean():.1f} misses a token on its routing ({reads:.1f} measured), "
          f"{(counts.sum(axis=2) @ nb).mean() / 1e6:.2f} MB (model {model_mb:.2f}); "
          f"batch time summed over each token's misses {actual * 1e3:.2f} ms, at their means {at_mean * 1e3:.2f}, "
          f"the model's {predicted['decode_seconds']['nvme'] * 1e3:.2f}; GPU waited "
          f"{m.get(f'{key}.stage_wait_ms_per_token_measured', float('nan')):.2f} ms a token (measured)")


if __name__ == "__main__":
    raise SystemExit(main())
