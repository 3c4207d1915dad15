"""How many programs the device loop's lookahead copy needs to reach the link's rate, and what it costs the kernels
running beside it (issue 41: measured, not assumed): `kernels.prefetch.copy` (persistent programs over 64 KiB chunks)
moving k experts from registered pinned RAM into VRAM slots at several program counts, beside a plain pinned H2D copy
of the same bytes on the copy engine, in one run; then, at each count, a main-stream workload of small GEMVs (an
attention's shapes) timed alone and with the copy running on a side stream. Medians of CUDA-event timings after a
warm-up.

    python3 benchmarks/bench_prefetch_copy.py [--experts 8] [--mb 21] [--programs 33,66,132,168,264,all] [--out-dir DIR]

Writes prefetch-copy-<time>.json: `copy_gbps.p<P>` per program count (`all`: a program for every chunk, the grid the
kernel had before it was persistent), `h2d_gbps` (the copy engine, the same bytes), `best_over_h2d`,
`beside.p<P>.main_slowdown` (the workload's time beside the copy / alone) and `beside.p<P>.copy_gbps` (the copy's rate
beside the workload). On a CPU (no GPU) it runs the interpreted kernel on a few small experts and checks the bytes
only: the figures mean nothing there.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from _result import write_result

from strata_plan.kernels import prefetch as pk


def _state(n_exp: int, nbytes: int, arena: torch.Tensor, ram_base: int, slot_base: int) -> pk.PrefetchState:
    dev = arena.device
    L, E = 1, n_exp
    i64 = dict(dtype=torch.int64, device=dev)
    return pk.PrefetchState(
        state=torch.arange(n_exp, **i64) * 8 + pk.FILLING,      # claimed (tag e, layer 0): copied
        slot_offset=torch.tensor([slot_base + i * nbytes for i in range(n_exp)], **i64),
        where=torch.full((L, E), -1, **i64), assign=torch.arange(n_exp, **i64),
        ram_rows=torch.tensor([[ram_base + e * nbytes for e in range(E)]], **i64),
        tier=torch.ones((L, E), dtype=torch.int8, device=dev), nbytes=torch.full((L, E), nbytes, **i64),
        table=torch.tensor([[ram_base + e * nbytes for e in range(E)]], **i64), src=None,
        counts=torch.zeros((L, pk.N_COUNTS), **i64), cached_hi=slot_base, guessed=torch.full((L, n_exp), -1, **i64))


def _time(fn, reps: int = 10) -> float:
    """Median seconds of fn's GPU work (`kernels.bench.event_times`)."""
    from strata_plan.kernels.bench import event_times
    return statistics.median(event_times(fn, reps=reps)) / 1e3


def beside(metrics: dict, counts, copy, nbytes: int, reps: int = 5) -> None:
    """At each program count: a main-stream workload of small GEMVs (bf16 [1536, 7168] x [7168], 22 MB each, an
    attention projection's shape) timed alone and while the copy runs on a side stream (both timed with events)."""
    dev = torch.device("cuda")
    w = torch.randn(1536, 7168, dtype=torch.bfloat16, device=dev)
    x = torch.randn(7168, dtype=torch.bfloat16, device=dev)
    side = torch.cuda.Stream(dev)

    def work(n: int = 400) -> None:
        for _ in range(n):
            torch.mv(w, x)

    def timed(fn, stream) -> tuple:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            a.record()
            fn()
            b.record()
        return a, b

    work()
    alone = []
    for _ in range(reps):
        a, b = timed(work, torch.cuda.current_stream())
        b.synchronize()
        alone.append(a.elapsed_time(b))
    for name, P in counts:
        slow, rate = [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            side.wait_stream(torch.cuda.current_stream())
            ca, cb = timed(lambda: copy(P), side)           # the copy first, the workload beside it
            ma, mb = timed(work, torch.cuda.current_stream())
            torch.cuda.synchronize()
            slow.append(ma.elapsed_time(mb) / statistics.median(alone))
            rate.append(nbytes / (ca.elapsed_time(cb) / 1e3) / 1e9)
        metrics[f"beside.p{name}.main_slowdown"] = statistics.median(slow)
        metrics[f"beside.p{name}.copy_gbps"] = statistics.median(rate)
    metrics["beside.main_alone_ms"] = statistics.median(alone)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--mb", type=float, default=21.0, help="bytes of one expert, MB (kimi-k3.1-pro's: about 21)")
    ap.add_argument("--programs", default="33,66,132,168,264,all")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    n = a.experts if cuda else 2
    nbytes = (int(a.mb * (1 << 20)) if cuda else 64 << 10) // 4096 * 4096
    gids = torch.arange(n, dtype=torch.int64)
    metrics: dict = {}
    if cuda:
        from strata_plan.pinned import HostRegion
        dev = torch.device("cuda")
        region = HostRegion(n * nbytes, dev)
        region.tensor.copy_(torch.randint(0, 256, (n * nbytes,), dtype=torch.uint8))
        arena = torch.empty(n * nbytes, dtype=torch.uint8, device=dev)
        ram_base, slot_base = region.device_ptr - arena.data_ptr(), 0
        gids = gids.to(dev)
        src = region.tensor
    else:
        arena = torch.randint(0, 256, (2 * n * nbytes,), dtype=torch.uint8)
        ram_base, slot_base = n * nbytes, 0
        src = arena[ram_base:]
    st = _state(n, nbytes, arena, ram_base, slot_base)
    filling = st.state.clone()              # every slot claimed: a copy publishes each, so each copy starts from here

    def copy(P: int) -> None:
        st.state.copy_(filling)
        pk.copy(arena, gids, 0, st, nbytes, programs=P)
    chunks = n * -(-nbytes // pk.COPY_CHUNK)
    counts = [(c, chunks if c == "all" else min(int(c), chunks)) for c in a.programs.split(",")]
    for name, P in counts:
        arena[slot_base:slot_base + n * nbytes].zero_()

        def go(P=P):
            copy(P)
        if cuda:
            metrics[f"copy_gbps.p{name}"] = n * nbytes / _time(go) / 1e9
        else:
            go()
        metrics[f"programs.p{name}"] = P
        got = arena[slot_base:slot_base + n * nbytes]
        assert torch.equal(got.cpu(), src[:n * nbytes].cpu()), f"{P} programs: the slots do not hold the experts"
    if cuda:
        beside(metrics, counts, copy, n * nbytes)
    if cuda:
        dst = torch.empty(n * nbytes, dtype=torch.uint8, device="cuda")
        s = _time(lambda: dst.copy_(region.tensor, non_blocking=True))
        metrics["h2d_gbps"] = n * nbytes / s / 1e9
        best = max(v for k, v in metrics.items() if k.startswith("copy_gbps.p"))
        metrics["best_over_h2d"] = best / metrics["h2d_gbps"]
        region.close()
    metrics.update(experts=n, expert_bytes=nbytes)
    for k, v in metrics.items():
        print(f"{k:28s} {v:.3f}" if isinstance(v, float) else f"{k:28s} {v}", flush=True)
    if cuda:
        print(write_result("prefetch-copy", metrics, command=" ".join(["python3"] + sys.argv), out_dir=a.out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
