"""Diagnostic: the kernel launches one decode token makes in the device loop, by mode and lookahead depth.

    python benchmarks/tools/count_launches.py [--packed DIR --plan PLAN] [--runs lru,plan:1,plan:2,on-demand]

At batch 1 a small model's token is launch-bound (a few microseconds a kernel, even in a CUDA graph), so the count is
what a mode adds to the GPU time before any byte moves. One eager decode step after a warm-up step: torch operators
that launch a kernel on a GPU (views, shape queries and allocations left out) and Triton launches, by name. Without
--packed: the committed fixture packed in BF16, its plan with 10% of each layer's experts in VRAM, 2 LRU slots, the
rest in pinned RAM. `plan:D` runs the plan with lookahead depth D (`_plans.forced_depth`). On a CPU the kernels run
in Triton's interpreter (TRITON_INTERPRET=1, set here). Not a benchmark: no results file.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from _plans import forced_depth, tiers_by_hand  # noqa: E402
from strata_plan.core.plan import load_plan  # noqa: E402
from strata_plan.engine.launches import decode_step_launches  # noqa: E402

FIXTURE = ROOT / "tests" / "data" / "fixture-moe"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packed", type=Path, help="a packed folder (default: the fixture, packed in BF16 here)")
    ap.add_argument("--plan", help="its plan (default: the fixture's, tiered by hand)")
    ap.add_argument("--runs", default="lru,plan:1,plan:2,on-demand")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        packed = a.packed
        if packed is None:
            from strata_plan.cli import main as cli
            packed = Path(tmp) / "packed"
            assert cli(["pack", str(FIXTURE), "--out", str(packed), "--format", "bf16", "--json"]) == 0
        base = load_plan(a.plan) if a.plan else tiers_by_hand(load_plan(FIXTURE / "plan-rtx-4090.yaml"), 0.1, 2, "bf16")
        L = len(base.layers)
        first = None
        for run in a.runs.split(","):
            mode, _, depth = run.partition(":")
            plan = forced_depth(base, int(depth)) if depth else base
            got = decode_step_launches(packed, plan, mode, a.device)
            n = got.total
            first = first or n
            print(f"{run:10s} {n:5d} launches a token ({n / L:.1f} a MoE layer, {n / first:.2f}x the first run): "
                  f"torch {sum(got.torch.values())}, Triton {dict(got.triton)}")
            print(f"{'':10s} most run torch operators: {got.torch.most_common(8)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
