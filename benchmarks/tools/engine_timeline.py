"""Diagnostic: where a decode token's time goes in the engine (host phases and a torch profiler trace).

    python3 benchmarks/tools/engine_timeline.py --dir /root/kimi5 --plan tests/data/plan-kimi5-h200-ramrich.yaml \
        --mode lru --tokens 8 --out-dir $OUT

Builds the synthetic model if the folder has none. Host time of each phase (router round trip, ensure,
the MoE launch, release, attention and the rest of the layer) is summed per token with perf_counter
around the engine's own functions; the torch profiler gives the device side (kernel and copy times) for
a few tokens: its table goes to timeline-<mode>.txt under --out-dir, its Chrome trace to
trace-<mode>-<graphs>.json (open in Perfetto), and the device's overlap is printed: the time a token's
host-to-device copies and its kernels each keep the GPU busy, both at once, and neither (where the copies
wait, if they do). Not a benchmark: no results file.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from strata_plan.engine import store_experts
from strata_plan.engine.engine import Engine, EngineOptions
from strata_plan.engine.model import MoEModel
from strata_plan.engine.replay import Replay
from strata_plan.engine.store import ExpertStore
from strata_plan.engine.synthetic import pack_synthetic
from strata_plan.core.plan import load_plan
from strata_plan.core.spec import load_spec

HOST = defaultdict(float)


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged, sorted intervals."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(spans) -> float:
    return sum(b - a for a, b in spans)


def overlap(prof, tokens: int) -> str:
    """Device time per token (us) of H2D copies, kernels, both at once and neither, over the profiled span."""
    copies, kernels = [], []
    for e in prof.events():
        if getattr(e, "device_type", None) is None or str(e.device_type) != "DeviceType.CUDA":
            continue
        span = (e.time_range.start, e.time_range.end)
        (copies if "Memcpy HtoD" in e.name else kernels if "Memcpy" not in e.name and "Memset" not in e.name
         else []).append(span)
    if not copies and not kernels:
        return "no device events (CPU run)"
    c, k = union(copies), union(kernels)
    lo, hi = min(x[0] for x in c + k), max(x[1] for x in c + k)
    both = length(union([(max(a, x), min(b, y)) for a, b in c for x, y in k if min(b, y) > max(a, x)]))
    total = hi - lo
    neither = total - (length(c) + length(k) - both)
    f = lambda v: f"{v / tokens / 1e3:.2f}"   # noqa: E731  us over the span -> ms a token
    return (f"device ms/token over {tokens} tokens: span {f(total)}, H2D copies {f(length(c))}, kernels "
            f"{f(length(k))}, both at once {f(both)}, neither {f(neither)}")


def timed(owner, name: str, label: str) -> None:
    static = isinstance(owner.__dict__.get(name), staticmethod) if isinstance(owner, type) else False
    fn = getattr(owner, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            HOST[label] += time.perf_counter() - t0
    setattr(owner, name, staticmethod(wrapper) if static else wrapper)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--modes", default="lru,plan")
    ap.add_argument("--graphs", default="1,0", help="with CUDA graphs (1), eager (0), or both")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--out-dir", default=".")
    a = ap.parse_args()
    plan = load_plan(a.plan)
    folder = Path(a.dir)
    if not (folder / "index.json").exists():
        t0 = time.perf_counter()
        pack_synthetic(load_spec(plan.model), folder,
                       [{e: l.format_of(e) for e in range(plan.n_experts)} for l in plan.layers], device="cuda" if torch.cuda.is_available() else "cpu")
        print(f"built in {time.perf_counter() - t0:.0f} s", flush=True)
    timed(ExpertStore, "ensure", "ensure")
    timed(ExpertStore, "release", "release")
    timed(store_experts, "fused_moe", "fused_moe launch")
    timed(MoEModel, "attention_part", "attention launch")
    timed(MoEModel, "moe_output", "moe_output launch")
    timed(MoEModel, "logits", "logits launch")
    for mode, graphs in [(m, g == "1") for m in a.modes.split(",") for g in a.graphs.split(",")]:
        replay = Replay.from_prior("olmoe-like", len(plan.layers), plan.n_experts, plan.top_k, tokens=4096, seed=11)
        with Engine.open(folder, plan, EngineOptions(mode=mode, graphs=graphs), replay=replay) as eng:
            m, ex = eng.model, eng.experts
            tok = m.prefill([1, 2, 3, 4], 4).argmax()
            for _ in range(a.warmup):
                tok = m.decode_step(tok).argmax()
            int(tok)
            HOST.clear()
            sync0 = ex.host_sync_s
            per = []
            for _ in range(a.tokens):
                t0 = time.perf_counter()
                tok = m.decode_step(tok).argmax()
                int(tok)
                per.append(time.perf_counter() - t0)
            n = a.tokens
            print(f"== {mode} graphs={graphs}: median {statistics.median(per) * 1e3:.2f} ms/token; host ms/token:")
            print(f"   router round trip (.cpu() wait) {(ex.host_sync_s - sync0) / n * 1e3:.3f}")
            for k, v in sorted(HOST.items()):
                print(f"   {k:22s} {v / n * 1e3:.3f}")
            if graphs:
                print(f"   segment launches (graph replays) since start: {m.step_runner.launch_s * 1e3:.1f} ms")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    tok = m.decode_step(tok).argmax()
                    int(tok)
            table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40)
            table_cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
            Path(a.out_dir, f"timeline-{mode}-{int(graphs)}.txt").write_text(table + "\n\n" + table_cpu)
            prof.export_chrome_trace(str(Path(a.out_dir, f"trace-{mode}-{int(graphs)}.json")))
            print("  ", overlap(prof, 3))
            print(table[:6000])
            print(table_cpu[:4000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
