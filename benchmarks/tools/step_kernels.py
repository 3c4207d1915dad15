"""Diagnostic (GPU, about a minute): where a decode token's GPU time goes, kernel by kernel, in the device loop's graph.

    python3 benchmarks/tools/step_kernels.py [--packed DIR --plan PLAN] [--runs on-demand,lru,plan:0,plan:1,plan:1/4]
    # prints a table a run and the change from the first run; writes $OUT/step_kernels.json (not a benchmark)

Without --packed: bench-moe's geometry (benchmarks/data/trained-20261203) with random weights, packed here in the
formats of the RAM-rich plan committed beside it. `plan:D` runs the plan at lookahead depth D (`_plans.forced_depth`),
`plan:D/P` with the lookahead's copy kernel on P thread blocks, `plan:Dw` with whole experts only (no partial
landing). Each run in a process of its own (`--inproc`: all in this one, in order; `--no-profile`: time_parts alone,
no tracing); the SM clock sampled while its replays run (`sm_mhz_during`). Per run: a short prefill, eight greedy
decode steps (the step's graph captured at the second), then the graph replayed under torch.profiler (CUPTI reports the
kernels a graph runs), one replay at a time. Kernels on another stream than the replay's first (the lookahead's side
stream) are listed apart; on the token's main chain each kernel is charged its duration and the idle gap before it
(the graph's launch latency between dependent kernels, and any wait on an event). Medians over the replays,
microseconds a token. In a replay the graph's branches run on streams of the graph's own choosing, so "main" (the
replay's first kernel's stream) is a guess once the graph forks; `gpu_idle_us` (no kernel on any stream) and the
median replay's `timeline` (name, stream, start, duration) are not, nor its `copies` (when each lookahead copy started
after the MoE layer before it, how long it ran, how much of it before the next layer's resolve).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _plans import forced_depth  # noqa: E402
from strata_plan.core.modes import baseline  # noqa: E402
from strata_plan.core.plan import load_plan  # noqa: E402

TRAINED = ROOT / "benchmarks" / "data" / "trained-20261203"
SPLIT_US = 300.0                                              # replays are apart by more than this (a sleep)


def replay_kernels(g, reps: int) -> list[list[dict]]:
    """The kernels of `reps` replays of graph `g` (chrome-trace events: name, ts, dur in us), one list a replay."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
            torch.cuda.synchronize()
            time.sleep(0.002)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    ks = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    out, cur, end = [], [], None
    for e in ks:
        if end is not None and e["ts"] - end > SPLIT_US:
            out.append(cur)
            cur = []
        cur.append(e)
        end = max(end or 0.0, e["ts"] + e["dur"])
    return out + ([cur] if cur else [])


def short(name: str) -> str:
    """A kernel's name without its template arguments (torch's kernels are long C++ names)."""
    n = name.replace("(anonymous namespace)::", "").removeprefix("void ")
    n = n.split("(")[0].split("<")[0]
    return n.rsplit("::", 1)[-1][:60] or name[:60]


def account(replays: list[list[dict]]) -> dict:
    """Per kernel name, microseconds a token: calls, duration and the main chain's idle gap before it; the wall. The
    main chain is the stream (as CUPTI reports it) of the replay's first kernel; a kernel on another is `side`."""
    per = defaultdict(lambda: defaultdict(list))
    walls, totals = [], defaultdict(list)
    for ks in replays:
        got = defaultdict(lambda: [0, 0.0, 0.0])
        end = None
        main = ks[0].get("args", {}).get("stream")
        for e in ks:
            side = e.get("args", {}).get("stream") != main
            g = got[("side " if side else "") + short(e["name"])]
            g[0] += 1
            g[1] += e["dur"]
            if not side:
                if end is not None:
                    g[2] += max(0.0, e["ts"] - end)
                end = max(end or 0.0, e["ts"] + e["dur"])
        walls.append(max(e["ts"] + e["dur"] for e in ks) - ks[0]["ts"])
        totals["gpu_idle_us"].append(walls[-1] - union_us(ks))
        for key, k in (("main_busy_us", 1), ("main_idle_us", 2)):
            totals[key].append(sum(v[k] for name, v in got.items() if not name.startswith("side ")))
        totals["side_busy_us"].append(sum(v[1] for name, v in got.items() if name.startswith("side ")))
        for name, (n, d, gap) in got.items():
            per[name]["calls"].append(n)
            per[name]["dur_us"].append(d)
            per[name]["gap_us"].append(gap)
    rows = {name: {k: statistics.median(v + [0] * (len(replays) - len(v))) for k, v in cols.items()}
            for name, cols in per.items()}
    mid = replays[sorted(range(len(walls)), key=walls.__getitem__)[len(walls) // 2]]
    t0 = mid[0]["ts"]                      # the median replay's kernels: name, stream, start and duration (us)
    timeline = [[short(e["name"]), e.get("args", {}).get("stream"), round(e["ts"] - t0, 3), e["dur"]] for e in mid]
    streams = len({e.get("args", {}).get("stream") for e in mid})   # the lanes the replay ran on
    return {"wall_us": statistics.median(walls), "replays": len(replays), "kernels": rows, "streams": streams,
            **{k: statistics.median(v) for k, v in totals.items()}, "timeline": timeline,
            "copies": copy_windows(mid)}


MOE_END = "down_kernel"                                       # a MoE layer's last kernel on the main chain
RESOLVE = ("resolve_step_kernel", "resolve_kernel")           # the next MoE layer's first look at its guesses


def copy_windows(ks: list[dict]) -> dict:
    """The lookahead's copies against the main chain's layers in one replay (us): for each copy kernel, how long after
    the MoE layer before it ended it started (`start_after_moe`), how long it ran, and how much of its run came before
    the next layer's resolve (`before_resolve`: what it could land for that layer); medians over the copies. Main-chain
    kernels are known by name (`MOE_END`, `RESOLVE`), not stream: a graph's branches run on streams of its choosing."""
    by = sorted(ks, key=lambda e: e["ts"])
    rows = []
    for c in (e for e in by if short(e["name"]) == "copy_kernel"):
        ended = [e["ts"] + e["dur"] for e in by if short(e["name"]) == MOE_END and e["ts"] + e["dur"] <= c["ts"]]
        nxt = [e["ts"] for e in by if short(e["name"]) in RESOLVE and e["ts"] >= c["ts"]]
        if ended and nxt:
            rows.append((c["ts"] - max(ended), c["dur"], min(c["dur"], min(nxt) - c["ts"])))
    keys = ("start_after_moe_us", "dur_us", "before_resolve_us")
    return {"n": len(rows), **{k: statistics.median(r[i] for r in rows) if rows else None for i, k in enumerate(keys)}}


def union_us(ks: list[dict]) -> float:
    """Microseconds in which at least one kernel ran (any stream)."""
    busy, end = 0.0, None
    for e in sorted(ks, key=lambda e: e["ts"]):
        a, b = e["ts"], e["ts"] + e["dur"]
        if end is None or a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return busy


def gpu_state() -> dict:
    """The GPU's SM and memory clocks (MHz), temperature and power (W) now (NVML)."""
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1e3}


class ClockSampler:
    """The GPU's SM clock (MHz, NVML) sampled every `every_s` on a thread while the block runs: did the clock drop
    while the step waited (a one-program spin leaves the GPU nearly idle)?"""

    def __init__(self, every_s: float = 2e-4):
        import threading

        import pynvml
        pynvml.nvmlInit()
        self._h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        self._nv, self.every, self.mhz = pynvml, every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.mhz.append(self._nv.nvmlDeviceGetClockInfo(self._h, self._nv.NVML_CLOCK_SM))
            time.sleep(self.every)

    def __enter__(self) -> "ClockSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        m = sorted(self.mhz) or [0]
        return {"samples": len(self.mhz), "min": m[0], "median": m[len(m) // 2], "max": m[-1]}


def one_run(packed: Path, plan, mode: str, programs: int, reps: int, profile: bool = True,
            partial_landing: bool = True) -> dict:
    from strata_plan.engine.engine import Engine, EngineOptions
    opts = EngineOptions(mode=mode, device="cuda", copy_programs=programs, partial_landing=partial_landing)
    with Engine.open(packed, plan, opts) as eng:
        m = eng.model
        m.reset()
        m.prefill(list(range(5, 69)), eng.plan.prefill_chunk)
        tok = torch.tensor([3], dtype=torch.long, device=m.device)
        for _ in range(8):
            tok = m.decode_step(tok, greedy=True)
        torch.cuda.synchronize()
        runner = m.step_runner
        g = runner._graphs["greedy"][0]            # the captured single-token greedy step (device_loop.DeviceDecode)
        with ClockSampler() as clock:
            got = account(replay_kernels(g, reps)) if profile else {"wall_us": 0.0, "replays": 0, "kernels": {}}
        got["gpu"] = gpu_state()
        got["sm_mhz_during"] = clock.summary()
        got["time_parts_us"] = {k: v * 1e6 for k, v in runner.time_parts().items() if k.endswith("_s")}
    return got


def show(name: str, r: dict, first: dict | None) -> None:
    if r["replays"]:
        print(f"\n{name}: main stream busy {r['main_busy_us']:.1f} us, idle between its kernels "
              f"{r['main_idle_us']:.1f}; side stream busy {r['side_busy_us']:.1f}; no kernel running "
              f"{r['gpu_idle_us']:.1f}; {r['streams']} streams", end="")
    print(f"\n{name}: wall {r['wall_us']:.1f} us a token ({r['replays']} replays); time_parts "
          + ", ".join(f"{k} {v:.1f}" for k, v in r["time_parts_us"].items()) + f"; GPU {r['gpu']}; SM MHz "
          f"during the replays {r.get('sm_mhz_during')}")
    c = r.get("copies") or {}
    if c.get("n"):
        print(f"  lookahead copies (median of {c['n']}): start {c['start_after_moe_us']:.1f} us after the MoE layer "
              f"before them, run {c['dur_us']:.1f} us, {c['before_resolve_us']:.1f} of it before the next resolve")
    ks = r["kernels"]
    keys = sorted(set(ks) | set(first["kernels"] if first else ()),
                  key=lambda k: -(ks.get(k, {}).get("dur_us", 0) + ks.get(k, {}).get("gap_us", 0)))
    print(f"  {'kernel':62s} {'calls':>6s} {'dur':>8s} {'gap':>8s}"
          + ("  change dur+gap from the first run" if first else ""))
    for k in keys:
        a = ks.get(k, {"calls": 0, "dur_us": 0.0, "gap_us": 0.0})
        line = f"  {k:62s} {a['calls']:6.0f} {a['dur_us']:8.1f} {a['gap_us']:8.1f}"
        if first:
            b = first["kernels"].get(k, {"dur_us": 0.0, "gap_us": 0.0})
            line += f"  {a['dur_us'] + a['gap_us'] - b['dur_us'] - b['gap_us']:+8.1f}"
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packed", type=Path, help="a packed folder (default: bench-moe's geometry, random weights)")
    ap.add_argument("--plan", help="its plan (default: benchmarks/data/trained-20261203/plan-ramrich.yaml)")
    ap.add_argument("--runs", default="on-demand,lru,plan:0,plan:1,plan:1/4,plan:2")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--inproc", action="store_true", help="every run in this process, one after another")
    ap.add_argument("--no-profile", action="store_true", help="no kernel trace: each run's time_parts alone")
    ap.add_argument("--one", help=argparse.SUPPRESS)           # (a child process: this one run into --json)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    a = ap.parse_args()
    plan_path = a.plan or str(TRAINED / "plan-ramrich.yaml")
    base = load_plan(plan_path)

    def run_here(run: str) -> dict:
        mode, _, rest = run.partition(":")
        depth, _, programs = rest.partition("/")
        whole = depth.endswith("w")
        depth = depth.removesuffix("w")
        plan = forced_depth(base, int(depth)) if depth else baseline(base, mode)
        return one_run(packed, plan, mode, int(programs or 0), a.reps, not a.no_profile, partial_landing=not whole)

    packed = a.packed
    if a.one:
        Path(a.json).write_text(json.dumps(run_here(a.one)))
        return 0
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        if packed is None:
            from strata_plan.cli import main as cli
            packed = Path(tmp) / "packed"
            cfg = TRAINED / "bench-moe" / "config.json"
            assert cli(["pack", "--synthetic", str(cfg), "--plan", plan_path, "--out", str(packed), "--json"]) == 0
        print(f"{torch.cuda.get_device_name()}: {packed}, plan {plan_path} (depth {base.prefetch_depth})")
        first = None
        for run in a.runs.split(","):
            got = Path(tmp) / "one.json"
            if a.inproc:
                r = run_here(run)
            else:
                subprocess.run([sys.executable, __file__, "--one", run, "--packed", str(packed), "--plan", plan_path,
                                "--reps", str(a.reps), "--json", str(got)] + ["--no-profile"] * a.no_profile,
                               check=True)
                r = json.loads(got.read_text())
            results[f"{run}#{len(results)}"] = r
            show(run, r, first)
            first = first or r
    out = Path(os.environ.get("OUT", "."))
    name = f"step_kernels{'-inproc' * a.inproc}{'-noprofile' * a.no_profile}.json"
    (out / name).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
