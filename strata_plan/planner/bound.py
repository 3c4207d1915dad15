"""The physical bound: no placement can beat bytes per token over each link's peak bandwidth.

Written apart from the cost model on purpose (plain loops over expert ids, no shared tables): for each link
it counts the fewest bytes a token (or a prefill chunk) must move, divides by the link's best measured or
quoted bandwidth, and assumes every link and the GPU overlap perfectly with no fixed overheads:

    decode   T >= max( HBM bytes / HBM peak,  FLOPs / BF16 peak,  PCIe bytes / best H2D,  NVMe bytes / best NVMe )
    prefill  T_chunk >= the same per chunk of C tokens;   tok/s <= C / T_chunk

Bytes are the optimistic reading of the routing statistics: an LRU cache of c slots removes at most
cache_hit(s, c) - static_hit(s) of a layer's accesses, and the bound lets it remove the largest experts
first and NVMe accesses first; on one GPU the pinned staging cache may serve NVMe accesses too: at most its
slots' worth of the most read NVMe experts, and, where a layer asks again for recent experts (temporal locality),
what the statistics' LRU curve over the layer's NVMe accesses (RAM ranks counted static) keeps with every staging
slot and the device LRU's NVMe share, priced at the layer's largest NVMe expert. A prefill chunk touches expert e
with probability at least 1 - exp(-C k p_e). The cost model must never predict more than this; tests hold it to that.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

LINKS = ("hbm", "compute", "pcie", "nvme")


class BoundViolation(AssertionError):
    """A prediction above its physical bound: always a cost-model bug, never the user's mistake."""


@dataclass(frozen=True)
class Bound:
    decode_tok_s: float
    prefill_tok_s: float
    decode_binding: str
    prefill_binding: str
    decode_bytes: dict          # per token per link (hbm, pcie, nvme) and FLOPs under "compute"
    prefill_bytes: dict         # per chunk


@dataclass(frozen=True)
class Throughput:
    """Predicted tok/s (cost model) beside the physical bound of the same placement."""

    decode_tok_s: float
    prefill_tok_s: float
    decode_binding: str
    prefill_binding: str
    bound_decode_tok_s: float
    bound_prefill_tok_s: float

    @classmethod
    def fields_of(cls, pred, bound) -> dict:
        """The fields from a cost-model `Prediction` (or a plan's `Predicted`) and a `Bound`."""
        return dict(decode_tok_s=pred.decode_tok_s, prefill_tok_s=pred.prefill_tok_s,
                    decode_binding=pred.decode_binding, prefill_binding=pred.prefill_binding,
                    bound_decode_tok_s=bound.decode_tok_s, bound_prefill_tok_s=bound.prefill_tok_s)

    @classmethod
    def of(cls, pred, bound) -> "Throughput":
        return cls(**cls.fields_of(pred, bound))


def link_peaks(profile, gpu=None) -> dict:
    """Best bandwidth of each link (bytes/s; FLOP/s for compute): the highest point of every curve (of `gpu`,
    default the first)."""
    gpu = gpu or profile.gpu
    h2d = [v for _, v in gpu.h2d_pinned.points]
    if gpu.h2d_during_kernel is not None:
        h2d += [v for _, v in gpu.h2d_during_kernel.points]
    if gpu.zero_copy is not None:                  # kernels reading pinned RAM in place cross the same link
        h2d += [v for _, v in gpu.zero_copy.points]
    nvme = [v for d in profile.nvme for surf in (d.rand_read, d.seq_read) if surf is not None for *_, v in surf.points]
    return {"hbm": gpu.hbm_gbps.value * 1e9, "compute": gpu.bf16_tflops.value * 1e12,
            "pcie": max(h2d) * 1e9, "nvme": max(nvme, default=0.0) * 1e9}


def _expert_sizes(problem) -> list[dict[int, int]]:
    """Per MoE layer: expert id -> packed bytes (format by the tier mix over the layer's popularity order)."""
    spec, mix = problem.spec, problem.mix
    sizes = {f: spec.routed_expert_bytes(f) for f in mix.formats}
    return [{e: sizes[f] for e, f in mix.assign(list(layer.order)).items()} for layer in problem.stats.layers]


def _time(amount: dict, peaks: dict) -> tuple[float, str]:
    times = {k: (amount[k] / peaks[k] if amount[k] > 0 else 0.0) if peaks[k] > 0 else (math.inf if amount[k] > 0 else 0.0)
             for k in LINKS}
    worst = max(LINKS, key=lambda k: times[k])
    return times[worst], worst


def _layer_bytes(problem, placement):
    """Per MoE layer l: (l, decode bytes, prefill bytes) on each link (hbm, pcie, nvme), plain loops over the
    layer's expert ids: the fewest the placement lets the layer move (see the module docstring)."""
    stats, C, k = problem.stats, problem.prefill_chunk, problem.spec.top_k
    for l, (layer, size) in enumerate(zip(stats.layers, _expert_sizes(problem))):
        order = list(layer.order)
        s, m = placement.vram[l], placement.ram[l]
        static, nvme = set(order[:s]), set(order[s + m:])
        removed = k * max(0.0, stats.cache_hit(l, s, placement.cache[l]) - stats.static_hit(l, s))
        nonstatic = [e for e in order if e not in static]
        big = max((size[e] for e in nonstatic), default=0)
        big_nvme = max((size[e] for e in nvme), default=0)
        miss = k * sum(layer.popularity[e] * size[e] for e in nonstatic)
        cold = k * sum(layer.popularity[e] * size[e] for e in nvme)
        touch = {e: 1.0 - math.exp(-C * k * layer.popularity[e]) for e in order}
        yield (l, {"hbm": k * sum(layer.popularity[e] * size[e] for e in order),
                   "pcie": max(0.0, miss - removed * big), "nvme": max(0.0, cold - removed * big_nvme)},
               {"hbm": sum(touch[e] * size[e] for e in order), "pcie": sum(touch[e] * size[e] for e in nonstatic),
                "nvme": sum(touch[e] * size[e] for e in nvme)})


def _staging_bytes(problem, placement) -> float:
    """The most NVMe bytes a token the pinned staging cache (one GPU, the engine's device loop) can serve instead of
    the drive: its S slots (`core.lookahead.pinned_staging_slots`) holding the S most read NVMe experts of any layers
    (under independent requests no policy beats keeping the most used). 0 for several GPUs (the copy path)."""
    from strata_plan.core.lookahead import pinned_staging_slots
    stats, k = problem.stats, problem.spec.top_k
    if placement.several:
        return 0.0
    reads = []
    for l, (layer, size) in enumerate(zip(stats.layers, _expert_sizes(problem))):
        order = list(layer.order)
        reads += [k * layer.popularity[e] * size[e] for e in order[placement.vram[l] + placement.ram[l]:]]
    S = pinned_staging_slots(k, placement.prefetch_depth, placement.staging)
    return float(sum(sorted(reads, reverse=True)[:S]))


def _staged_floor(problem, placement, l: int, size: dict[int, int]) -> float:
    """Layer l's fewest NVMe bytes a token with its device LRU and the pinned staging cache keeping what the
    statistics' LRU curve over the layer's NVMe accesses keeps (RAM ranks counted static) with every staging slot
    (at most the layer's NVMe experts) and the device LRU slots in the NVMe ranks' share, each kept access priced at
    the layer's largest NVMe expert (one GPU; see the module docstring). `size`: the layer's expert id -> bytes."""
    from strata_plan.core.lookahead import pinned_staging_slots
    stats, k = problem.stats, problem.spec.top_k
    layer = stats.layers[l]
    order = list(layer.order)
    s, m, c = placement.vram[l], placement.ram[l], placement.cache[l]
    nvme = order[s + m:]
    if not nvme:
        return 0.0
    base, rest = stats.static_hit(l, s + m), 1.0 - stats.static_hit(l, s)
    near = c * (1.0 - base) / rest if rest > 1e-12 else 0.0         # device LRU slots holding NVMe experts
    slots = min(pinned_staging_slots(k, placement.prefetch_depth, placement.staging), len(nvme))
    kept = k * max(0.0, stats.cache_hit(l, s + m, slots + near) - base)
    cold = k * sum(layer.popularity[e] * size[e] for e in nvme)
    return max(0.0, cold - kept * max(size[e] for e in nvme))


def physical_bound(problem, placement) -> Bound:
    if placement.several:
        return split_bound(problem, placement)
    spec, C, ctx = problem.spec, problem.prefill_chunk, problem.context
    units = problem.dense_units
    streamed = sum(u for u, res in zip(units, placement.dense_resident) if not res)
    dec = {"hbm": float(sum(units) + spec.kv_cache_bytes(ctx)), "compute": float(spec.flops_per_token(ctx)),
           "pcie": float(streamed) + 2 * spec.hidden, "nvme": 0.0}
    head = 2 * (spec.lm_head_params + spec.hidden + (spec.embedding_params if spec.tied_embeddings else 0))  # logits: once per chunk
    pre = {"hbm": float(sum(units)), "pcie": float(streamed), "nvme": 0.0,
           "compute": float(C * (spec.flops_per_token(max(1, ctx // 2)) - head) + head)}
    sizes = _expert_sizes(problem)
    for l, layer_dec, layer_pre in _layer_bytes(problem, placement):
        layer_dec["nvme"] = min(layer_dec["nvme"], _staged_floor(problem, placement, l, sizes[l]))
        for key in ("hbm", "pcie", "nvme"):
            dec[key] += layer_dec[key]
            pre[key] += layer_pre[key]
    dec["nvme"] = max(0.0, dec["nvme"] - _staging_bytes(problem, placement))
    peaks = link_peaks(problem.profile)
    t_dec, b_dec = _time(dec, peaks)
    t_pre, b_pre = _time(pre, peaks)
    return Bound(1.0 / t_dec if t_dec > 0 else math.inf, C / t_pre if t_pre > 0 else math.inf, b_dec, b_pre, dec, pre)


def cpu_layers_bound(problem, all_gpu, placement, on_gpu) -> Bound:
    """The bound of whole layers of experts computed on the CPU (llama.cpp's CPU layers): decode is the GPU's
    links for every layer (`all_gpu`: every expert in VRAM) less the CPU layers' expert bytes, then those bytes, in
    series (batch 1: a layer needs the last one's output): the ones `placement` leaves on NVMe (its RAM holds the
    most used) at the best NVMe rate beside the rest at the host RAM rate; prefill is `placement`'s."""
    cpu = [not g for g in on_gpu]
    whole = physical_bound(problem, all_gpu)
    rows = [(dec["hbm"], dec["nvme"]) for l, dec, _ in _layer_bytes(problem, placement) if cpu[l]]
    moved, cold = sum(r[0] for r in rows), sum(r[1] for r in rows)
    dec = dict(whole.decode_bytes, hbm=whole.decode_bytes["hbm"] - moved, cpu_ram=moved - cold, cpu_nvme=cold)
    peaks = link_peaks(problem.profile)
    t_gpu, binding = _time(dec, peaks)
    t_cpu = max((moved - cold) / (problem.profile.host.ram_gbps.value * 1e9),
                (cold / peaks["nvme"] if peaks["nvme"] > 0 else math.inf) if cold > 0 else 0.0)
    pre = physical_bound(problem, placement)
    return Bound(1.0 / (t_gpu + t_cpu), pre.prefill_tok_s, "cpu" if t_cpu > t_gpu else binding, pre.prefill_binding,
                 dec, pre.prefill_bytes)


SPLIT_LINKS = ("hbm", "compute", "pcie", "nvme", "peer")


def split_bound(problem, placement) -> Bound:
    """The bound of a pipeline split over several GPUs, from the same bytes per link, each GPU's counted on its
    own links:

        decode   T >= max( sum_g HBM_g / HBM peak_g,  FLOPs / the fastest GPU's peak,
                           max_g PCIe_g / best H2D_g,  PCIe / concurrent H2D,  NVMe / best NVMe,  peer / peer peak )
        prefill  T_chunk >= the same with max_g for HBM (stages of a pipeline may overlap across chunks), FLOPs
                 over the GPUs' summed peaks

    Decode at batch 1 cannot overlap the GPUs (each token needs the last one's output), so their HBM times
    add. The hidden state crosses each split point once a token (C tokens' a chunk) over the peer link, or
    without one lands over the receiving GPU's PCIe link."""
    spec, G = problem.spec, problem.n_gpus
    units = problem.dense_units
    ug = [int(g) for g in placement.unit_gpus()]
    mg = [ug[i] for i in spec.moe_layers]
    zero = lambda: [0.0] * G  # noqa: E731
    dec = {"hbm": zero(), "pcie": zero()}
    pre = {"hbm": zero(), "pcie": zero()}
    for i, (u, res) in enumerate(zip(units, placement.dense_resident)):
        dec["hbm"][ug[i]] += u
        pre["hbm"][ug[i]] += u
        if not res:
            dec["pcie"][ug[i]] += u
            pre["pcie"][ug[i]] += u
        if i < spec.n_layers:
            dec["hbm"][ug[i]] += problem.layer_kv_bytes[i]
    dec["pcie"][ug[0]] += 2 * spec.hidden
    nvme_dec = nvme_pre = 0.0
    for l, layer_dec, layer_pre in _layer_bytes(problem, placement):
        for a, b in ((dec, layer_dec), (pre, layer_pre)):
            a["hbm"][mg[l]] += b["hbm"]
            a["pcie"][mg[l]] += b["pcie"]
        nvme_dec += layer_dec["nvme"]
        nvme_pre += layer_pre["nvme"]
    remote = []
    k = spec.top_k
    for l, (layer, size) in enumerate(zip(problem.stats.layers, _expert_sizes(problem))):
        r, v = (placement.remote[l] if placement.remote else 0), placement.vram[l]
        if r:
            order = list(layer.order)
            ids = order[v - r:v]
            far = k * sum(layer.popularity[e] * size[e] for e in ids)
            near = k * sum(layer.popularity[e] * size[e] for e in order) - far
            q = min(sum(layer.popularity[e] for e in ids), 1.0)
            remote.append((mg[l], placement.partner(mg[l], G), near, far, 1.0 - (1.0 - q) ** k))
    return _split_result(problem, ug, dec, pre, nvme_dec, nvme_pre, remote)


def _split_result(problem, ug: list[int], dec: dict, pre: dict, nvme_dec: float, nvme_pre: float,
                  remote: list = ()) -> Bound:
    """`split_bound`'s times from the bytes per GPU (`dec`/`pre`: hbm and pcie lists, one entry a GPU) and the
    NVMe bytes; adds the hidden state's crossings of the split points of `ug` (the GPU of each dense unit) and
    to the partners of remote experts. `remote`: per MoE layer with remote experts (its GPU a, the partner b,
    its local and remote routed HBM bytes a token, the chance p a token routes to a remote expert): at
    decode the two GPUs read the layer's experts side by side, `max(local / peak_a, remote / peak_b)` in place
    of `(local + remote) / peak_a`, and the state crosses twice with chance p (a prefill chunk: always)."""
    spec, C, G, ctx = problem.spec, problem.prefill_chunk, problem.n_gpus, problem.context
    n = len(ug)
    cross = [i + 1 for i in range(n - 1) if ug[i] != ug[i + 1]]       # the dense unit each crossing lands at
    tokens = [C if b < n - 1 else 1 for b in cross]                   # prefill: a chunk's states, the head one
    peer = problem.profile.peer
    hop_dec, hop_pre = 2.0 * spec.hidden * len(cross), 2.0 * spec.hidden * sum(tokens)
    dec, pre = {k: list(v) for k, v in dec.items()}, {k: list(v) for k, v in pre.items()}
    row = 2.0 * spec.hidden
    hop_dec += sum(2 * row * p for *_, p in remote)
    hop_pre += 2 * row * C * len(remote)
    if peer.kind == "none":                          # through host memory: lands over the next GPU's link
        for b, c in zip(cross, tokens):
            dec["pcie"][ug[b]] += row
            pre["pcie"][ug[b]] += row * c
        for a, b, _, _, p in remote:
            for g in (a, b):
                dec["pcie"][g] += row * p
                pre["pcie"][g] += row * C
    peaks = [link_peaks(problem.profile, gpu) for gpu in problem.gpus]
    host = problem.profile.concurrent_h2d().value * 1e9
    key = ("split_bound_flops", ctx, C)             # FLOPs a token / a chunk, once per problem
    if key not in problem.__dict__:
        head = 2 * (spec.lm_head_params + spec.hidden + (spec.embedding_params if spec.tied_embeddings else 0))
        problem.__dict__[key] = (float(spec.flops_per_token(ctx)),
                                 float(C * (spec.flops_per_token(max(1, ctx // 2)) - head) + head))
    flops_dec, flops_pre = problem.__dict__[key]

    def over(x, r):
        return (x / r if r > 0 else math.inf) if x > 0 else 0.0

    def side_by_side() -> float:                    # decode: the remote experts' reads beside the local ones
        return sum(max(over(lo, peaks[a]["hbm"]), over(re, peaks[b]["hbm"])) - over(lo + re, peaks[a]["hbm"])
                   for a, b, lo, re, _ in remote)
    used = sorted(set(ug) | {b for _, b, *_ in remote})

    def times(a, nvme_bytes, hop, flops, prefill):
        hbm = [over(a["hbm"][g], peaks[g]["hbm"]) for g in used]
        pcie = [over(a["pcie"][g], peaks[g]["pcie"]) for g in used]
        return {"hbm": max(hbm) if prefill else sum(hbm) + side_by_side(),
                "compute": over(flops, sum(peaks[g]["compute"] for g in used) if prefill
                                else max(peaks[g]["compute"] for g in used)),
                "pcie": max(max(pcie), over(sum(a["pcie"]), host) if len(used) > 1 else 0.0),
                "nvme": over(nvme_bytes, peaks[0]["nvme"]),
                "peer": over(hop, peer.gbps.value * 1e9) if peer.kind != "none" else 0.0}

    def amounts(a, nvme_bytes, hop, flops):
        return {"hbm": float(sum(a["hbm"])), "compute": flops, "pcie": float(sum(a["pcie"])), "nvme": nvme_bytes,
                "peer": hop, **{f"{key}_gpu{g}": float(a[key][g]) for key in ("hbm", "pcie") for g in range(G)}}

    td = times(dec, nvme_dec, hop_dec, flops_dec, False)
    tp = times(pre, nvme_pre, hop_pre, flops_pre, True)
    b_dec, b_pre = max(SPLIT_LINKS, key=td.get), max(SPLIT_LINKS, key=tp.get)
    return Bound(1.0 / td[b_dec] if td[b_dec] > 0 else math.inf, C / tp[b_pre] if tp[b_pre] > 0 else math.inf,
                 b_dec, b_pre, amounts(dec, nvme_dec, hop_dec, flops_dec), amounts(pre, nvme_pre, hop_pre, flops_pre))


def check_within(prediction, bound: Bound, where: str = "") -> None:
    """Raise BoundViolation when a cost-model prediction exceeds its physical bound (decode or prefill)."""
    for what in ("decode", "prefill"):
        p, b = getattr(prediction, f"{what}_tok_s"), getattr(bound, f"{what}_tok_s")
        if p > b * (1 + 1e-9):
            raise BoundViolation(f"{where + ': ' if where else ''}predicted {what} {p:.4g} tok/s exceeds the physical "
                                 f"bound {b:.4g} tok/s ({getattr(bound, what + '_binding')}): a cost-model bug")


@dataclass(frozen=True)
class MachineBound:
    """The fastest any placement could go on this machine and these budgets: the best physical bound over
    the placements `machine_placements` builds (hottest experts in the fastest tiers, with and without an
    LRU cache), for decode and prefill each, with the placement that reaches it."""

    decode: Bound
    prefill: Bound
    decode_placement: object        # planner.placement.Placement
    prefill_placement: object

    @property
    def decode_tok_s(self) -> float:
        return self.decode.decode_tok_s

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill.prefill_tok_s

    @property
    def decode_binding(self) -> str:
        return self.decode.decode_binding

    @property
    def prefill_binding(self) -> str:
        return self.prefill.prefill_binding


MACHINE_CACHE_BIAS = (0.0, 0.5, 0.9)
MACHINE_SKEW = (0.0, 1.0)
MACHINE_DENSE_GRID = 16          # dense-unit counts of the first grid (machine_placements)


MACHINE_POLISH = 200             # hill-climbing scorings (polish.py's moves) from each winner, on the bound


def hottest_placement(problem):
    """Hottest experts in the fastest tiers, no cache, no lookahead.

    Every byte of a dense unit is read once per token (and streamed once per prefill chunk), an expert's
    byte only k p_e times (or with its touch probability), so dense units come first: as many as fit, the
    smallest first. The experts of all layers then go by popularity, most used first, VRAM first and pinned
    RAM next, each tier taking the longest run of that order that fits (a prefix of every layer's ranks)."""
    import numpy as np

    from strata_plan.core.lookahead import staging_slots
    from strata_plan.planner.placement import Placement, footprint
    cur, rb, budget = problem.curves, problem.rank_bytes, problem.budget
    L, E = cur.pop.shape
    none = (0,) * L
    empty = Placement(none, none, none, _dense_that_fits(problem), 0)
    base = footprint(problem, empty)
    order = np.lexsort((np.broadcast_to(np.arange(E), (L, E)).ravel(), np.repeat(np.arange(L), E), -cur.pop.ravel()))
    layer, rank = order // E, order % E
    cum = np.cumsum(rb[rank])

    def take(start: int, room: float) -> int:
        return start + int(np.searchsorted(cum[start:] - (cum[start - 1] if start else 0.0), room, side="right"))

    a = take(0, budget.vram - base.vram)
    room = budget.ram - base.ram
    b = take(a, room)
    if b < L * E:              # experts stay on NVMe: their bounce buffers take pinned RAM too
        b = take(a, room - staging_slots(problem.spec.top_k, 0) * problem.slot_bytes)
    vram = np.bincount(layer[:a], minlength=L)
    ram = np.bincount(layer[a:b], minlength=L)
    return Placement(tuple(int(v) for v in vram), tuple(int(r) for r in ram), none, empty.dense_resident, 0)


def _dense_that_fits(problem) -> tuple[bool, ...]:
    from strata_plan.planner.placement import Placement, dense_choice, footprint
    L, n = problem.curves.n_layers, len(problem.dense_units)
    none = (0,) * L
    for c in range(n, -1, -1):
        resident = dense_choice(problem, c / n)
        if max(footprint(problem, Placement(none, none, none, resident, 0)).overflow(problem.budget)[:2]) <= 0:
            return resident
    return dense_choice(problem, 0.0)


def machine_placements(problem) -> list:
    """`hottest_placement`, and the allocator's water-fill with an LRU cache of several weights (the bound
    credits a cache with the hit rate the routing statistics give it) at lookahead depth 0, over the number
    of dense units resident (fewer dense units leave VRAM to a cache that can save more NVMe bytes than the
    dense units save PCIe bytes): a grid of MACHINE_DENSE_GRID counts up to the most that fit, then halving
    steps around the best count for decode and for prefill (`ranked_bound`). Only placements that fit."""
    from strata_plan.planner.placement import Knobs, allocate
    if problem.n_gpus > 1:
        return _split_machine_placements(problem)
    hot = hottest_placement(problem)
    n, most = len(hot.dense_resident), sum(hot.dense_resident)
    seen: dict[int, list] = {}

    def at(count: int) -> list:
        if count not in seen:
            seen[count] = []
            for bias in MACHINE_CACHE_BIAS:
                for w in MACHINE_SKEW:
                    a = allocate(problem, Knobs(count / n, bias, w, 0))
                    if a.footprint.fits(problem.budget):
                        seen[count].append((a.placement, ranked_bound(problem, a.placement)))
        return seen[count]

    step = max(1, -(-most // MACHINE_DENSE_GRID))
    for c in range(most, -1, -step):
        at(c)
    for phase in (0, 1):
        best = max(seen, key=lambda c: max((r[phase] for _, r in seen[c]), default=0.0))
        s = step
        while s > 1:
            s = -(-s // 2)
            for c in (best - s, best + s):
                if 0 <= c <= most:
                    at(c)
            best = max(seen, key=lambda c: max((r[phase] for _, r in seen[c]), default=0.0))
    return [hot] + [p for c in sorted(seen, reverse=True) for p, _ in seen[c]]


MACHINE_SPLIT_DENSE = 9          # dense shares of the split candidates (0, 1/8, ..., 1)


def first_gpu_problem(problem):
    """The same problem on the first GPU alone with its budget (None when the working set does not fit it):
    its placements are the several-GPU problem's placements without a split, predicted the same."""
    from strata_plan.errors import UserError
    from strata_plan.planner.capacity import Budget
    b = problem.budget
    try:
        return problem.replace(profile=problem.profile.first_gpus(1), budget=Budget(b.gpus[0], b.ram, b.nvme, b.reserve))
    except UserError:
        return None


def _split_machine_placements(problem) -> list:
    """Several GPUs: the first GPU's own candidates (no split), and the allocator's water-fill over an even
    pipeline split (each GPU filling its own budget) on a grid of dense shares, cache weights and skews."""
    from strata_plan.planner.placement import Knobs, allocate
    one = first_gpu_problem(problem)
    out = machine_placements(one) if one is not None else []
    share = 1.0 / problem.n_gpus
    for i in range(MACHINE_SPLIT_DENSE):
        for bias in MACHINE_CACHE_BIAS:
            for w in MACHINE_SKEW:
                a = allocate(problem, Knobs(i / (MACHINE_SPLIT_DENSE - 1), bias, w, 0, share))
                if a.footprint.fits(problem.budget):
                    out.append(a.placement)
    return out


def ranked_bound(problem, placement) -> tuple[float, float]:
    """(decode, prefill) tok/s of `physical_bound` computed in rank space with numpy: the same bytes and
    peaks, to rank many candidate placements quickly (a test holds it to `physical_bound`)."""
    import numpy as np
    spec, cur, C, k = problem.spec, problem.curves, problem.prefill_chunk, problem.spec.top_k
    rb, pop = problem.rank_bytes, cur.pop
    L, E = pop.shape
    s, m, c = (np.array(x, dtype=np.int64) for x in (placement.vram, placement.ram, placement.cache))
    units = problem.dense_units
    streamed = float(sum(u for u, res in zip(units, placement.dense_resident) if not res))
    ranks = np.arange(E)[None, :]
    nonstatic, nvme = ranks >= s[:, None], ranks >= (s + m)[:, None]
    big = np.where(nonstatic, rb, 0).max(axis=1)
    big_nvme = np.where(nvme, rb, 0).max(axis=1)
    removed = k * np.maximum(0.0, cur.hits(s, c) - cur.cum[np.arange(L), s])
    miss = k * (pop * rb * nonstatic).sum(axis=1)
    cold = k * (pop * rb * nvme).sum(axis=1)
    touch = (1.0 - np.exp(-C * k * pop)) * rb
    head = 2 * (spec.lm_head_params + spec.hidden + (spec.embedding_params if spec.tied_embeddings else 0))
    dec = {"hbm": float(sum(units) + spec.kv_cache_bytes(problem.context)) + k * float((pop * rb).sum()),
           "compute": float(spec.flops_per_token(problem.context)),
           "pcie": streamed + 2 * spec.hidden + float(np.maximum(0.0, miss - removed * big).sum()),
           "nvme": float(np.maximum(0.0, cold - removed * big_nvme).sum())}
    if not placement.several:
        from strata_plan.core.lookahead import pinned_staging_slots    # `_staging_bytes`, `_staged_floor`: rank space
        S = pinned_staging_slots(k, placement.prefetch_depth, placement.staging)
        st, idx = problem.stats, np.arange(L)
        base, rest = cur.cum[idx, s + m], 1.0 - cur.cum[idx, s]
        near = c * (1.0 - base) / np.where(rest > 1e-12, rest, 1.0) * (rest > 1e-12)
        slots = np.minimum(S, E - s - m)
        kept = k * np.maximum(0.0, np.array([st.cache_hit(l, int(s[l] + m[l]), float(slots[l] + near[l]))
                                             for l in range(L)]) - base)
        floor = np.where(slots > 0, np.maximum(0.0, cold - kept * big_nvme), 0.0)
        dec["nvme"] = float(np.minimum(np.maximum(0.0, cold - removed * big_nvme), floor).sum())
        reads = np.sort((k * pop * rb)[nvme])[::-1]
        dec["nvme"] = max(0.0, dec["nvme"] - float(reads[:S].sum()))
    pre = {"hbm": float(sum(units)) + float(touch.sum()), "pcie": streamed + float((touch * nonstatic).sum()),
           "nvme": float((touch * nvme).sum()),
           "compute": float(C * (spec.flops_per_token(max(1, problem.context // 2)) - head) + head)}
    if placement.several:                   # the same bytes per GPU, through split_bound's times
        ug = placement.unit_gpus()
        mg, G = ug[np.asarray(spec.moe_layers, dtype=np.int64)], problem.n_gpus
        res = np.array(placement.dense_resident)
        kv = list(problem.layer_kv_bytes) + [0]
        per = lambda w, idx: np.bincount(idx, weights=w, minlength=G).tolist()  # noqa: E731
        u = np.array(units, dtype=float)
        d = {"hbm": per(u + np.array(kv, float), ug), "pcie": per(u * ~res, ug)}
        d = {key: [a + b for a, b in zip(d[key], per(x, mg))] for key, x in
             (("hbm", k * (pop * rb).sum(axis=1)), ("pcie", np.maximum(0.0, miss - removed * big)))}
        d["pcie"][int(ug[0])] += 2 * spec.hidden
        pr = {"hbm": [a + b for a, b in zip(per(u, ug), per(touch.sum(axis=1), mg))],
              "pcie": [a + b for a, b in zip(per(u * ~res, ug), per((touch * nonstatic).sum(axis=1), mg))]}
        rem = placement.remote_counts
        v = np.array(placement.vram, dtype=np.int64)
        mask = (ranks >= (v - rem)[:, None]) & (ranks < v[:, None])
        q = (pop * mask).sum(axis=1)
        rbytes = k * (pop * rb * mask).sum(axis=1)
        lbytes = k * (pop * rb).sum(axis=1) - rbytes
        remote = [(int(mg[j]), placement.partner(int(mg[j]), G), float(lbytes[j]), float(rbytes[j]),
                   1.0 - (1.0 - min(float(q[j]), 1.0)) ** k) for j in np.flatnonzero(rem > 0)]
        b = _split_result(problem, [int(g) for g in ug], d, pr, dec["nvme"], pre["nvme"], remote)
        return (b.decode_tok_s, b.prefill_tok_s)
    peaks = link_peaks(problem.profile)
    t_dec, _ = _time(dec, peaks)
    t_pre, _ = _time(pre, peaks)
    return (1.0 / t_dec if t_dec > 0 else math.inf, C / t_pre if t_pre > 0 else math.inf)


def machine_bound(problem, extra=()) -> MachineBound:
    """See `MachineBound`; `extra` placements (a plan's own, a smaller budget's) join the candidates. The
    candidates are ranked by `ranked_bound`, the best for decode and for prefill each hill-climbed on it
    (polish.py's moves, MACHINE_POLISH scorings); the winners' bounds are `physical_bound`'s."""
    from strata_plan.planner.polish import polish
    cands = [*machine_placements(problem), *extra]
    ranked = [ranked_bound(problem, p) for p in cands]
    dec = cands[max(range(len(cands)), key=lambda i: (ranked[i][0], -i))]
    pre = cands[max(range(len(cands)), key=lambda i: (ranked[i][1], -i))]
    dec = polish(problem, dec, lambda p: ranked_bound(problem, p)[0], MACHINE_POLISH)[0]
    pre = polish(problem, pre, lambda p: ranked_bound(problem, p)[1], MACHINE_POLISH)[0]
    return MachineBound(physical_bound(problem, dec), physical_bound(problem, pre), dec, pre)


def machine_bounds(problem, budgets) -> list[MachineBound | None]:
    """The machine bound at each budget (`capacity.Budget`), computed from the smallest up, each with the
    placements of every smaller budget it contains among its candidates: along the sweep more of any
    resource never lowers it. None where the working set does not fit."""
    from strata_plan.errors import UserError
    order = sorted(range(len(budgets)), key=lambda i: (budgets[i].vram + budgets[i].ram + budgets[i].nvme, i))
    out: list[MachineBound | None] = [None] * len(budgets)
    done: list[tuple[object, MachineBound]] = []
    for i in order:
        b = budgets[i]
        try:
            p = problem.replace(budget=b)
        except UserError:
            continue
        below = [m for bb, m in done if b.contains(bb)]
        extra = ([max(below, key=lambda m: m.decode_tok_s).decode_placement,
                  max(below, key=lambda m: m.prefill_tok_s).prefill_placement] if below else [])
        out[i] = machine_bound(p, extra=extra)
        done.append((b, out[i]))
    return out
