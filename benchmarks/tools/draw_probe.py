"""Diagnostic (GPU, seconds): what a decode step's token pick costs inside a CUDA graph, by way of picking.

    python3 benchmarks/tools/draw_probe.py [--vocab 16384,163840] [--reps 200]

Each pick is captured alone in a CUDA graph over random float32 logits and replayed back to back (CUDA events, median
of `--reps`): the argmax (greedy) and `engine.picks.GumbelPick` (softmax, sort and cumsum for the nucleus, then
about 25 small kernels of hashing and noise, and the argmax). Prints the microseconds of each at top-p 1 and 0.95.
The profiler's `pick_us` is the draw over the argmax inside the model's head graph. Not a benchmark: no results
file."""
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
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("draw_probe: needs a CUDA GPU")
        return 2
    print(torch.cuda.get_device_name())
    print(f"{'vocab':>7} {'top_p':>6} {'argmax us':>10} {'draw us':>10}")
    for V in (int(x) for x in a.vocab.split(",")):
        logits = torch.randn(V, device="cuda") * 3
        for top_p in (1.0, 0.95):
            t = [graph_us(lambda p=p: p(logits), a.reps) for p in (GREEDY, GumbelPick(1.0, top_p, 1))]
            print(f"{V:>7} {top_p:>6} {t[0]:>10.1f} {t[1]:>10.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
