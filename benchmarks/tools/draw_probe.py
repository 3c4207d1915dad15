"""Diagnostic (GPU, seconds): what a decode step's token pick costs inside a CUDA graph, by way of picking.

    python3 benchmarks/tools/draw_probe.py [--vocab 16384,163840] [--reps 200]

Each pick is captured alone in a CUDA graph over random float32 logits and replayed back to back (CUDA events, median
of `--reps`): the argmax (greedy), `engine.picks.GumbelPick` in torch (softmax, sort and cumsum for the nucleus, then
about 25 small kernels of hashing and noise, and the argmax), and the same pick with the hash, the noise and the argmax
in one kernel (`GumbelPick(fused=True)`, `kernels.draw`). Prints the microseconds of each at top-p 1 and 0.95, and
whether the fused and torch picks drew the same tokens over `--draws` steps. The profiler's `pick_us` is the torch
draw over the argmax inside the model's head graph. Not a benchmark: no results file."""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from strata_plan.engine.picks import GREEDY, GumbelPick
from strata_plan.kernels.bench import event_times, graph_of


def graph_us(fn, reps: int) -> float:
    """Median microseconds of `fn` captured in a CUDA graph, replayed back to back (`kernels.bench`)."""
    g = graph_of(fn)
    return statistics.median(event_times(g.replay, reps=reps, warmup=5)) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", default="16384,163840")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--draws", type=int, default=100)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("draw_probe: needs a CUDA GPU")
        return 2
    print(torch.cuda.get_device_name())
    print(f"{'vocab':>7} {'top_p':>6} {'argmax us':>10} {'torch draw us':>14} {'fused draw us':>14} {'same tokens':>12}")
    for V in (int(x) for x in a.vocab.split(",")):
        logits = torch.randn(V, device="cuda") * 3
        for top_p in (1.0, 0.95):
            plain, fused = GumbelPick(1.0, top_p, 1), GumbelPick(1.0, top_p, 1, fused=True)
            t = [graph_us(lambda p=p: p(logits), a.reps) for p in (GREEDY, plain, fused)]
            p2, f2 = GumbelPick(1.0, top_p, 2), GumbelPick(1.0, top_p, 2, fused=True)
            same = sum(int(p2(logits)) == int(f2(logits)) for _ in range(a.draws))
            print(f"{V:>7} {top_p:>6} {t[0]:>10.1f} {t[1]:>14.1f} {t[2]:>14.1f} {same:>6}/{a.draws}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
