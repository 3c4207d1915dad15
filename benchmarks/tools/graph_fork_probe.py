"""Diagnostic (GPU, about 10 s): does forking a side branch inside a CUDA graph slow the main chain's every launch?
In the decode step's graph (benchmarks/tools/step_kernels.py, trained model, H100) the idle gap before each
main-chain kernel was about 0.1 us without the lookahead's side stream and about 0.43 us with it, kernels where no
side kernel was running included: some 370 kernels a token, about 120 us. This times a chain of N small kernels in
one graph with the side branch's shape varied:

    python3 benchmarks/tools/graph_fork_probe.py      # prints us a main-chain kernel; writes $OUT/graph_fork_probe.json

  linear         N in-place adds, one stream
  fork_once      a side branch (one add on another tensor) forked at the start, joined at the end
  forks_end      a side branch forked every N / FORKS adds, all joined at the end (the decode step's shape)
  forks_joined   the same, each branch joined back FORK_SPAN adds after its fork
  outside        the linear graph, a kernel on another stream outside the graph running beside it (torch.cuda._sleep)
  triton_linear  one stream, a Triton kernel (kernels.prefetch.release) every N / FORKS adds
  memcpy_linear  one stream, a small device copy (a memcpy node) every N / FORKS adds
  lookahead      forks_end with the lookahead's side work a branch (guesses noted, claimed, copied: 4 KiB experts)
  lookahead_pri  the same, the side stream at the device's highest priority
Median of 15 replays each, CUDA events on the main stream. Not a benchmark: no results file."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from launch_under_load import chain_us        # (this folder: the same chain timing)
from strata_plan.profiler.gpu import captured

N, FORKS, FORK_SPAN = 400, 9, 4


def chain(forks: int, join_after: int | None, branch=None, inline=None, priority: int = 0):
    """N adds on x; `forks` side branches (`branch(i)`, default an add on y) forked at even steps, joined
    `join_after` adds later (None: at the end); or, with `inline(i)`, no fork: that work on the chain itself."""
    x = torch.zeros(1, device="cuda")
    y = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream(priority=priority)
    at = {i * N // forks: i for i in range(forks)} if forks else {}
    branch = branch or (lambda i: y.add_(1.0))

    def work() -> None:
        main = torch.cuda.current_stream()
        open_until = None
        for i in range(N):
            if i in at and inline is not None:
                inline(at[i])
            elif i in at:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    branch(at[i])
                open_until = None if join_after is None else i + join_after
            if open_until is not None and i == open_until:
                main.wait_stream(side)
                open_until = None
            x.add_(1.0)
        if forks and inline is None:
            main.wait_stream(side)
        if inline is None and hasattr(branch, "end"):
            branch.end()
    return captured(work), x


class Lookahead:
    """A fork's side work as the decode graph's (engine/prefetch.py): slots of layers <= i freed, guesses for layer
    i + 1 noted, claimed and copied (4 KiB experts, kernels.prefetch.probe_state); every slot freed at the end."""

    def __init__(self):
        from strata_plan.kernels import prefetch as pk
        self.pk = pk
        self.st = pk.probe_state(24, FORKS + 1, 64, 8, "cuda", ram_base=24 * 4096)
        self.arena = torch.zeros((24 + (FORKS + 1) * 64) * 4096, dtype=torch.uint8, device="cuda")
        self.ids = torch.arange(8, dtype=torch.int64, device="cuda")

    def __call__(self, i: int) -> None:
        self.pk.release(i, self.st)                   # as the engine's side stream: slots of layers <= i freed first
        self.pk.note_guesses(self.ids, i + 1, self.st)
        self.pk.claim(self.ids, i + 1, self.st)
        self.pk.copy(self.arena, self.ids, i + 1, self.st, 4096)

    def end(self) -> None:
        self.pk.release(FORKS, self.st)


def timed(g: torch.cuda.CUDAGraph, beside=None) -> float:
    return chain_us(g, beside, torch.cuda.Stream(), n=N, reps=15, warmup=2)


def main() -> None:
    from strata_plan.kernels import prefetch as pk
    st = pk.probe_state(24, FORKS + 1, 64, 8, "cuda")
    a, b = torch.zeros(2, device="cuda"), torch.ones(2, device="cuda")
    graphs = {"linear": chain(0, None), "fork_once": chain(1, None), "forks_end": chain(FORKS, None),
              "forks_joined": chain(FORKS, FORK_SPAN),
              "triton_linear": chain(FORKS, None, inline=lambda i: pk.release(i, st)),
              "memcpy_linear": chain(FORKS, None, inline=lambda i: a.copy_(b)),
              "lookahead": chain(FORKS, None, branch=Lookahead()),
              "lookahead_pri": chain(FORKS, None, branch=Lookahead(), priority=-100)}
    got = {name: timed(g) for name, (g, _) in graphs.items()}
    got["outside"] = timed(graphs["linear"][0], lambda: torch.cuda._sleep(2_000_000))    # ~1 ms at 2 GHz
    got.update({f"{name} (again)": timed(g) for name, (g, _) in graphs.items()})       # order effects
    print(f"{torch.cuda.get_device_name()}: us a main-chain kernel of a {N}-kernel graph, {FORKS} forks, median of 15")
    for name, us in got.items():
        print(f"  {name:22s} {us:6.3f}  ({us / got['linear']:.2f}x linear)")
    out = Path(os.environ.get("OUT", "."))
    (out / "graph_fork_probe.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "us": got}, indent=1))


if __name__ == "__main__":
    main()
