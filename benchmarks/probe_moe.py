"""Where the decode MoE launches spend their time: every program's SM, start and end (%globaltimer), on
the H200 through the device tool. One layer in the tier mix, the launch configs tuned.py ships (or
--cfg JSON overrides), graph-replay medians of both launches over 8 rotating layers, then one probed
call of each launch, replayed in a CUDA graph after the other layers (PROBE=1: a separate build that
records, per program, the SM id and the start and end times in ns, plus the expert's format code), and
both launches on one clock (`timeline_us`: the gap between them as a graph runs them).

    python benchmarks/probe_moe.py --out OUT.json [--model kimi-k3.1-pro] [--cfg '{"BN2": 64}']

The summary answers: how many programs each SM ran, how long each SM was busy against the launch's
span (the idle tail of a wave), and how long programs of each format took. The probed build is not the
timed one: compare its span with the timed median before reading its programs' times (KERNELS.md).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from bench_kernels import LAYERS, SHAPES, shipped, tier_layers  # noqa: E402
from strata_plan.kernels import bench as B  # noqa: E402
from strata_plan.kernels import ops  # noqa: E402
from strata_plan.kernels.triton_common import FORMAT_CODES  # noqa: E402


def summarize(rec: torch.Tensor) -> dict:
    """rec int64 [programs, 4] = (sm, start ns, end ns, code + 8 * split), in block order; the records
    are kept (times in us from the launch's first start)."""
    rec = rec[rec[:, 1] > 0].tolist()
    t0 = min(r[1] for r in rec)
    span = max(r[2] for r in rec) - t0
    per_sm = defaultdict(list)
    for sm, a, b, _ in rec:
        per_sm[sm].append((a, b))
    busy = [max(b for _, b in v) - min(a for a, _ in v) for v in per_sm.values()]
    counts = [len(v) for v in per_sm.values()]
    by_code = defaultdict(list)
    for _, a, b, c in rec:
        by_code[FORMAT_CODES[c % 8] + (f" split {c // 8}" if c >= 8 else "")].append((b - a) / 1e3)
    return {"programs": len(rec), "span_us": span / 1e3, "sms_used": len(per_sm),
            "records_sm_start_end_code": [[sm, (a - t0) / 1e3, (b - t0) / 1e3, c] for sm, a, b, c in rec],
            "programs_per_sm": dict(sorted(((n, counts.count(n)) for n in set(counts)))),
            "sm_busy_us_median": statistics.median(busy) / 1e3, "sm_busy_us_min": min(busy) / 1e3,
            "sm_busy_fraction": sum(busy) / (len(busy) * span) if span else 0.0,
            "first_start_spread_us": (sorted(r[1] for r in rec)[min(len(rec), 132) - 1] - t0) / 1e3,
            "program_us_by_format": {k: {"n": len(v), "median": statistics.median(v), "max": max(v)}
                                     for k, v in sorted(by_code.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="kimi-k3.1-pro", choices=list(SHAPES))
    ap.add_argument("--cfg", default="{}", help="JSON overrides of the moe launch config")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    dev = torch.device("cuda")
    hidden, inter = SHAPES[a.model]
    cfg = {**shipped("moe"), **json.loads(a.cfg)}
    arena, offsets, fm, ids, wts, wbytes, _ = tier_layers(hidden, inter, dev)
    x = torch.randn(1, hidden, dtype=torch.bfloat16, device=dev)
    out = torch.empty(1, hidden, dtype=torch.bfloat16, device=dev)
    scs = [ops.moe_gate_up(x, i, arena, offsets, fm, hidden, inter, cfg) for i in ids]

    def gate_up():
        for i in ids:
            ops.moe_gate_up(x, i, arena, offsets, fm, hidden, inter, cfg)

    def down():
        for i, sc in zip(ids, scs):
            ops.moe_down(sc, i, wts, arena, offsets, fm, hidden, inter, out, cfg)
    res = {"model": a.model, "config": cfg,
           "gate_up_us": B.graph_ms(gate_up, reps=a.reps) / LAYERS * 1e3,
           "down_us": B.graph_ms(down, reps=a.reps) / LAYERS * 1e3}
    big = 1 << 16
    p1 = torch.zeros(big, 4, dtype=torch.int64, device=dev)
    p2 = torch.zeros(big, 4, dtype=torch.int64, device=dev)
    pcfg = {**cfg, "probe1": p1, "probe2": p2}
    def layers():                            # layers 1.. as timed, then the probed call on layer 0
        for i in ids[1:]:
            ops.moe_down(ops.moe_gate_up(x, i, arena, offsets, fm, hidden, inter, cfg), i, wts, arena, offsets, fm,
                         hidden, inter, out, cfg)
        ops.moe_down(ops.moe_gate_up(x, ids[0], arena, offsets, fm, hidden, inter, pcfg), ids[0], wts, arena, offsets,
                     fm, hidden, inter, out, pcfg)
    layers()                                 # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()           # replayed as the benchmark times it: a graph's launch gaps
    with torch.cuda.graph(graph):
        layers()
    for _ in range(2):
        p1.zero_()
        p2.zero_()
        graph.replay()
        torch.cuda.synchronize()
    res["gate_up_probe"] = summarize(p1.cpu())
    res["down_probe"] = summarize(p2.cpu())
    r1, r2 = p1[p1[:, 1] > 0].cpu(), p2[p2[:, 1] > 0].cpu()     # both launches on one clock
    t0 = int(r1[:, 1].min())
    res["timeline_us"] = {"gate_up_end": (int(r1[:, 2].max()) - t0) / 1e3,
                          "down_first_start": (int(r2[:, 1].min()) - t0) / 1e3,
                          "down_end": (int(r2[:, 2].max()) - t0) / 1e3}
    short = {k: ({kk: vv for kk, vv in v.items() if kk != "records_sm_start_end_code"} if isinstance(v, dict) else v)
             for k, v in res.items() if k != "config"}
    print(json.dumps(short))
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
