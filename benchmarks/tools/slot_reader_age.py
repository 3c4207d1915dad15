"""Diagnostic (CPU, seconds): does a fetch land in a slot whose last reader is the kernel just queued?

    python3 benchmarks/tools/slot_reader_age.py [--plan tests/data/plan-kimi5-h200-ramrich.yaml] [--extra-slots 0]

Replays the store's residency decisions (strata_plan/engine/residency.py) in the store's call order for each MoE layer
of each token: `ensure` (classify the routed ids, a slot for each demand fetch, touch), `release` (the
layer's kernel queued: its slots' last reader), then the hints of the plan's depth and their slots, with the
routing and hints of bench_engine (the olmoe-like prior, seed 11). A copy into a slot whose last reader is
the kernel just queued waits on the copy stream until that kernel has run, and holds every copy behind it:
this prints how often a prefetch lands in such a slot, and how often its reader is the layer before (already
run: this layer's router came after it). A demand fetch cannot wait so: the router's ids arrive after the
previous layer's kernel ran. A model of the store's order, not the store.
"""
from __future__ import annotations

import argparse

import numpy as np

from strata_plan.engine.replay import Replay
from strata_plan.engine.residency import DEMAND, Residency
from strata_plan.core.plan import load_plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", default="tests/data/plan-kimi5-h200-ramrich.yaml")
    ap.add_argument("--extra-slots", type=int, default=0, help="staging slots beyond the store's count")
    ap.add_argument("--tokens", type=int, default=400)
    a = ap.parse_args()
    plan = load_plan(a.plan)
    L, k, depth = len(plan.layers), plan.top_k, plan.prefetch_depth
    n_slots = plan.cache.total_slots + max(plan.staging.vram_slots, (depth + 1) * k) + a.extra_slots  # as the store
    res = Residency([l.vram for l in plan.layers], [l.cache_slots for l in plan.layers], n_slots)
    replay = Replay.from_prior("olmoe-like", L, plan.n_experts, k, tokens=4096, seed=11)
    for s in res.slots:
        s.release = -10                     # the release serial of the slot's last reader (never read: long ago)
    serial, dropped, demand = 0, 0, 0
    ages: list[int] = []                        # prefetches: releases since their slot's last reader
    for _ in range(a.tokens):
        for j in range(L):
            ids, _ = replay.route(j, 1, "cpu")
            ids = list(dict.fromkeys(int(e) for e in ids[0]))
            for e, kind in zip(ids, res.classify(j, ids, done=lambda s: True)):
                if kind == DEMAND:
                    slot, _ = res.take(j, e, by_hint=False, steal=True)
                    demand += 1
                    slot.pinned = True
            res.touch(j, ids)
            serial += 1
            res.release(j, serial)
            for d in range(1, depth + 1):
                if j + d >= L:
                    continue
                guesses, _ = replay.hint(j, d)
                if d != depth:                  # as the store: only the plan's depth is fetched
                    continue
                staged = sum(1 for s in res.slots if s.role == "staged" and s.by_hint)
                for e in guesses:
                    if res.is_resident(j + d, e):
                        continue
                    if res.n_free() <= k or staged + 1 > plan.staging.vram_slots:
                        dropped += 1
                        continue
                    slot, _ = res.take(j + d, e, by_hint=True, steal=False)
                    ages.append(serial - slot.release)
                    staged += 1
    print(f"{a.plan}: {n_slots} dynamic slots, {a.tokens} tokens replayed")
    print(f"  demand fetches {demand / a.tokens:.2f} a token")
    x = np.array(ages)
    if len(x):
        print(f"  prefetches {len(x) / a.tokens:.2f} a token; their slot's last reader: the kernel just queued "
              f"{np.mean(x == 0):.1%}, the layer before {np.mean(x == 1):.1%}, older {np.mean(x >= 2):.1%}")
    print(f"  hints dropped (no free slot or over the speculative cap): {dropped / a.tokens:.2f} a token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
