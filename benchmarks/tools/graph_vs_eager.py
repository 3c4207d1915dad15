"""Diagnostic: where the graphed decode loop's logits part from its eager segments (GPU).

    python3 benchmarks/tools/graph_vs_eager.py

Packs the committed fixture with bf16 experts, runs the same plan and prompt through the graphed loop and
through its segments run eagerly (twice, to see the eager path's own run-to-run spread), and prints per
decode step the largest logit difference and whether every MoE layer routed the same experts. Not a
benchmark: no results file.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from strata_plan.cli import main as cli  # noqa: E402
from strata_plan.engine import store_experts  # noqa: E402
from strata_plan.engine.engine import Engine, EngineOptions  # noqa: E402
from strata_plan.engine.graphed import GraphedDecode  # noqa: E402
from test_engine_run import PROMPT, bf16_plan  # noqa: E402

ROUTED: list = []
_prepare = store_experts.StoreExperts.prepare


def prepare(self, j, topk_ids, topk_weights):
    out = _prepare(self, j, topk_ids, topk_weights)
    ROUTED.append((j, out[0].cpu().tolist()))
    return out


store_experts.StoreExperts.prepare = prepare


def run(packed, plan, mode: str, graphs: bool, new: int = 6):
    ROUTED.clear()
    with Engine.open(packed, plan, EngineOptions(mode=mode, device="cuda" if torch.cuda.is_available() else "cpu")) as eng:
        m = eng.model
        if not graphs:
            m.step_runner = GraphedDecode(m, eng.experts, graphs=False)
        m.reset()
        logits = [m.prefill(PROMPT, chunk=plan.prefill_chunk)]
        for _ in range(new):
            logits.append(m.decode_step(int(logits[-1].argmax())))
        return torch.stack(logits), list(ROUTED)


def main() -> int:
    packed = Path(tempfile.mkdtemp()) / "packed"
    assert cli(["pack", str(ROOT / "tests/data/fixture-moe"), "--out", str(packed), "--format", "bf16"]) == 0
    for split, mode in [((4, 10, 3, 2), "plan"), ((4, 10, 3, 2), "lru"), ((2, 6, 0, 0), "on-demand")]:
        plan = bf16_plan(*split)
        e1, r1 = run(packed, plan, mode, graphs=False)
        e2, r2 = run(packed, plan, mode, graphs=False)
        g, rg = run(packed, plan, mode, graphs=True)
        print(f"== {mode}: eager vs eager max |diff| per row {[round(float(x), 4) for x in (e1 - e2).abs().amax(1)]}")
        print(f"   graphs vs eager max |diff| per row {[round(float(x), 4) for x in (g - e1).abs().amax(1)]}")
        print(f"   routed ids equal (eager, eager): {r1 == r2}; (graphs, eager): {rg == r1}")
        for i, (a, b) in enumerate(zip(rg, r1)):
            if a != b:
                print(f"   first routing difference at MoE call {i} (layer {a[0]}): graphs {a[1]} eager {b[1]}")
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
