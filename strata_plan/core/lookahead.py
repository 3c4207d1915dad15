"""Router lookahead: the facts the routing statistics, the planner, the plan file and the engine share.

Lookahead depth d means layer j's hidden state, passed through the gate of layer j + d, guesses the experts
that layer will route to; the engine prefetches those guesses while layers j .. j + d - 1 run.
"""
from __future__ import annotations

MAX_DEPTH = 4
"""Lookahead depths the routing statistics describe (1..4), and the deepest prefetch a plan may ask for."""

GATE_LAUNCHES = 2
"""Kernels the device loop launches for one lookahead gate (layer j + d's norm and router on layer j's output, its
ids and weights into the guess buffers): `kernels.gate`'s logits and top-k kernels (the torch path it replaced took
22), counted by tests/test_lookahead_launches.py. With an NVMe tier every depth's gate runs after each layer on the
main stream (the stager reads guesses of every depth with the layer's end); else only depth d's, on the side stream
with the prefetch it feeds."""

ISSUE_LAUNCHES = 2
"""Kernels for each VRAM prefetch issued besides its claim and copy, on the side stream with them: the slots of the
layers run so far freed (`release`), the guesses noted for precision and recall."""

LAYER_LAUNCHES = 0
"""Kernels the device loop's VRAM lookahead adds to every MoE layer with a device LRU on its main stream: none,
`resolve` runs in the LRU step's launch (`kernels.prefetch.resolve_step`; without a cache it is a launch of its own);
the planner charges the profile's measured `lookahead_layer_us`. One `release` more at the token's end."""


def pinned_staging_slots(top_k: int, depth: int, planned: int = 0) -> int:
    """Slots of the device loop's pinned NVMe staging cache (engine.staging): the plan's `staging.host_slots`, at
    least one layer's routed experts and each lookahead layer's, twice over (the reads in flight, and room for the
    GPU to read what landed): `max(planned, 2 x top_k x (depth + 1))`."""
    return max(planned, 2 * top_k * (depth + 1))


def staging_slots(top_k: int, depth: int) -> int:
    """VRAM landing slots for experts in flight at once: the current layer's `top_k` and `depth` layers of
    prefetch, `(depth + 1) x top_k`."""
    return (depth + 1) * top_k
