"""Diagnostic (GPU, about a minute): what splitting an NVMe blob into sub-reads costs the device loop's stager.

    python3 benchmarks/tools/split_ab.py [--splits 1,8,16] [--repeats 2] [--tokens 32]

The committed fixture packed in BF16 (49 KB blobs), every routed expert on NVMe, depth 0: the same plan with each
blob read as 1, 8 or 16 O_DIRECT requests in flight (`staging.nvme_reads`, as a plan records the planner's
choice), runs interleaved. Prints per split the decode tok/s, the GPU's wait a token, the demand reads a token, and
the stager's host side of a demand read (queue, read; the queue by the read's turn in its request). Not a
benchmark: no results file. On the H100 machine (2026-12-05, two calls, medians of 2 interleaved repeats, 20 demand
reads a token):

    split      1      2      4      8     16
    tok/s    358-398  184    128    120    70
    read ms  0.14-0.16 0.58  0.94   1.08   1.89

A blob read through the pool (split >= 2) costs the stager's host about 0.3 ms plus 0.1 ms a sub-read."""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_engine_run import FIXTURE, bf16_plan  # noqa: E402

from strata_plan.core.plan import NvmeRead  # noqa: E402
from strata_plan.engine.bench import measure  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", default="1,8,16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    from strata_plan.cli import main as cli
    packed = Path(tempfile.mkdtemp()) / "packed"
    assert cli(["pack", str(FIXTURE), "--out", str(packed), "--format", "bf16", "--json"]) == 0
    base = bf16_plan(0, 0, 0, 0, chunk=1)
    k = base.top_k
    rows: dict[int, list] = {}
    ranks: dict[int, list] = {}
    for _ in range(a.repeats):
        for s in (int(x) for x in a.splits.split(",")):
            plan = dataclasses.replace(base, staging=dataclasses.replace(base.staging, nvme_reads={
                "bf16": NvmeRead(split=s, queue_depth=k * s, batch_splits=(s,) * k)}))
            r = measure(packed, plan, "lru", tokens=a.tokens, warmup=8)
            st = r["stager"]
            rows.setdefault(s, []).append((r["measured"]["decode_tok_s"], r["time_per_token"]["stage_wait_s"] * 1e3,
                                           st["demand_reads_per_token"], st["demand_queue_ms_mean"],
                                           st["demand_read_ms_mean"], st["poll_gap_ms_max"]))
            ranks.setdefault(s, []).append(st["demand_queue_ms_by_rank"])
    print("split  tok/s  GPU wait ms/tok  demand reads/tok  stager queue ms  read ms  poll gap max ms (medians)")
    for s, v in rows.items():
        med = [statistics.median(x) for x in zip(*v)]
        print(f"{s:5d} {med[0]:7.1f} {med[1]:15.2f} {med[2]:17.1f} {med[3]:16.3f} {med[4]:8.3f} {med[5]:16.2f}")
        by_rank = [round(statistics.median(x), 3) for x in zip(*ranks[s])]
        print(f"      stager queue ms of a request's 1st, 2nd, .. demand read (medians): {by_rank}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
