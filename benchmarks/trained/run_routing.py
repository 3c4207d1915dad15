"""The routing a trained-model engine row decoded on, and the statistics the cost model predicts that row with.

    trace = row_trace(model, r["context"], spec, source)        # r: `engine.bench.measure`'s record of the row
    stats = row_stats(trace, r["context"], executed)            # counted as the row's counters count, the plan's ranks
    Predictor(plan).for_plan(executed, mode, stats=stats)       # the same row predicted on its own routing

A plan's statistics come from held-out text (several files, teacher-forced). An engine row decodes one sampled
continuation of one prompt, and one file's experts are not the average file's: on an H100 the seed plan's VRAM
experts served 0.108 of a row's routed uses where its statistics said 0.143 (engine-trained-20261206T061945Z.json;
runs before `bench` decoded the prompt alone swung 0.02-0.26). Predicting a row a second time on its own routing
tells the cost model's error (what remains) from the workload sample's (the difference).

The row's text is the prompt, then the token each decode step was given. It is routed teacher-forced through
the checkpoint exactly as the held-out trace was (`moe.trace.route_sequence`: float32, the reference experts,
lookahead guesses by depth), so both statistics come from one instrument. The engine's own routing ran on its
packed experts and may differ in a few ids; `resident_hit_rate_measured` beside the prediction's VRAM hit rate
shows how far. The warm-up steps set the caches' state and the counted steps count, as in the engine's counters.
The statistics rank each layer's experts as the plan does (`compute_stats(rankings=...)`): the cost model works in
popularity-rank space, and the plan's VRAM experts are its statistics' most used, not this text's.
"""
from __future__ import annotations

import numpy as np

from moe.trace import route_sequence


def row_trace(model, context: dict, spec, source: str, depth: int = 4):
    """The routing trace (planner format) of the decode steps of `context` ({"prompt", "fed", "counted_from"}):
    one row a decode step, routed at the position the engine ran it (after the prompt)."""
    from strata_plan.core.routing import Trace
    prompt, fed = list(context["prompt"]), list(context["fed"])
    r = route_sequence(model, np.asarray(prompt + fed, np.int64), depth)
    steps = slice(len(prompt), len(prompt) + len(fed))
    return Trace(experts=r["experts"][steps], weights=r["weights"][steps], sequence=np.zeros(len(fed), np.int32),
                 model=spec.name, n_experts=spec.n_routed, phase="decode", source=source,
                 lookahead_experts=r["lookahead_experts"][steps], lookahead_scores=r["lookahead_scores"][steps])


def row_stats(trace, context: dict, plan):
    """Statistics of `trace` counted from the row's first counted step (the earlier ones only warm the caches),
    its experts ranked as `plan` ranks them (its tiers list each layer's ids most used first by the plan's own
    statistics): the cost model then places the plan's experts, not this text's most used ones, in each tier."""
    from strata_plan.core.routing import compute_stats
    return compute_stats(trace, warmup=int(context["counted_from"]),
                         rankings=[tuple(l.vram) + tuple(l.ram) + tuple(l.nvme) for l in plan.layers])
