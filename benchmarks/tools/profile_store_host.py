"""Diagnostic: where the main thread's host time goes in decode (cProfile around `engine.bench.measure`).

    python3 benchmarks/tools/profile_store_host.py --packed DIR --plan PLAN [--mode lru] [--tokens 32]
    python3 benchmarks/tools/profile_store_host.py --fixture [--mode lru,on-demand,plan]

--fixture packs the committed fixture as bf16 (49 KB experts: copies far shorter than a fetch's host time)
and plans it with 4 static experts a layer, 28 in pinned RAM, 6 LRU slots and lookahead depth 2.

Prints the run's time split (host time in the store and the round trips, fetches a token) and the 25
functions with the most own time on the main thread (the copy and reader threads are not profiled).
Not a benchmark: no results file; cProfile slows Python down, so read shares, not absolute times.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

from strata_plan.engine.bench import measure


def fixture():
    import sys
    import tempfile
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tests"))
    from test_engine_run import bf16_plan
    from strata_plan.cli import main as cli
    packed = Path(tempfile.mkdtemp()) / "packed"
    assert cli(["pack", str(root / "tests/data/fixture-moe"), "--out", str(packed), "--format", "bf16"]) == 0
    return packed, bf16_plan(4, 28, 6, 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packed")
    ap.add_argument("--plan")
    ap.add_argument("--fixture", action="store_true")
    ap.add_argument("--mode", default="lru")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=32)
    a = ap.parse_args()
    if a.fixture:
        a.packed, a.plan = fixture()
    elif not (a.packed and a.plan):
        ap.error("--packed and --plan, or --fixture")
    for mode in a.mode.split(","):
        prof = cProfile.Profile()
        prof.enable()
        r = measure(a.packed, a.plan, mode=mode, tokens=a.tokens, warmup=a.warmup)
        prof.disable()
        tp, c = r["time_per_token"], r["counters"]
        fetches = sum(c["fetches_from"].values()) / a.tokens
        print(f"== {mode}: {r['measured']['decode_tok_s']:.1f} tok/s under cProfile; store+launch "
              f"{tp['store_and_launch_host_s'] * 1e3:.2f} ms/tok, round trips {tp['router_round_trip_s'] * 1e3:.2f} "
              f"ms/tok, {fetches:.1f} fetches/tok, GPU wait {(tp['device_wait_s'] or 0) * 1e3:.2f} idle "
              f"{(tp.get('device_idle_s') or 0) * 1e3:.2f} compute {(tp['device_compute_s'] or 0) * 1e3:.2f} ms/tok")
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
