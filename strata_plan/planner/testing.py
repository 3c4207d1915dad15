"""Small planning problems for tests and benchmarks: a tiny MoE spec and synthetic routing whose skew is
chosen per layer, so the search can be held against brute force and the greedy baseline.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from strata_plan.planner.capacity import Budget
from strata_plan.planner.placement import Placement, footprint
from strata_plan.planner.problem import Problem


def tiny_spec(n_layers: int = 3, n_experts: int = 8, top_k: int = 2, hidden: int = 2048, moe_intermediate: int = 8192,
              vocab: int = 1024):
    """A Mixtral-style spec whose experts (about 9-18 MB packed) outweigh each layer's attention."""
    from strata_plan.core.spec import spec_from_config
    cfg = {"model_type": "mixtral", "hidden_size": hidden, "intermediate_size": moe_intermediate,
           "num_hidden_layers": n_layers, "num_attention_heads": 16, "num_key_value_heads": 4,
           "num_local_experts": n_experts, "num_experts_per_tok": top_k, "vocab_size": vocab}
    return spec_from_config(cfg, f"tiny-{n_layers}x{n_experts}", "planner.testing")


def skewed_trace(skews: Sequence[float], n_experts: int, top_k: int, tokens: int = 1500, seed: int = 0,
                 locality: float = 0.0, model: str = "tiny"):
    """A routing trace: layer i draws top-k distinct experts with weights rank^-skews[i] (id = rank), and
    with probability `locality` keeps each expert the previous token used."""
    from strata_plan.core.routing import Trace
    rng = np.random.default_rng(seed)
    L = len(skews)
    probs = [np.arange(1, n_experts + 1, dtype=float) ** -s for s in skews]
    experts = np.empty((tokens, L, top_k), dtype=np.int32)
    for t in range(tokens):
        for l in range(L):
            p = probs[l] / probs[l].sum()
            kept = [e for e in experts[t - 1, l] if rng.random() < locality] if t else []
            q = p.copy()
            q[kept] = 0.0
            fresh = rng.choice(n_experts, size=top_k - len(kept), replace=False, p=q / q.sum())
            chosen = sorted([*kept, *fresh], key=lambda e: -p[e])
            experts[t, l] = chosen
    weights = np.full((tokens, L, top_k), 1.0 / top_k, dtype=np.float32)
    return Trace(experts=experts, weights=weights, sequence=np.zeros(tokens, dtype=np.int32), model=model,
                 n_experts=n_experts, source=f"planner.testing skews={list(skews)} locality={locality} seed={seed}")


def tiny_problem(skews: Sequence[float] = (1.5, 0.0, 0.7), vram_experts: float = 4.0, ram_experts: float = 4.0,
                 profile: str = "rtx-4090", locality: float = 0.0, seed: int = 0, context: int = 512,
                 chunk: int = 256, n_experts: int = 8, top_k: int = 2) -> Problem:
    """A problem whose VRAM holds every dense weight, the staging of prefetch depth 2 and `vram_experts`
    of the largest expert; pinned RAM holds the embeddings and `ram_experts` largest experts."""
    from strata_plan.core.routing import compute_stats
    from strata_plan.profiles.schema import load_profile
    spec = tiny_spec(len(skews), n_experts, top_k)
    stats = compute_stats(skewed_trace(skews, n_experts, top_k, seed=seed, locality=locality, model=spec.name))
    prof = load_profile(profile)
    roomy = Problem(spec, prof, stats, Budget(10**15, 10**15, 10**15, 0), context, chunk)
    L = len(skews)
    base = footprint(roomy, Placement((0,) * L, (0,) * L, (0,) * L, (True,) * (spec.n_layers + 1), 2))
    slot = roomy.slot_bytes
    budget = Budget(int(base.vram + vram_experts * slot), int(spec.embedding_bytes + base.host_staging + ram_experts * slot),
                    10**13, 0)
    return roomy.replace(budget=budget)
