"""Polish: hill-climbing on per-layer counts from the best plan the knob search found.

The knobs reach a plan's basin; the allocator's water-filling is exact only for the linear part of the
cost (stalls, link sharing and whether every expert fits off NVMe are not linear). Polish tries small
moves on one layer at a time, scored by the real cost model, and keeps any that is feasible and better:

    static <-> RAM (one expert), RAM <-> NVMe (one expert), cache slot +/- 1,
    static -> cache slot (the expert goes to RAM) and back, prefetch depth +/- 1,
    one more or one fewer dense unit resident,
    and, for models of at most PAIR_LAYERS MoE layers, a static expert or a cache slot moved between layers;
    several GPUs: a split point one layer either way, and one more (or fewer) static expert of a layer held and
    run by the partner GPU ("spill": one layer's experts over two GPUs).

First improvement wins; it stops at a local optimum or after `max_evals` cost-model calls. Deterministic.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from strata_plan.planner.placement import Placement, dense_choice, footprint

PAIR_LAYERS = 8
_SINGLE = ((-1, +1, 0), (+1, -1, 0), (0, +1, 0), (0, -1, 0), (0, 0, +1), (0, 0, -1), (-1, +1, +1), (+1, -1, -1))


def _valid(p: Placement, E: int) -> bool:
    return all(s + m <= E and s + c <= E for s, m, c in zip(p.vram, p.ram, p.cache))


def _shift(p: Placement, deltas: dict[int, tuple[int, int, int]]) -> Placement | None:
    """`p` with each layer's counts moved by its (static, RAM, cache) deltas; None where a count would go below 0 or a
    layer would keep fewer static experts than its partner GPU holds (`remote`, a subset of the static ones)."""
    v, r, c = list(p.vram), list(p.ram), list(p.cache)
    for l, (ds, dm, dc) in deltas.items():
        v[l], r[l], c[l] = v[l] + ds, r[l] + dm, c[l] + dc
        if min(v[l], r[l], c[l]) < 0 or (p.remote and p.remote[l] > v[l]):
            return None
    return dataclasses.replace(p, vram=tuple(v), ram=tuple(r), cache=tuple(c))


def _moves(problem, L: int) -> list[tuple]:
    """Move descriptors, applied to whatever the current placement is."""
    out: list[tuple] = [("layer", {l: d}) for l in range(L) for d in _SINGLE]
    if L <= PAIR_LAYERS:
        out += [("layer", {a: d, b: (-d[0], -d[1], -d[2])}) for a in range(L) for b in range(L) if a != b
                for d in ((-1, +1, 0), (0, 0, -1))]
        # one static expert of layer a traded for one in each of b and c (layers' experts differ in size: the
        # freed bytes may hold two; found on a 3-layer instance that pair moves alone could not reach)
        out += [("layer", {a: (-1, +1, 0), b: (+1, -1, 0), c: (+1, -1, 0)}) for a in range(L)
                for b in range(L) for c in range(b + 1, L) if a not in (b, c)]
    out += [("depth", -1), ("depth", +1), ("dense", -1), ("dense", +1)]
    if problem.n_gpus > 1:                           # several GPUs: a split point one decoder layer either way,
        out += [("split", (g, d)) for g in range(problem.n_gpus - 1) for d in (-1, +1)]
        out += [("spill", (l, d)) for l in range(L) for d in (+1, -1)]   # one static expert more on the partner
    return out


def _apply(problem, p: Placement, move: tuple) -> Placement | None:
    kind, arg = move
    if kind == "layer":
        return _shift(p, arg)
    if kind == "depth":
        d = p.prefetch_depth + arg
        lo, hi = problem.depths
        return dataclasses.replace(p, prefetch_depth=d) if lo <= d <= hi else None
    if kind == "spill":                              # the layer's next expert becomes static, held by the partner
        l, d = arg                                   # GPU (+1), or its least used remote expert leaves VRAM (-1)
        rem = list(p.remote or (0,) * p.n_layers)
        rem[l] += d
        if rem[l] < 0:
            return None
        q = _shift(p, {l: (d, -d if p.ram[l] >= d else 0, 0)})
        return dataclasses.replace(q, remote=tuple(rem)) if q is not None and rem[l] <= q.vram[l] else None
    if kind == "split":
        g, d = arg
        if len(p.gpu_split) <= g:
            return None
        split = list(p.gpu_split)
        split[g] += d
        ok = split == sorted(set(split)) and 1 <= split[0] and split[-1] <= problem.spec.n_layers
        return dataclasses.replace(p, gpu_split=tuple(split)) if ok else None
    units = len(problem.dense_units)
    k = sum(p.dense_resident) + arg
    return dataclasses.replace(p, dense_resident=dense_choice(problem, k / units)) if 0 <= k <= units else None


def polish(problem, start: Placement, score: Callable[[Placement], float], max_evals: int = 400) -> tuple[Placement, float, int]:
    """(best placement, its score, moves kept) after hill-climbing from `start` (which must fit). Moves are
    tried in a fixed cycle; it stops after a whole cycle without improvement or `max_evals` scorings."""
    E, budget = problem.curves.n_experts, problem.budget
    moves = _moves(problem, start.n_layers)
    best, best_score = start, score(start)
    evals = kept = since = i = 0
    while since < len(moves) and evals < max_evals:
        cand = _apply(problem, best, moves[i % len(moves)])
        i, since = i + 1, since + 1
        if cand is None or not _valid(cand, E) or not footprint(problem, cand).fits(budget):
            continue
        evals += 1
        v = score(cand)
        if v > best_score * (1 + 1e-9):
            best, best_score, kept, since = cand, v, kept + 1, 0
    return best, best_score, kept
