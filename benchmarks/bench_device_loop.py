"""The device loop by depth: host time and GPU time a token as MoE layers are added.

    python3 benchmarks/bench_device_loop.py --dir /root/dl --out-dir $OUT [--model qwen3-30b-a3b] [--layers 5,24]

A synthetic model of `--model`'s geometry (random weights in the planned formats) is cut to each layer count of
`--layers`, planned once for the H200 (`strata-plan plan`, then the tiers set by hand so that every layer keeps
`--static` of its experts in VRAM, `--cache` LRU slots, the rest in pinned RAM: the device loop's case), packed,
and run LRU-only and on-demand (each launch running the engine's tokens per graph) and LRU-only at one launch a
token (`lru_k1`), with routing replayed from the `olmoe-like` prior. Per count and mode: decode
tok/s, the decode thread's CPU time a token (`host_ms_per_token`: flat in depth when the host is out of the
loop), the step's GPU time a token, the bytes read from RAM a token and the bound 1 / (t_nonMoE + B / R_zc) with
every term measured in the run. Then a least-squares line of GPU ms a token over the layer counts per mode: its
slope (ms per MoE layer) and its largest relative residual (linearity: three counts or more). Writes
device-loop-<time>.json after every run (a failed run is recorded in `errors`, the next goes on).
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import torch

from _plans import tiers_by_hand  # noqa: E402
from _result import on_timeout, record_failure, result_path, write_result  # noqa: E402
from bench_engine import zero_copy_gbps  # noqa: E402

from strata_plan.cli import main as cli  # noqa: E402
from strata_plan.core.plan import load_plan  # noqa: E402
from strata_plan.core.spec import load_spec  # noqa: E402
from strata_plan.engine.bench import measure  # noqa: E402
from strata_plan.engine.engine import EngineOptions  # noqa: E402
from strata_plan.engine.replay import Replay  # noqa: E402
from strata_plan.engine.synthetic import pack_synthetic  # noqa: E402


def device_plan(model: str, n: int, folder: Path, static: float, cache: int, profile: str):
    """`model` cut to n MoE layers, planned for `profile`, then per layer the `static` share of its experts (by
    the plan's popularity order) in VRAM, `cache` LRU slots, the rest in pinned RAM; no lookahead."""
    path = folder / f"plan-{n}.yaml"
    assert cli(["plan", "--model", model, "--moe-layers", str(n), "--profile", profile, "--prior", "olmoe-like",
                "--trials", "8", "--context", "1024", "--out", str(path), "--force", "--json"]) == 0
    return tiers_by_hand(load_plan(path), static, cache)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="scratch folder for plans and packed models (removed at the end)")
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--layers", default="5,24")
    ap.add_argument("--modes", default="lru,lru_k1,on-demand",
                    help="engine modes; suffixes: `_k<N>`: N tokens a graph launch instead of --tokens-per-graph (lru_k1: "
                         "one launch a token); `_poll`: the token reads polling their event every --poll-us instead "
                         "of a blocking wait (does the driver's wait cost the decode thread CPU time?)")
    ap.add_argument("--tokens-per-graph", type=int, default=EngineOptions.tokens_per_graph,
                    help=f"decode tokens a graph launch runs (default {EngineOptions.tokens_per_graph}: the engine's)")
    ap.add_argument("--poll-us", type=float, default=100.0)
    ap.add_argument("--static", type=float, default=0.1)
    ap.add_argument("--cache", type=int, default=8)
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--device", default="")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--deadline-s", type=float, default=0, help="start no further layer count after this many seconds")
    a = ap.parse_args()
    folder = Path(a.dir)
    folder.mkdir(parents=True, exist_ok=True)
    metrics, runs = {}, {}
    counts = [int(x) for x in a.layers.split(",")]
    modes = a.modes.split(",")
    gpu = {m: [] for m in modes}
    errors: list[str] = []
    path = result_path("device-loop", a.out_dir)
    signal.signal(signal.SIGTERM, on_timeout)      # `timeout`: still write what was measured
    t_start = time.perf_counter()

    def save() -> None:                                 # after every run: a crash or a kill keeps the runs done
        write_result("device-loop", metrics, out_dir=a.out_dir, path=path,
                     extra={"runs": runs, "model": a.model, "errors": errors})

    try:
        for n in counts:
            if a.deadline_s and time.perf_counter() - t_start > a.deadline_s:
                print(f"deadline: {n} layers not run", flush=True)
                errors.append(f"{n} layers: not run (deadline)")
                continue
            try:
                plan = device_plan(a.model, n, folder, a.static, a.cache, a.profile)
            except Exception as err:                    # noqa: BLE001 (recorded; the next count goes on)
                record_failure(errors, f"{n} layers: plan", err)
                continue
            packed = folder / f"packed-{n}"
            t0 = time.perf_counter()
            pack_synthetic(load_spec(f"{a.model}@{n}moe"), packed,
                           [{e: l.format_of(e) for e in range(plan.n_experts)} for l in plan.layers],
                           device="cuda" if torch.cuda.is_available() else "cpu")
            print(f"{n} MoE layers: packed in {time.perf_counter() - t0:.0f} s", flush=True)
            for mode in modes:
                replay = Replay.from_prior("olmoe-like", n, plan.n_experts, plan.top_k, tokens=4096, seed=11)
                base, *suffixes = mode.split("_")
                per_graph = next((int(x[1:]) for x in suffixes if x[:1] == "k"), a.tokens_per_graph)
                try:
                    r = measure(packed, plan, mode=base, tokens=a.tokens, warmup=a.warmup, replay=replay,
                                device=a.device, ring_poll_s=a.poll_us * 1e-6 if "poll" in suffixes else None,
                                options=EngineOptions(tokens_per_graph=per_graph))
                except Exception as err:                # noqa: BLE001 (recorded; the next run goes on)
                    record_failure(errors, f"{n} layers/{mode}", err)
                    continue
                finally:
                    gc.collect()
                runs[f"{n}/{mode}"] = r
                tp, k = r["time_per_token"], f"layers{n}.{mode}"
                B = r["bytes_per_token"]["ram"]
                metrics[f"{k}.decode_tok_s"] = r["measured"]["decode_tok_s"]
                metrics[f"{k}.tokens_per_graph"] = r["tokens_per_graph"]
                metrics[f"{k}.host_ms_per_token"] = tp["host_cpu_s"] * 1e3
                for part, v in (tp.get("host_cpu_parts_s") or {}).items():     # where it goes: step call, copy, read
                    metrics[f"{k}.host_ms_per_token.{part}"] = v * 1e3
                metrics[f"{k}.ram_gb_per_token"] = B / 1e9
                line = f"{n:3d} layers {mode:9s} {r['measured']['decode_tok_s']:8.2f} tok/s, host {tp['host_cpu_s'] * 1e3:.3f} ms/tok"
                if tp["device_compute_s"] is not None:
                    metrics[f"{k}.gpu_ms_per_token"] = tp["device_compute_s"] * 1e3
                    gpu[mode].append((n, tp["device_compute_s"] * 1e3))
                    line += f", GPU {tp['device_compute_s'] * 1e3:.2f} ms/tok"
                if r["device_step"]:
                    metrics[f"{k}.replay_cpu_ms"] = r["device_step"]["step_replay_cpu_s"] * 1e3   # the launch alone
                    rate, _ = zero_copy_gbps(max(B / n, 1 << 20))
                    bound = 1.0 / (r["device_step"]["without_moe_s"] + B / (rate * 1e9))
                    metrics[f"{k}.bound_tok_s"] = bound
                    metrics[f"{k}.over_bound"] = r["measured"]["decode_tok_s"] / bound
                    line += f", {metrics[k + '.over_bound']:.3f} of its bound {bound:.1f}"
                print(line, flush=True)
                save()
            shutil.rmtree(packed, ignore_errors=True)
        for mode, pts in gpu.items():
            if len(pts) >= 2:
                x, y = np.array(pts, dtype=float).T
                slope, icpt = np.polyfit(x, y, 1)
                metrics[f"{mode}.gpu_ms_per_moe_layer"] = float(slope)
                metrics[f"{mode}.gpu_ms_fixed"] = float(icpt)
                metrics[f"{mode}.linear_max_residual"] = float(np.max(np.abs(y - (slope * x + icpt)) / y))
    finally:
        save()
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(metrics, indent=1))
    print(path, f"({len(errors)} failed)" if errors else "")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
