"""The engine on a synthetic kimi-k3.1-pro-shaped model (5 MoE layers), routing replayed from the skewed
prior: measured decode tok/s of each plan against the planner's prediction, and against the LRU-only and
on-demand baselines built from the same plan.

    python3 benchmarks/bench_engine.py --dir /root/kimi5 --out-dir $OUT [--tokens 48] [--warmup 32]

The plans (`tests/data/plan-kimi5-h200-{ramrich,seed}.yaml`) come from
`strata-plan plan --model kimi-k3.1-pro --moe-layers 5 --profile h200 --prior olmoe-like --trials 60
--context 1024 --vram-gb 11 --ram-gb 60 --nvme-gb 0.01` (RAM-rich: 8.5% of routed bytes static in VRAM,
2.3% cache, the rest in pinned RAM) and `... --ram-gb 11.5 --nvme-gb 60` (the seed's proportions: 12% VRAM,
25% pinned RAM, 63% NVMe). The packed folder is built each run (strata_plan/engine/synthetic.py, random weights in the
plans' formats) and dropped from the page cache. Routing: `engine.replay.Replay.from_prior("olmoe-like")`
with seed 11 (the plans' statistics were sampled with seed 0); its hit rates are inputs, not measurements
of a model. Per plan and mode: engine.bench.measure (decode tok/s = 1 / median seconds per token after
the warm-up), bytes per tier per token, link figures, round trips; for the NVMe plan also a plain O_DIRECT
read of the same files at the store's reader count, interleaved. Writes engine-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch

from _result import write_result  # noqa: E402

from strata_plan.engine.bench import measure  # noqa: E402
from strata_plan.engine.engine import EngineOptions  # noqa: E402
from strata_plan.engine.directio import page_cache_residency, plain_read_gbps  # noqa: E402
from strata_plan.engine.replay import Replay  # noqa: E402
from strata_plan.engine.synthetic import pack_synthetic  # noqa: E402
from strata_plan.core.plan import load_plan  # noqa: E402
from strata_plan.planner.repredict import predict_plan, with_calibration_of  # noqa: E402
from strata_plan.core.spec import load_spec  # noqa: E402

PLANS_DIR = Path(__file__).resolve().parents[1] / "tests" / "data"     # the tests read the same plans
PLANS = {"ramrich": PLANS_DIR / "plan-kimi5-h200-ramrich.yaml", "seed": PLANS_DIR / "plan-kimi5-h200-seed.yaml"}


def replay_for(plan) -> Replay:
    """The runs' routing: the olmoe-like prior, seed 11 (the plans' statistics were sampled with seed 0)."""
    return Replay.from_prior("olmoe-like", len(plan.layers), plan.n_experts, plan.top_k, tokens=4096, seed=11)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--warmup", type=int, default=32)
    ap.add_argument("--plans", default="ramrich,seed")
    ap.add_argument("--modes", default="plan,lru,on-demand")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--deadline-s", type=float, default=0, help="start no further run after this many seconds "
                    "(the runs done are written; 0: no limit)")
    ap.add_argument("--copy-windows", default="", help="also run the first plan in mode plan and lru with these "
                    "copy windows, MB:CHUNKS[,...] (chunk size and chunks in flight on the copy stream; the engine's default is 8:1)")
    ap.add_argument("--profile", help="re-predict every plan and mode with this profile (one measured in the same "
                    "run: `strata-plan profile --quick`); default: the plans' own predictions (the shipped h200)")
    ap.add_argument("--calibration", help="with --profile: predict with the calibration constants of this profile "
                    "YAML (fitted by `strata-plan calibrate` and committed before the run) and --profile's measured figures")
    a = ap.parse_args()
    predict_with = with_calibration_of(a.profile, a.calibration) if a.profile else None
    plans = {k: load_plan(PLANS[k]) for k in a.plans.split(",")}
    first = next(iter(plans.values()))
    for k, p in plans.items():
        assert all(l.formats == l0.formats for l, l0 in zip(p.layers, first.layers)), f"{k}: other formats"
    spec = load_spec(first.model)
    folder = Path(a.dir)
    out, metrics = {}, {}
    skipped: list[str] = []
    try:
        t0 = time.perf_counter()
        if not (folder / "index.json").exists():
            pack_synthetic(spec, folder, [{e: l.format_of(e) for e in range(first.n_experts)} for l in first.layers],
                           device="cuda" if torch.cuda.is_available() else "cpu")
        files = sorted(folder.glob("experts-*.bin"))
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        metrics["build_s"] = time.perf_counter() - t0
        print(f"packed {sum(f.stat().st_size for f in files) / 1e9:.1f} GB in {metrics['build_s']:.0f} s", flush=True)

        def late(what: str) -> bool:
            if a.deadline_s and time.perf_counter() - t0 > a.deadline_s:
                print(f"deadline: {what} not run", flush=True)
                skipped.append(what)
                return True
            return False

        def copy_windows(first_name: str) -> None:          # right after the first plan: before slow NVMe runs
            for w in filter(None, a.copy_windows.split(",")):
                mb, n = w.split(":")
                opts = EngineOptions(chunk_bytes=int(float(mb) * (1 << 20)), chunks_in_flight=int(n))
                for mode in ("plan", "lru"):
                    if late(f"{first_name}/{mode}/copy {w}"):
                        continue
                    r = measure(folder, PLANS[first_name], mode=mode, tokens=a.tokens, warmup=a.warmup,
                                replay=replay_for(plans[first_name]), options=opts)
                    out[f"{first_name}/{mode}/copy{mb}x{n}"] = r
                    key = f"{first_name}.{mode}.copy_{mb}mb_x{n}"
                    tp = r["time_per_token"]
                    metrics[f"{key}.decode_tok_s"] = r["measured"]["decode_tok_s"]
                    metrics[f"{key}.device_wait_ms_per_token"] = (tp["device_wait_s"] or 0) * 1e3
                    print(f"{first_name:8s} {mode:9s} copy window {mb} MB x {n}: decode "
                          f"{r['measured']['decode_tok_s']:8.2f} tok/s, GPU waiting {(tp['device_wait_s'] or 0) * 1e3:.2f} "
                          f"ms/tok, copy busy {r['links']['copy_busy_s_per_token'] * 1e3:.2f} ms/tok", flush=True)

        for name, plan in plans.items():
            for mode in a.modes.split(","):
                if late(f"{name}/{mode}"):
                    continue
                r = measure(folder, PLANS[name], mode=mode, tokens=a.tokens, warmup=a.warmup, replay=replay_for(plan))
                out[f"{name}/{mode}"] = r
                m = r["measured"]
                print(f"{name:8s} {mode:9s} decode {m['decode_tok_s']:8.2f} tok/s (predicted for the plan "
                      f"{r['plan']['predicted']:.2f}) hit {r['hit_rate']:.3f} resident {r['resident_hit_rate']:.3f} "
                      f"pcie {r['bytes_per_token']['pcie'] / 1e9:.3f} GB/tok issued, {r['bytes_per_token']['pcie_copied'] / 1e9:.3f} copied; copy busy "
                      f"{r['links']['copy_busy_s_per_token'] * 1e3:.2f} ms/tok", flush=True)
                tp = r["time_per_token"]
                print(f"{'':18s} host: round trips {tp['router_round_trip_s'] * 1e3:.2f} store+launch "
                      f"{tp['store_and_launch_host_s'] * 1e3:.2f} segments {(tp['segment_launch_host_s'] or 0) * 1e3:.2f} "
                      f"ms/tok; GPU compute {(tp['device_compute_s'] or 0) * 1e3:.2f} waiting "
                      f"{(tp['device_wait_s'] or 0) * 1e3:.2f} ms/tok (graphs {r['graphs']})", flush=True)
                for key in ("device_compute_s", "device_wait_s", "router_round_trip_s", "store_and_launch_host_s",
                            "segment_launch_host_s"):
                    if tp[key] is not None:
                        metrics[f"{name}.{mode}.{key[:-2]}_ms_per_token"] = tp[key] * 1e3
                for j, (c, w) in enumerate(tp["device_per_moe_layer_s"] or []):
                    metrics[f"{name}.{mode}.moe_layer{j}_ms_per_token"] = (c + w) * 1e3
                metrics[f"{name}.{mode}.copy_busy_ms_per_token"] = r["links"]["copy_busy_s_per_token"] * 1e3
                metrics[f"{name}.{mode}.decode_tok_s"] = m["decode_tok_s"]
                if a.profile:
                    pr = predict_plan(plan, predict_with, mode, where=str(PLANS[name]))
                    r["predicted"] = {"profile": a.profile, "calibration": a.calibration, "decode_tok_s": pr.decode_tok_s,
                                      "decode_binding": pr.decode_binding, "bytes_per_token": pr.bytes_per_token,
                                      "decode_seconds": pr.decode_seconds}
                    metrics[f"{name}.{mode}.predicted_decode_tok_s"] = pr.decode_tok_s
                    metrics[f"{name}.{mode}.measured_over_predicted"] = m["decode_tok_s"] / pr.decode_tok_s
                    print(f"{'':18s} predicted with {a.profile} (constants: {a.calibration or 'its own'}): {pr.decode_tok_s:.2f} tok/s ({pr.decode_binding}), "
                          f"measured / predicted {m['decode_tok_s'] / pr.decode_tok_s:.3f}", flush=True)
                metrics[f"{name}.{mode}.pcie_gb_per_token"] = r["bytes_per_token"]["pcie"] / 1e9
                metrics[f"{name}.{mode}.pcie_copied_gb_per_token"] = r["bytes_per_token"]["pcie_copied"] / 1e9
                metrics[f"{name}.{mode}.nvme_gb_per_token"] = r["bytes_per_token"]["nvme"] / 1e9
                metrics[f"{name}.{mode}.hit_rate_replayed"] = r["hit_rate"]
            metrics[f"{name}.predicted_decode_tok_s"] = plan.predicted.decode_tok_s
            if f"{name}.plan.decode_tok_s" in metrics:
                metrics[f"{name}.plan.measured_over_predicted"] = metrics[f"{name}.plan.decode_tok_s"] / plan.predicted.decode_tok_s
            if any(l.nvme for l in plan.layers) and not late(f"{name}/plain O_DIRECT"):
                metrics[f"{name}.plain_odirect_gbps"] = plain_read_gbps(files, 10 << 20, threads=4, nbytes=2 << 30)
            if name == next(iter(plans)):
                copy_windows(name)
        metrics["page_cache_after"] = max(page_cache_residency(f) for f in files)
    finally:
        if not a.keep:
            shutil.rmtree(folder, ignore_errors=True)
    path = write_result("engine", metrics, out_dir=a.out_dir, extra={"runs": out, "skipped_at_deadline": skipped})
    print(json.dumps(metrics, indent=1))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
