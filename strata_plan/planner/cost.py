"""The cost model: predicted decode and prefill tok/s of a placement, with the binding resource.

Decode (batch 1) walks the decoder layers in order, keeping a GPU clock t. For MoE layer j with s static
experts, m in RAM, c cache slots, k routed per token, rank popularity p_r and expert bytes b_r:

    h  = cache_hit(j, s, c)                      hit rate of static set + LRU cache (routing statistics)
    w_r = p_r exp(-k p_r T)  for r >= s          the share of accesses that miss, by rank (Che's LRU
                                                 approximation), T such that sum_r w_r = 1 - h
    warm bytes = k sum_{s <= r < s+m} w_r b_r    from pinned RAM over PCIe;   cold bytes: the same for r >= s+m (NVMe)
    t += overhead + max((dense_i + kv_i) / (HBM x hbm_eff), FLOPs_i / (TFLOPS x compute_eff))   each layer
    t_exp_j = k sum_r p_r b_r / kernel_GBps(format_r)     the fused MoE decode call (rates.py)
    T_token = max(t, total PCIe busy time, total NVMe busy time);  decode tok/s = 1 / T_token

One GPU (`in_place`: the engine's device loop runs every one-GPU plan): the GPU reads RAM experts straight from
registered pinned RAM (zero-copy), no round trip, host fetch or stall. With lookahead depth d (recall R, precision P
from the statistics; layers j < d get R = 0) the share R of a layer's RAM misses (and R waste / P wrong guesses) is
copied into VRAM slots on a side stream from when layer j-d ends, at R_zc, one expert after another; an expert not
landed whole when layer j runs is read in place in full (never waited for; its copied part is wasted, the rest and
the layer's later guesses skipped). The copies and the in-place reads
share the one link (`LinkCopies`): a copy runs at R_zc only while the layers' reads leave the link idle (attention,
routers, dense layers), beside a read the two share it evenly, and the token's end waits for the last copy. A layer's
reads of pinned RAM and its fused call's own time add up (the call's programs read their experts, then compute; on the
H100 the call at bench-moe's shape took 27.1 us in place against 16.9 to read its bytes and 10.2 from VRAM,
benchmarks/tools/inplace_probe.py); with cache slots the device LRU first copies each miss it admits into its slot
(the same bytes over the link), then the kernel reads VRAM, the same sum:
    t += t_ram + t_exp_j      t_ram = warm bytes_j / R_zc(warm bytes_j)
the device LRU's step and fill before the call (the profile's measured cache_layer_us, every layer where the plan has
cache slots; without any, the routed ids counted on the device, a launch at the floor; with an NVMe tier the stager's
handshake too, the profile's measured stage_layer_us): t += residency_gpu_seconds_j;
with lookahead the layer then runs the slot kernels on the main stream: t += lookahead_gpu_seconds_j (resolve at the
profile's measured lookahead_layer_us, release on the side stream; with an NVMe tier also the gates of every depth,
their launches at graph_launch_us, counted in core.lookahead, plus their router bytes over HBM; without one the gate
runs on the side stream with the copies). R_zc: the profile's zero_copy curve at that read size,
else the pinned H2D curve there (an estimate); the PCIe busy time counts the warm bytes at R_zc too. Streamed dense
weights are read in place as their layer runs, bytes / R_zc(bytes), instead of over HBM.
With an NVMe tier its misses are read by the GPU in place from a pinned staging cache of S slots (`stage_slots`), so
their bytes count with the warm ones; those it does not hold (Che's approximation over every layer's NVMe misses,
the statistics' LRU curve where a layer's locality keeps more: `staging_miss`, planner/staging.py) are read from
NVMe (reads.py: a layer's expected misses of each format as one batch, T(n_f)), R of them when layer j-d ends (the
guesses reach the stager through a pinned ring; with `Problem.lookahead_point` "attention" when layer j-d's router
runs, submitted behind that layer's demand batch), the rest after the router, and the layer waits for what has not
landed:
    t += max(S(demand batch), landed_j - t)      before the layer's MoE; landed_j = done_{j-d} + S(lookahead batch),
                                                 at the router start_{j-d} + S(the queue up to and with it)
    S(n) = wake + max(T(n), (n - 1) read + T(1)) + publish    the stager's host starts a batch's reads one after
                                                              another, and publishes them after the last is in
(calibration `stager_wake_us`, `stager_read_us`, `stager_publish_us`). The drive serves reads in the order the
stager submits them: a batch lands after the reads submitted before it and still on the drive (the part of the
lookahead's batches issued earlier not landed at t: T(n + m), T(1 + m)), and reads submitted behind it do not delay
it (measured: the demand reads of rows with the router's guesses behind them landed no later, engine/ENGINE.md);
the NVMe busy time counts every read's T, wrong guesses included.

The copy path is for several-GPU placements only (pipeline splits, `Placement.gpu_split`, `Placement.remote`: the
engine does not run them, these are predictions). Misses are copied (b_r / H2D(b_r) on the pinned curve; while
kernels run h2d_during_kernel, else H2D x copy_overlap) after a host round trip rt per MoE layer (calibration
`moe_round_trip_us`); R of them prefetched when layer j-d finishes (R (1-P)/P wasted bytes per miss byte), the rest
fetched on demand after the router, stall = max(PCIe time, T((1-R) n_f)) + one expert's copy (pipeline fill):
    t += rt + max(stall, host_dem) + max(0, host_pre - attention_i) + (1 - overlap) prefetch time
    t = max(t, done_{j-d} + rt + prefetch time);  t += t_exp_j;  done_j = t
(host_dem, host_pre: the host issuing the demand fetches and the prefetches, `host_fetch_us` each; overlap:
`prefetch_overlap`, 1 the ideal).
Streamed dense weights are double buffered, serial on the link, and land before their layer starts. Each layer runs
at its GPU's rates over its GPU's link, the hidden state hops at split points and to a partner's remote experts, the
host side's concurrent H2D bounds all links (PLANNER.md, "Several GPUs").

Prefill runs chunks of C tokens; expert r of a layer is touched by a chunk with probability
1 - (1 - min(1, k p_r))^C and every touched non-resident expert streams once per chunk:
    T_chunk = sum_i [overhead (+ rt at MoE layers) + max(GPU_i, PCIe_i + dense stream_i, NVMe_i)],
    prefill tok/s = C / T_chunk
with GPU_i = max(C FLOPs_i / (TFLOPS x compute_eff), weight bytes / (HBM x hbm_eff), touched experts x
3 hidden moe_intermediate / expansion rate) (rates.py: every touched expert is expanded once a chunk); rt: the
router's ids reach the host, which streams the chunk's experts through the VRAM slots (every placement).

The constants that measured runs refine come from the profile's `Calibration`. PLANNER.md has the long form. This
module knows nothing about Optuna or YAML; bound.py is the independent check.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from strata_plan.core.lookahead import GATE_LAUNCHES, ISSUE_LAUNCHES, pinned_staging_slots, staging_slots
from strata_plan.kernels.copy_units import COPY_CHUNK, COPY_PROGRAMS
from strata_plan.planner.rates import decode_rates, expansion_rate
from strata_plan.planner.reads import TINY_RATE, ExpertRead, batch_seconds, expert_read

RESOURCES = ("pcie", "nvme", "hbm", "compute", "overhead")


def plateau(curve) -> float:
    """Bytes/s at a curve's best point (a large transfer)."""
    return max(v for _, v in curve.points) * 1e9


@dataclass(frozen=True)
class Prediction:
    """Predicted throughput of one placement (all figures are predictions, not measurements)."""

    decode_tok_s: float
    prefill_tok_s: float
    decode_binding: str
    prefill_binding: str
    decode_seconds: dict        # per token: critical-path seconds per resource, plus link busy totals
    prefill_seconds: dict       # per chunk, the same
    bytes_per_token: dict       # decode bytes per token by source tier (vram, ram, nvme), wasted, pcie
    bytes_per_chunk: dict       # prefill bytes per chunk by source tier
    hit_rate: float             # share of routed-expert accesses served from VRAM (static + cache)
    ram_share: float            # ... from pinned RAM
    nvme_share: float           # ... from NVMe


def hops(ug: np.ndarray) -> int:
    """Split points the hidden state crosses: consecutive dense units (decoder layers, then the head) on
    different GPUs."""
    return int(np.count_nonzero(np.diff(ug)))


def _cumrows(x: np.ndarray) -> np.ndarray:
    """[L, E] -> [L, E+1] prefix sums along ranks, starting at 0."""
    out = np.zeros((x.shape[0], x.shape[1] + 1))
    np.cumsum(x, axis=1, out=out[:, 1:])
    return out


RAGGED_BYTES = (COPY_PROGRAMS - 1) / 2 * COPY_CHUNK
"""Bytes a cut lookahead copy has moved past its guess's landed prefix, on average: its programs take the chunks in
turn, so about COPY_PROGRAMS chunks are in flight at the cut, half of them done (`_landed`)."""


class LinkCopies:
    """The device loop's lookahead copies on the one GPU's PCIe link, in issue order (the side stream runs them one
    after the other), as seconds of link time each needs alone. Alone on the link they run at its full rate; beside
    the layer's in-place reads (or a dense unit read in place) the two share it evenly (`beside`), so a copy issued
    into a busy link delays both. A copy starts no earlier than its `start` (the side stream's kernels before it).
    `landed[j]`: when layer j's copy ended."""

    def __init__(self):
        self.queue: list[list] = []           # [layer, seconds left alone on the link, start], oldest first
        self.t = 0.0                          # the time the queue is drained to
        self.landed: dict[int, float] = {}

    def add(self, t: float, layer: int, seconds: float, start: float | None = None) -> None:
        self.run(t)
        self.queue.append([layer, seconds, t if start is None else max(t, start)])

    def run(self, t: float, rate: float = 1.0) -> None:
        """Drain from `self.t` to t at `rate` of the link."""
        now = self.t
        while self.queue and now < t:
            head = self.queue[0]
            now = max(now, head[2])
            if now >= t:
                break
            if now + head[1] / rate <= t:
                now += head[1] / rate
                self.queue.pop(0)
                self.landed[head[0]] = now
            else:
                head[1] -= (t - now) * rate
                now = t
        self.t = max(self.t, t)

    def left(self, layer: int) -> float:
        """Seconds of layer's copy not yet done (0: landed, or none issued)."""
        return next((q[1] for q in self.queue if q[0] == layer), 0.0)

    def take(self, t: float, layer: int) -> float:
        """Layer's MoE starts at t: what its copy has not moved is read in place instead (the copy skips the chunks
        of a guess its layer took). Returns those seconds."""
        self.run(t)
        left = self.left(layer)
        self.queue = [q for q in self.queue if q[0] != layer]
        return left

    def beside(self, t: float, read: float) -> float:
        """A read of `read` seconds alone on the link starting at t, beside the copies queued then: the two share the
        link until one is done. Returns the read's seconds."""
        self.run(t)
        both = min(read, sum(q[1] for q in self.queue))
        self.run(t + 2.0 * both, rate=0.5)
        return read + both

    def drained(self, t: float) -> float:
        """When every queued copy is done, from t on (the token's end joins the side stream)."""
        self.run(t)
        return t + sum(q[1] for q in self.queue)


@dataclass(frozen=True, eq=False)
class CostModel:
    problem: object     # planner.problem.Problem
    gpu_index: int = 0  # the GPU whose rates this model reads (several GPUs: `predict` asks each GPU's model)
    _memo: dict = field(default_factory=dict, repr=False)    # NVMe read shapes and tables per in-flight count

    # ---- machine rates (bytes/s, FLOP/s, s) ------------------------------------------------------
    @cached_property
    def _cal(self):
        return self.problem.profile.calibration

    @property
    def gpu(self):
        return self.problem.profile.gpus[self.gpu_index]

    def gpu_model(self, g: int) -> "CostModel":
        """The cost model reading GPU g's rates (the same problem)."""
        if g == self.gpu_index:
            return self
        key = ("gpu", g)
        if key not in self._memo:
            self._memo[key] = CostModel(self.problem, g)
        return self._memo[key]

    def hop_seconds(self, nbytes: float, a: int, b: int) -> float:
        """Seconds to move `nbytes` of hidden state from GPU a to GPU b: over the peer link (its latency plus
        bytes over its rate), or without one through pinned host memory (D2H on a, then H2D on b, each a
        latency plus bytes over the curve's plateau)."""
        peer = self.problem.profile.peer
        lat = peer.latency.value * 1e-6
        if peer.kind != "none":
            return lat + nbytes / (peer.gbps.value * 1e9)
        ga, gb = self.problem.profile.gpus[a], self.problem.profile.gpus[b]
        return 2 * lat + nbytes / plateau(ga.d2h_pinned) + nbytes / plateau(gb.h2d_pinned)

    @cached_property
    def hbm_rate(self) -> float:
        return self.gpu.hbm_gbps.value * 1e9 * self._cal.hbm_efficiency.value

    @cached_property
    def flop_rate(self) -> float:
        return self.gpu.bf16_tflops.value * 1e12 * self._cal.compute_efficiency.value

    @cached_property
    def overhead(self) -> float:
        return self._cal.layer_overhead_us.value * 1e-6

    @cached_property
    def measured_layers(self):
        """The profile's measured decode times of this model's layers (`GPU.layer_time` of the spec's
        `layer_geometry`, `engine.layer_times`), or None."""
        return self.gpu.layer_time(self.problem.spec.layer_geometry)

    @cached_property
    def layer_overheads(self) -> np.ndarray:
        """[n_layers] seconds each decoder layer takes at decode beyond its bytes over HBM (dense weights and KV
        cache, `_layers`): where the profile measured this geometry's layers, the measured time less those bytes
        at the context it was measured at (the kernels' own latency and launch gaps inside a graph: a measured
        quantity); else `layer_overhead_us` (calibration) for every layer."""
        spec, lt = self.problem.spec, self.measured_layers
        if lt is None:
            return np.full(spec.n_layers, self.overhead)
        lay = self._layers
        out = []
        for i, kind in enumerate(spec.layer_kinds):
            us = lt.dense_layer_us if kind == "dense" else lt.moe_layer_us
            kv = spec.kv_cache_layer_bytes(i, lt.context)             # the KV cache it read when timed
            out.append(max(0.0, us * 1e-6 - (lay["dense"][i] + kv) / self.hbm_rate))
        return np.array(out)

    @cached_property
    def head_overhead(self) -> float:
        """Seconds the head (embedding row, final norm, lm_head, argmax) takes beyond the lm_head's bytes over HBM,
        measured with the layers (`measured_layers`), and where the decode samples (`Problem.sampled`) the draw's
        measured time beyond the argmax (`pick_us`); 0 without (the calibrated per-layer overhead covers it)."""
        lt = self.measured_layers
        if lt is None:
            return 0.0
        pick = lt.pick_us * 1e-6 if self.problem.sampled else 0.0
        return max(0.0, lt.head_us * 1e-6 - self.problem.dense_units[-1] / self.hbm_rate) + pick

    @cached_property
    def launch(self) -> float:
        """Seconds one small kernel takes inside a CUDA graph (the profile's `graph_launch_us`, else an estimate)."""
        return self.gpu.launch_us().value * 1e-6

    def lookahead_gpu_seconds(self, placement) -> np.ndarray:
        """[L] GPU seconds the device loop's lookahead adds to each MoE layer on its main stream: its slot kernels
        (`resolve` before the layer's MoE call: the profile's measured `lookahead_layer_us`, else an estimate; `release`
        runs on the side stream, but for one at the token's end, at the launch floor) and, with an NVMe tier, the gates
        of every depth where layer j + d exists (the stager takes their guesses with the layer's end): `GATE_LAUNCHES`
        at the launch floor and the router's weights (hidden x experts, bf16) over HBM. Without an NVMe tier the gate
        runs on the side stream with the prefetch's claim and copy, off the main stream. No gate when the run replays
        routing (`Problem.lookahead_gates` False: the replay hands the guesses over)."""
        spec, depth, E = self.problem.spec, placement.prefetch_depth, self.problem.curves.n_experts
        L = spec.n_moe_layers
        if not depth:
            return np.zeros(L)
        j = np.arange(L)
        gates = np.minimum(depth, L - 1 - j) * float(self.problem.lookahead_gates * self._staged(placement))
        return (self.lookahead_layer + (gates * GATE_LAUNCHES + (j == L - 1)) * self.launch
                + gates * 2.0 * spec.hidden * E / self.hbm_rate)

    def residency_gpu_seconds(self, placement) -> np.ndarray:
        """[L] GPU seconds the device loop's residency kernels take on each MoE layer's main stream: where the plan
        has cache slots (in any layer: the store's one device LRU steps every layer) the LRU's step and fill (the
        profile's measured `cache_layer_us`, else an estimate: their fixed part; the bytes a fill copies are the
        layer's reads), else the routed ids counted on the device (one launch at the floor); with an NVMe tier also the
        stager's handshake in every MoE layer (`stage_wait`, `stage_done`: the profile's measured `stage_layer_us`,
        else an estimate; their fixed part, the waits are the reads'). With lookahead `resolve` runs in the LRU step's
        launch and adds `lookahead_layer_us` (lookahead_gpu_seconds)."""
        cached = bool(np.any(np.asarray(placement.cache) > 0))
        each = self.gpu.cache_layer().value * 1e-6 if cached else self.launch
        if self._staged(placement):
            each += self.gpu.stage_layer().value * 1e-6
        return np.full(len(placement.cache), each)

    def side_start_seconds(self, placement) -> float:
        """Seconds from a MoE layer's end to the start of the next lookahead copy on the side stream: the kernels the
        side stream runs before it (`release`, the guesses noted, the claim: `ISSUE_LAUNCHES` + 1; the gate's
        `GATE_LAUNCHES` where it runs there: no NVMe tier, routing not replayed), each at least the launch floor."""
        gate = GATE_LAUNCHES if self.problem.lookahead_gates and not self._staged(placement) else 0
        return (ISSUE_LAUNCHES + 1 + gate) * self.launch

    def _staged(self, placement) -> bool:
        """The placement has an NVMe tier (the device loop's stager): the lookahead's gates run on the main stream."""
        s, m, _ = placement.arrays
        return bool(np.any(np.asarray(s) + np.asarray(m) < self.problem.curves.n_experts))

    @cached_property
    def lookahead_layer(self) -> float:
        """Seconds the lookahead's slot kernels add to a MoE layer's main stream (profile, else an estimate)."""
        return self.gpu.lookahead_layer().value * 1e-6

    @cached_property
    def host_fetch(self) -> float:
        """Seconds of host time to issue one expert fetch (the store's bookkeeping and the copy's enqueue)."""
        return self._cal.host_fetch.value * 1e-6

    @cached_property
    def stager_host(self) -> tuple[float, float, float]:
        """Seconds of the device loop's NVMe stager on the host (calibration): (wake, read, publish), from a layer's
        request to its first read starting, between the starts of its next reads, and from its last read in to its
        ready words (`staged_batch_seconds`)."""
        cal = self._cal
        return cal.stager_wake.value * 1e-6, cal.stager_read.value * 1e-6, cal.stager_publish.value * 1e-6

    @cached_property
    def prefetch_overlap(self) -> float:
        """Share (0..1) of a prefetch's link time hidden behind the rest of the token (calibration)."""
        return min(1.0, max(0.0, self._cal.overlap.value))

    @cached_property
    def round_trip(self) -> float:
        """Seconds of one MoE layer's host round trip (router ids to the host, `ensure`, the MoE launch)."""
        return self._cal.round_trip.value * 1e-6

    def h2d(self, size: float) -> float:
        """Pinned H2D bytes/s at this transfer size with nothing else running (demand fetches)."""
        return self.gpu.h2d_pinned.at(size) * 1e9

    def h2d_background(self, size: float) -> float:
        """Pinned H2D bytes/s while kernels run (prefetches, dense streaming, prefill)."""
        if self.gpu.h2d_during_kernel is not None:
            return self.gpu.h2d_during_kernel.at(size) * 1e9
        return self.h2d(size) * self._cal.copy_overlap.value

    def zero_copy(self, size: float) -> float:
        """Bytes/s the kernels read registered pinned host memory in place (zero-copy: the device loop's RAM
        experts) in a read of `size` bytes: the profile's `zero_copy` curve at that size, else the pinned H2D
        curve there (an estimate: the same PCIe link, read by the GPU's SMs instead of its copy engine; the H200
        read 16-256 MiB in place at 48.5-49.5 GB/s and copied it at 51-52)."""
        if self.gpu.zero_copy is not None:
            return self.gpu.zero_copy.at(size) * 1e9
        return self.h2d(size)

    def in_place(self, placement) -> bool:
        """Whether `placement` reads RAM experts in place from pinned RAM with no host work, as the engine's device
        loop runs every one-GPU plan; several GPUs take the copy path (predictions only)."""
        return not placement.several

    def stage_slots(self, placement) -> int:
        """Slots of the device loop's pinned staging cache (`core.lookahead.pinned_staging_slots`, as the engine)."""
        return pinned_staging_slots(self.problem.spec.top_k, placement.prefetch_depth, placement.staging)

    def staging_miss(self, placement, cold_w: np.ndarray) -> np.ndarray:
        """[L, E] the chance an NVMe miss of each rank is not in the pinned staging cache, so the stager reads it
        (`planner.staging`: one LRU over every layer's NVMe misses, Che's approximation for each layer's share of its
        slots, the statistics' own LRU curve where a layer's locality keeps more); the slots the reads in flight
        take: the layer's top_k and the lookahead's depth x top_k."""
        from strata_plan.planner.staging import staging_miss
        k, d = self.problem.spec.top_k, placement.prefetch_depth
        return staging_miss(self.problem.stats, placement, cold_w, self.stage_slots(placement), k * (1 + d))

    def non_moe_seconds(self, placement) -> float:
        """GPU seconds of a decode token without its MoE calls and without the per-layer overhead (one GPU): each
        decoder layer's dense + KV bytes over HBM or its FLOPs, whichever is longer (streamed dense units read in
        place over PCIe in the device loop), and the lm_head. What the device loop's step without its MoE calls
        (`DeviceDecode.time_parts`' t_nonMoE) takes less `n_layers x layer_overhead_us`: `calibrate` measures the
        overhead from it."""
        lay, units = self._layers, self.problem.dense_units
        t = 0.0
        for i in range(self.problem.spec.n_layers):
            hbm = (lay["dense"][i] + lay["kv"][i]) / self.hbm_rate
            if not placement.dense_resident[i] and self.in_place(placement):
                hbm = lay["kv"][i] / self.hbm_rate + self.in_place_dense_seconds(units[i])
            t += max(hbm, lay["flops_dec"][i] / self.flop_rate)
        head = units[-1] / self.hbm_rate
        if not placement.dense_resident[-1] and self.in_place(placement):
            head = self.in_place_dense_seconds(units[-1])
        return t + max(head, 2.0 * self.problem.head_params / self.flop_rate)

    def in_place_dense_seconds(self, nbytes: float) -> float:
        """Seconds the device loop's kernels take to read a streamed dense unit in place from pinned RAM (attention,
        norms, router, shared experts or the lm_head over PCIe, `engine.dense` in place): bytes / R_zc(bytes), serial
        with the layer (nothing else is read meanwhile)."""
        return nbytes / self.zero_copy(nbytes) if nbytes else 0.0

    def ram_read_seconds(self, warm_bytes: np.ndarray) -> np.ndarray:
        """[L] seconds the kernels take to read each MoE layer's RAM bytes a token in place: bytes / R_zc(bytes)."""
        return np.array([w / self.zero_copy(w) if w > 0 else 0.0 for w in warm_bytes])

    def nvme(self, size: float, queue_depth: int) -> float:
        """O_DIRECT random-read bytes/s at this block size and queue depth (the first NVMe of the profile)."""
        nv = self.problem.profile.nvme
        return nv[0].rand_read.at(size, queue_depth) * 1e9 if nv else TINY_RATE

    @cached_property
    def _decode_rates(self) -> dict:
        return decode_rates(self.problem, self.gpu)

    def kernel_rate(self, fmt: str) -> float:
        """Bytes/s the fused MoE decode call streams a packed format from VRAM (rates.decode_rates)."""
        return self._decode_rates[fmt].value

    @cached_property
    def expansion_rate(self) -> float:
        """Weights/s the fused MoE prefill call expands packed experts at (rates.expansion_rate)."""
        return expansion_rate(self.problem, self.gpu).value

    def nvme_reads(self, in_flight: int) -> dict[str, ExpertRead]:
        """Per format: how the store reads it with `in_flight` experts outstanding (reads.expert_read)."""
        key = ("nvme_reads", in_flight)
        if key not in self._memo:
            nv = self.problem.profile.nvme
            depths = nv[0].rand_read.queue_depths if nv else ()
            smallest = min(b for b, _, _ in nv[0].rand_read.points) if nv else 0
            self._memo[key] = {f: expert_read(self.nvme, depths, f, self.problem.spec.routed_expert_bytes(f), in_flight,
                                              smallest) for f in self.problem.mix.formats}
        return self._memo[key]

    # ---- per-layer model quantities ---------------------------------------------------------------
    @cached_property
    def _layers(self) -> dict:
        spec, ctx = self.problem.spec, self.problem.context
        att, w = spec.attention, spec.attention.sliding_window
        kv_dec, fl_dec, fl_pre = [], [], []
        ctx_pre = max(1, ctx // 2)       # a prompt of `context` tokens attends on average to half of it
        for i in range(spec.n_layers):
            sliding = bool(spec.sliding_layers) and spec.sliding_layers[i] and w > 0
            c_dec, c_pre = (min(ctx, w), min(ctx_pre, w)) if sliding else (ctx, ctx_pre)
            kv_dec.append(att.kv_bytes_per_token_layer * c_dec)
            base = 2 * spec.dense_layer_params(i)
            fl_dec.append(base + att.score_flops(c_dec))
            fl_pre.append(base + att.score_flops(c_pre))
        return {"kv": np.array(kv_dec, float), "flops_dec": np.array(fl_dec, float),
                "flops_pre": np.array(fl_pre, float), "dense": np.array(self.problem.dense_units[:-1], float)}

    @cached_property
    def _rank_times(self) -> dict:
        """Seconds per byte-weighted access of each rank over each path, [E] arrays."""
        p = self.problem
        rb, fmts = p.rank_bytes, p.rank_formats
        size = {f: float(b) for f, b in zip(fmts, rb)}
        fg = {f: size[f] / self.h2d(size[f]) for f in size}
        bg = {f: size[f] / self.h2d_background(size[f]) for f in size}
        kern = {f: size[f] / self.kernel_rate(f) for f in size}
        arr = lambda d: np.array([d[f] for f in fmts])  # noqa: E731
        return {"fg": arr(fg), "bg": arr(bg), "kern": arr(kern)}

    def _nvme_table(self, in_flight: int) -> np.ndarray:
        """[L, E+1] prefix sums over ranks of P(touched by a prefill chunk) x NVMe seconds of the rank's expert
        at a full queue of `in_flight` experts (a stream of reads: prefill)."""
        key = ("nvme_table", in_flight)
        if key not in self._memo:
            reads = self.nvme_reads(in_flight)
            t = np.array([reads[f].seconds_per_expert for f in self.problem.rank_formats])
            self._memo[key] = _cumrows(self._tables["touch"] * t)
        return self._memo[key]

    @property
    def decode_in_flight(self) -> int:
        """Experts whose NVMe reads the store keeps outstanding at decode: a layer's top-k misses, known
        together after its router and submitted together (independent of the placement, so fewer misses
        never predict a slower drive)."""
        return self.problem.spec.top_k

    @cached_property
    def _format_masks(self) -> np.ndarray:
        """[F, E] 1.0 where the rank's expert has format F (mix order)."""
        fmts = self.problem.rank_formats
        return np.array([[1.0 if g == f else 0.0 for g in fmts] for f in self.problem.mix.formats])

    def _cold_batch(self, counts: np.ndarray) -> np.ndarray:
        """[L] seconds to read batches of counts [F, L] expected NVMe misses together (reads.batch_seconds)."""
        reads = self.nvme_reads(self.decode_in_flight)
        return batch_seconds([reads[f] for f in self.problem.mix.formats], counts)

    def staged_batch_seconds(self, counts: np.ndarray, beside: np.ndarray | None = None) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
        """[L] seconds the device loop's stager takes to land batches of counts [F, L] expected NVMe reads, and [L]
        the drive's part. The stager's host starts a batch's reads one after another: the first `wake` after the
        request, each next `read` later, each read then taking the drive's time for one (T(1), the batch's mix of
        formats); the drive reads the batch together in T(n); the host publishes them `publish` after the last is in.
        n reads (n >= 1) are ready after
            wake + max(T(n), (n - 1) read + T(1)) + publish
        and a fraction n < 1 (a read with probability n) after n (wake + T(1) + publish). `beside` [F, L]: reads the
        drive serves at the same time (the lookahead's still in flight): the drive's times are those of both
        together, T(n + m) and T(1 + m)."""
        more = 0.0 if beside is None else beside
        drive = self._cold_batch(counts + more)
        n = counts.sum(axis=0)
        one = self._cold_batch(counts / np.maximum(n, 1e-30) + more)         # T(1) of the batch's mix
        wake, read, publish = self.stager_host
        many = wake + np.maximum(drive, (n - 1.0) * read + one) + publish
        return np.where(n <= 1.0, n * (wake + publish) + drive, many), drive

    @staticmethod
    def _reads_in_flight(pre_counts: np.ndarray, spans: dict[int, tuple[float, float]], j: int, depth: int,
                         t: float) -> np.ndarray:
        """[F] the lookahead's NVMe reads still on the drive at time t (MoE layer j's router), submitted before
        layer j's demand reads: the batches for layers j .. j+d issued so far (`spans`: layer -> (submitted, landed)
        seconds), the part of each not yet landed (its reads progressing together)."""
        out = np.zeros(pre_counts.shape[0])
        for jj in range(j, j + depth + 1):
            start, end = spans.get(jj, (0.0, 0.0))
            if end > start and end > t:
                out += min(1.0, (end - t) / (end - start)) * pre_counts[:, jj]
        return out

    def prefill_in_flight(self, depth: int) -> int:
        """Experts in flight while prefill streams a layer: every staging slot."""
        return staging_slots(self.problem.spec.top_k, depth)

    @cached_property
    def _tables(self) -> dict:
        """Per-layer popularity-weighted totals ([L]) and prefill prefix sums over ranks ([L, E+1])."""
        cur, rb, rt = self.problem.curves, self.problem.rank_bytes, self._rank_times
        pop = cur.pop
        k = cur.top_k
        C = self.problem.prefill_chunk
        touch = 1.0 - (1.0 - np.minimum(1.0, k * pop)) ** C      # P(expert touched by a prefill chunk)
        return {
            "touch": touch,
            "bytes": (pop * rb).sum(axis=1), "kern": (pop * rt["kern"]).sum(axis=1),
            "t_bytes": _cumrows(touch * rb), "t_bg": _cumrows(touch * rt["bg"]),
            "t_count": _cumrows(touch),
        }

    @cached_property
    def expert_call_seconds(self) -> np.ndarray:
        """[L] GPU seconds of a layer's fused MoE decode call on one GPU: its top-k experts' bytes at the kernel's
        rate by format (popularity-weighted), or their FLOPs, whichever takes longer."""
        k = self.problem.curves.top_k
        return np.maximum(k * self._tables["kern"], 2.0 * k * self.problem.spec.expert_params / self.flop_rate)

    def miss_bytes(self, placement) -> tuple[np.ndarray, np.ndarray]:
        """[L] routed bytes a decode token reads from outside VRAM: from pinned RAM, and from NVMe (the placement's
        tiers, its cache's hits taken off)."""
        x = self._misses(placement)
        return x["warm_bytes"], x["cold_bytes"]

    def _stream_time(self, nbytes: float) -> float:
        return nbytes / (self.h2d_background(nbytes) * self._cal.dense_stream_efficiency.value) if nbytes else 0.0

    # ---- prediction ---------------------------------------------------------------------------------
    def _miss_weights(self, s: np.ndarray, hit: np.ndarray) -> np.ndarray:
        """[L, E] share of a layer's routed accesses that miss VRAM, by rank: none of the s static ranks; the
        non-static ranks miss as an LRU cache under independent requests does (Che's approximation: rank r,
        accessed k pop_r times a token, is still cached after a characteristic time T with probability
        1 - exp(-k pop_r T)), T chosen so that the misses add up to the statistics' hit rate `hit`. So misses
        fall on every non-static rank, the less used more often; at the same hit rate they cost more bytes
        than if they fell on the least used alone (PLANNER.md, "Which experts miss")."""
        pop, k = self.problem.curves.pop, self.problem.curves.top_k
        L, E = pop.shape
        p = pop * (np.arange(E)[None, :] >= s[:, None])                       # [L, E] non-static ranks
        lam = k * p
        total = p.sum(axis=1)
        target = np.clip(hit - (1.0 - total), 0.0, total)                     # [L] cache hits to explain
        T = np.zeros(L)
        rows = np.flatnonzero((target > 0) & (target < total - 1e-12))      # layers with a cache to solve
        for _ in range(60):          # f(T) = sum p (1 - e^-lam T) - target: concave, rising; Newton from below
            if rows.size == 0:
                break
            pr, lr = p[rows], lam[rows]
            e = np.exp(-lr * T[rows, None])
            f = (pr * (1.0 - e)).sum(axis=1) - target[rows]
            df = (pr * lr * e).sum(axis=1)
            T[rows] = T[rows] - f / np.maximum(df, 1e-300)
            rows = rows[f < -1e-12 * target[rows]]
        w = p * np.exp(-lam * T[:, None])
        return np.where((target >= total - 1e-12)[:, None], 0.0, w)

    def _misses(self, placement) -> dict:
        """Per-layer miss terms of one decode token, [L] arrays: bytes from RAM and NVMe, cold misses, and the
        link seconds they take (demand 'fg' and background 'bg' H2D, NVMe)."""
        cur, k, E = self.problem.curves, self.problem.curves.top_k, self.problem.curves.n_experts
        s, m, c = placement.arrays
        h = cur.hits(s, c)
        w = self._miss_weights(np.asarray(s), h)                             # [L, E]
        cold = np.arange(E)[None, :] >= (np.asarray(s) + np.asarray(m))[:, None]     # NVMe-tier ranks [L, E]
        warm_w, cold_w = k * np.where(cold, 0.0, w), k * np.where(cold, w, 0.0)     # misses a token, by rank
        rb, rt = self.problem.rank_bytes, self._rank_times
        between = lambda x: (warm_w * x).sum(axis=1)      # noqa: E731
        beyond = lambda x: (cold_w * x).sum(axis=1)       # noqa: E731
        return {"hit": h, "warm_bytes": between(rb), "cold_bytes": beyond(rb), "n_miss": between(1.0) + beyond(1.0),
                "n_cold": beyond(1.0), "fg_warm": between(rt["fg"]), "fg_cold": beyond(rt["fg"]),
                "bg_warm": between(rt["bg"]), "bg_cold": beyond(rt["bg"]),
                "cold_counts": np.array([beyond(mask) for mask in self._format_masks]),   # [F, L] NVMe misses
                # [E, L] (the layer last, as every entry here: `_by_layer`)
                "cold_w": cold_w.T, "ram_share": between(1.0) / k, "nvme_share": beyond(1.0) / k}

    def _by_layer(self, placement, what) -> dict:
        """`what(model)` -> dict of [..., L] arrays over MoE layers, each layer's entry from the model of its GPU."""
        mg = placement.moe_gpus(self.problem.spec.moe_layers)
        used = sorted(set(int(g) for g in mg))
        out = what(self.gpu_model(used[0]))
        for g in used[1:]:
            other = what(self.gpu_model(g))
            out = {k: np.where(mg == g, other[k], v) for k, v in out.items()}
        return out

    def predict(self, placement) -> Prediction:
        p, cur, tb = self.problem, self.problem.curves, self._tables
        spec, k = p.spec, cur.top_k
        split = placement.several
        ug = placement.unit_gpus()
        x = self._by_layer(placement, lambda m: m._misses(placement)) if split else self._misses(placement)
        depth = placement.prefetch_depth
        recall, precision = cur.lookahead(depth)
        R = np.where(np.arange(cur.n_layers) >= depth, recall, 0.0)   # layers j < d have no source layer
        waste = (1.0 - precision) / precision
        dem_p, dem_n = (1 - R) * (x["fg_warm"] + x["fg_cold"]), self._cold_batch((1 - R) * x["cold_counts"])
        fill = (1 - R) * np.where(x["n_cold"] >= 1.0, x["fg_cold"] / np.maximum(x["n_cold"], 1.0), x["fg_cold"])
        pre_p = R * (1 + waste) * (x["bg_warm"] + x["bg_cold"])
        pre_n = self._cold_batch(R * (1 + waste) * x["cold_counts"])
        if split:
            kern = self._by_layer(placement, lambda m: {"kern": m._tables["kern"],
                                                        "flop": np.full(cur.n_layers, m.flop_rate)})
            remote = self._remote(placement)
            t_exp = np.maximum(k * kern["kern"] - remote["kern_local"], 2.0 * k * spec.expert_params / kern["flop"])
            t_peer = (1 - remote["p"]) * t_exp + remote["p"] * np.maximum(t_exp, remote["t_hit"]) - t_exp
        else:
            t_exp = self.expert_call_seconds
            t_peer = None

        n = x["n_miss"]                                                    # [L] experts fetched a token
        one = np.where(n > 0, (x["fg_warm"] + x["fg_cold"]) / np.maximum(n, 1e-30), 0.0)   # one's link time
        host_dem = (1 - R) * n * self.host_fetch + np.minimum(1.0, (1 - R) * n) * one
        host_pre = R * (1 + waste) * n * self.host_fetch

        inplace = None
        cold_read = x["cold_bytes"]                     # bytes read from NVMe a token (copy path: every cold miss)
        if self.in_place(placement):      # one GPU: no fetches; the GPU reads RAM (and staged) experts itself
            # cache slots: the device LRU admits at most its c slots' worth of a token's misses, copied into their
            # slots before the kernel; the other misses are read in place by the kernel (either way the bytes cross
            # the link before the call's own time). The lookahead copies the share R of the RAM misses (and R waste
            # / P wrong ones) into VRAM slots on a side stream from when layer j-d ends; what has not landed when
            # layer j runs is read in place (no wait)
            share = R * x["warm_bytes"]
            n_warm = x["n_miss"] - x["n_cold"]
            inplace = {"bytes": x["warm_bytes"] + x["cold_bytes"] - share, "share": share,
                       "copy_bytes": (1 + waste) * share, "copy": self.ram_read_seconds((1 + waste) * share),
                       "expert": np.where(n_warm > 0, x["warm_bytes"] / np.maximum(n_warm, 1e-30), 0.0),
                       # partial landing: a guess still copying serves the device LRU's fill what landed of it
                       "partial": np.asarray(placement.cache) > 0,
                       "lookahead": self.lookahead_gpu_seconds(placement),
                       "residency": self.residency_gpu_seconds(placement),
                       "side_start": self.side_start_seconds(placement),
                       # the walk's: the share of each layer's copy moved before the layer ran, and the share of
                       # its right guesses' bytes read from VRAM (the experts landed whole, or in part)
                       "moved": np.ones(cur.n_layers), "landed": np.ones(cur.n_layers)}
            zero = np.zeros(cur.n_layers)
            dem_p = fill = pre_p = host_dem = host_pre = zero
            # NVMe misses the staging cache does not hold are read by the stager: the lookahead's share R issued
            # when layer j-d is done, the rest after the router (the layer waits for the batch)
            cold_w = x["cold_w"].T                                  # [L, E] NVMe misses a token, by rank
            read_w = cold_w * self.staging_miss(placement, cold_w)
            counts = np.array([(read_w * mask).sum(axis=1) for mask in self._format_masks])    # [F, L]
            inplace["dem_counts"], inplace["pre_counts"] = (1 - R) * counts, R * (1 + waste) * counts
            (dem_n, dem_drive), (pre_n, pre_drive) = (self.staged_batch_seconds(inplace["dem_counts"]),
                                                      self.staged_batch_seconds(inplace["pre_counts"]))
            cold_read = (read_w * self.problem.rank_bytes).sum(axis=1)
        else:
            dem_drive, pre_drive = dem_n, pre_n
        dec_seconds, t = self._decode_walk(placement, dem_p, dem_n, fill, pre_p, pre_n, t_exp, host_dem, host_pre,
                                           t_peer, inplace)
        streamed = [u for u, res in zip(p.dense_units, placement.dense_resident) if not res]
        row = 2 * spec.hidden                                     # the token's embedding row from pinned RAM
        link_n = float(np.sum(dem_drive + pre_drive))            # the drive's busy time (the host's is not)
        warm, cold = float(x["warm_bytes"].sum()), float(x["cold_bytes"].sum())
        if inplace is None:
            wasted = float(np.sum(R * waste * (x["warm_bytes"] + x["cold_bytes"])))
        else:                               # the copies' bytes not read from VRAM, the stager's wrong guesses
            wrong = inplace["moved"] * inplace["copy_bytes"] - inplace["landed"] * inplace["share"]
            wasted = float(np.sum(wrong + R * waste * cold_read))
        if split:
            links, host = self._link_busy(placement, ug, dem_p + pre_p, row, x, R, waste, remote["p"])
            dec_seconds.update({f"pcie_link_gpu{g}": v for g, v in enumerate(links)}, host_link=host)
            link_p = max(max(links), host)
        else:                                   # in place: the reads (a late copy's part too), the copies moved
            moe_link = (self.ram_read_seconds(inplace["bytes"] + (1 - inplace["landed"]) * inplace["share"])
                        + inplace["moved"] * inplace["copy"])
            link_p = (float(np.sum(moe_link)) + sum(self.in_place_dense_seconds(u) for u in streamed)
                      + row / self.h2d(row))
        T = max(t, link_p, link_n)
        dec_seconds.update(pcie_link=link_p, nvme_link=link_n, token=T)
        if T > t:
            dec_binding = "pcie" if link_p >= link_n else "nvme"
        else:
            dec_binding = max(RESOURCES + (("peer",) if split else ()), key=lambda r: dec_seconds[r])

        ram = warm + sum(streamed) + row
        dense_res = sum(u for u, res in zip(p.dense_units, placement.dense_resident) if res)
        nvme_wasted = float(np.sum(R * waste * cold_read))     # the drive's wrong guesses (part of `wasted`)
        bpt = {"vram": float(k * tb["bytes"].sum()) - warm - cold + dense_res + float(self._layers["kv"].sum()),
               "ram": ram, "nvme": cold, "wasted": wasted, "pcie": ram + cold + wasted,
               # read from the drive: the misses (device loop: those not staged already) and the wrong guesses
               "nvme_read": float(np.sum(cold_read)) + nvme_wasted, "nvme_wasted": nvme_wasted}
        if inplace is not None:             # staged experts cross PCIe in place; the stager's wrong guesses do not
            bpt["pcie"] = ram + cold + float(np.sum(wrong))
        if split:
            bpt["peer"] = float(hops(ug) * row + 2 * row * remote["p"].sum())  # split points, remote experts
        s, m, _ = placement.arrays
        pre_tok_s, pre_binding, pre_seconds, bpc = self._prefill(placement, s, s + m)
        plain = lambda d: {key: float(v) for key, v in d.items()}  # noqa: E731
        return Prediction(float(1.0 / T), float(pre_tok_s), dec_binding, pre_binding, plain(dec_seconds),
                          plain(pre_seconds), plain(bpt), plain(bpc), float(np.mean(x["hit"])),
                          float(np.mean(x["ram_share"])), float(np.mean(x["nvme_share"])))

    def _remote(self, placement) -> dict:
        """[L] terms of the static experts a partner GPU holds (`Placement.remote`): `p` the chance a token routes
        to at least one of them (1 - (1 - q)^k, q their access share), `kern_local` the kernel seconds they take
        off the layer's own GPU, `t_hit` the seconds when hit: the hidden state to the partner, its kernel over
        them (their bytes per token / p), the partial output back. The layer then takes
        (1 - p) t_local + p max(t_local, t_hit); the excess over t_local is charged to `peer`."""
        p, k = self.problem, self.problem.spec.top_k
        pop = p.curves.pop
        L, E = pop.shape
        rem, v = placement.remote_counts, np.array(placement.vram, dtype=np.int64)
        mg = placement.moe_gpus(p.spec.moe_layers)
        ranks = np.arange(E)[None, :]
        mask = (ranks >= (v - rem)[:, None]) & (ranks < v[:, None])            # [L, E] remote static ranks
        q = (pop * mask).sum(axis=1)
        hit = np.where(rem > 0, 1.0 - (1.0 - np.minimum(q, 1.0)) ** k, 0.0)
        out = {"p": hit, "kern_local": np.zeros(L), "t_hit": np.zeros(L)}
        row = 2 * p.spec.hidden
        for j in np.flatnonzero(rem > 0):
            a = int(mg[j])
            b = placement.partner(a, p.n_gpus)
            ka, kb = self.gpu_model(a)._rank_times["kern"], self.gpu_model(b)._rank_times["kern"]
            out["kern_local"][j] = k * float(np.sum(pop[j] * mask[j] * ka))
            remote_kern = k * float(np.sum(pop[j] * mask[j] * kb))
            out["t_hit"][j] = (self.hop_seconds(row, a, b) + remote_kern / max(hit[j], 1e-300)
                               + self.hop_seconds(row, b, a))
        return out

    def _link_busy(self, placement, ug, moe_link, row, x, R, waste, remote_p) -> tuple[list[float], float]:
        """Several GPUs: each GPU's H2D link busy seconds a token (its MoE layers' fetches, its streamed dense
        units, the embedding row on the first GPU, the hidden state arriving through host memory where there is
        no peer link), and the host side's: every byte over PCIe a token, to all GPUs, over the profile's
        concurrent H2D (only when two or more GPUs hold layers)."""
        p = self.problem
        units, G = p.dense_units, p.n_gpus
        mg = ug[np.asarray(p.spec.moe_layers, dtype=np.int64)]
        links = [float(np.sum(np.where(mg == g, moe_link, 0.0))) for g in range(G)]
        total = float(np.sum((1 + R * waste) * (x["warm_bytes"] + x["cold_bytes"])))
        for i, (u, res) in enumerate(zip(units, placement.dense_resident)):
            if not res:
                links[ug[i]] += self.gpu_model(int(ug[i]))._stream_time(u)
                total += u
        links[ug[0]] += row / self.gpu_model(int(ug[0])).h2d(row)
        total += row
        if p.profile.peer.kind == "none":                  # the hidden state's H2D half at each split point
            for i in np.flatnonzero(np.diff(ug)):
                b = int(ug[i + 1])
                links[b] += row / plateau(p.profile.gpus[b].h2d_pinned)
                total += row
            for j in np.flatnonzero(remote_p > 0):         # ... and both ways to a remote experts' partner
                a = int(mg[j])
                for g in (a, placement.partner(a, G)):
                    links[g] += remote_p[j] * row / plateau(p.profile.gpus[g].h2d_pinned)
                    total += remote_p[j] * row
        used = set(int(g) for g in ug) | {placement.partner(int(mg[j]), G) for j in np.flatnonzero(remote_p > 0)}
        host = total / (p.profile.concurrent_h2d().value * 1e9) if len(used) > 1 else 0.0
        return links, host

    @staticmethod
    def _landed(inplace: dict, j: int, left: float) -> tuple[float, float]:
        """Layer j's lookahead copy as the layer runs with `left` seconds of it not moved: (moved, landed), the share
        of the copy's bytes that crossed the link and the share of its right guesses' bytes read from VRAM. The
        guesses are copied one after another, best first; one still copying is read in place in full (its copied
        part wasted, the rest skipped), except in a layer with a device LRU (`partial`), whose fill reads the part of
        it that landed from its slot and the rest from RAM (kernels.prefetch, partial landing): the bytes moved less
        those past the landed prefix (`RAGGED_BYTES`: the copy's programs take the chunks in turn)."""
        copy = inplace["copy"][j]
        if copy <= 0:
            return 0.0, 0.0
        moved = 1.0 - min(1.0, left / copy)
        if moved >= 1.0:
            return 1.0, 1.0
        if inplace["partial"][j]:
            total = inplace["copy_bytes"][j]
            return moved, max(0.0, moved * total - RAGGED_BYTES) / total
        b, total = inplace["expert"][j], inplace["copy_bytes"][j]
        whole = float(np.floor(moved * total / b) * b) if b > 0 else 0.0
        return moved, min(1.0, whole / total)

    def _decode_walk(self, placement, dem_p, dem_n, fill, pre_p, pre_n, t_exp, host_dem, host_pre,
                     t_peer=None, inplace=None) -> tuple[dict, float]:
        """One token through the decoder layers on a GPU clock; returns critical-path seconds per resource. With
        a pipeline split each layer runs at its GPU's rates, each GPU streams its own dense units over its own
        link (double buffered), and the hidden state crosses to the next GPU at each split point.
        host_dem [L]: the host issuing a MoE layer's demand fetches, until the last one's copy lands (the stall
        when the host is slower than the link); host_pre [L]: the host issuing the layer's prefetches (the
        engine gives hints on its main thread, at the round trip: serial with everything else it does).
        inplace (the device loop, `in_place`): per MoE layer the bytes its kernels read from pinned RAM ("bytes":
        RAM and staged experts less the lookahead's share), the lookahead's share ("share", read from VRAM slots
        when landed) and its copy's seconds ("copy", from when layer j-d ended). The layer has no round trip or
        host fetch: after waiting for its NVMe reads (the demand batch dem_n[j], and the stager's lookahead pre_n[j]
        from when layer j-d ended) it takes t_ram + t_exp, t_ram (charged to pcie) the in-place bytes (plus the
        late part of the share: never waited for) over R_zc, whether the device LRU copies them first or the
        kernel reads them in place."""
        spec, lay = self.problem.spec, self._layers
        ug = placement.unit_gpus()
        split = placement.several
        models = [self.gpu_model(int(g)) for g in ug]        # per dense unit
        if split:
            t_hbm = (lay["dense"] + lay["kv"]) / np.array([m.hbm_rate for m in models[:-1]])
            t_fl = lay["flops_dec"] / np.array([m.flop_rate for m in models[:-1]])
        else:
            t_hbm = (lay["dense"] + lay["kv"]) / self.hbm_rate
            t_fl = lay["flops_dec"] / self.flop_rate
        sec = dict.fromkeys(RESOURCES, 0.0)
        sec["round_trip"] = 0.0                            # of "overhead": the MoE layers' host round trips
        sec["host_fetch"] = 0.0                            # of "overhead": issuing fetches, beyond the links' time
        if split:
            sec["peer"] = 0.0
        if inplace is not None:
            sec["lookahead_gpu"] = 0.0                     # of "overhead": the lookahead's kernels on the main stream
            sec["residency_gpu"] = 0.0                     # ... and the device LRU's or the use count's
            copies = LinkCopies()                          # ... and its copies on the link
        depth = placement.prefetch_depth
        units = self.problem.dense_units
        t = 0.0
        link_free = [0.0] * self.problem.n_gpus
        finish: list[list[float]] = [[] for _ in range(self.problem.n_gpus)]   # per GPU, its decoder layers'
        moe_done: list[float] = []        # copy path, per MoE layer: when its output (the lookahead source) exists
        spans: dict[int, tuple[float, float]] = {}    # MoE layer -> its NVMe lookahead batch (submitted, landed)
        at_router = self.problem.lookahead_point == "attention"
        moe_index = {layer: j for j, layer in enumerate(spec.moe_layers)}
        hop = 2 * spec.hidden

        def cross(a: int, b: int) -> None:                 # a split point: the hidden state moves on
            nonlocal t
            h = self.hop_seconds(hop, a, b)
            sec["peer"] += h
            t += h

        def stream(g: int, i: int) -> None:                # double buffer: the slot frees when the GPU's
            nonlocal t                                     # unit two before ends
            done = finish[g]
            start = max(link_free[g], done[-2] if len(done) >= 2 else 0.0)
            link_free[g] = start + models[i]._stream_time(units[i])
            if link_free[g] > t:
                sec["pcie"] += link_free[g] - t
                t = link_free[g]

        for i in range(spec.n_layers):
            g = int(ug[i])
            if i and g != ug[i - 1]:
                cross(int(ug[i - 1]), g)
            hbm_i = t_hbm[i]
            if not placement.dense_resident[i] and inplace is not None:   # in place: read over PCIe as it runs
                pinned = copies.beside(t, self.in_place_dense_seconds(units[i]))
                sec["pcie"] += pinned
                t += pinned
                hbm_i = lay["kv"][i] / self.hbm_rate
            elif not placement.dense_resident[i]:
                stream(g, i)
            over = models[i].layer_overheads[i]
            sec["overhead"] += over
            sec["hbm" if hbm_i >= t_fl[i] else "compute"] += max(hbm_i, t_fl[i])
            t += over + max(hbm_i, t_fl[i])
            j = moe_index.get(i)
            if j is not None and inplace is not None:    # in place: RAM and VRAM experts read side by side
                t_fl_exp = 2.0 * spec.top_k * spec.expert_params / models[i].flop_rate
                wait, out = dem_n[j], None               # NVMe: the reads the router's ids ask for
                if depth and "pre_counts" in inplace:    # ... behind the lookahead's reads still on the drive
                    out = self._reads_in_flight(inplace["pre_counts"], spans, j, depth, t)
                    if out.any():
                        wait = float(self.staged_batch_seconds(inplace["dem_counts"][:, j:j + 1],
                                                               out[:, None])[0][0])
                if j in spans:                           # ... and the lookahead's for this layer
                    wait = max(wait, spans[j][1] - t)
                if depth and at_router and j + depth < len(pre_n):   # layer j+d's guesses, behind this request's
                    behind = pre_n[j + depth]            # demand reads and those still on the drive
                    if out is not None:
                        queue = inplace["dem_counts"][:, j] + out + inplace["pre_counts"][:, j + depth]
                        behind = float(self.staged_batch_seconds(queue[:, None])[0][0])
                    spans[j + depth] = (t, t + behind)
                if wait > 0:
                    sec["nvme"] += wait
                    t += wait
                sec["hbm" if t_exp[j] > t_fl_exp else "compute"] += t_exp[j]
                left = copies.take(t, j)                 # the lookahead's copy not landed: read in place
                moved, landed = self._landed(inplace, j, left)
                inplace["moved"][j], inplace["landed"][j] = moved, landed
                t += inplace["residency"][j]             # the cache step and the fill's launch (or the use count)
                nb = inplace["bytes"][j] + (1.0 - landed) * inplace["share"][j]
                t_ram = copies.beside(t, nb / self.zero_copy(nb)) if nb > 0 else 0.0    # beside queued copies
                sec["pcie"] += t_ram                     # the reads (or the LRU's fill), then the call's own time
                t += t_exp[j] + t_ram + inplace["lookahead"][j]   # the gates run after the layer, then issue copies
                sec["overhead"] += inplace["lookahead"][j] + inplace["residency"][j]
                sec["lookahead_gpu"] += inplace["lookahead"][j]
                sec["residency_gpu"] += inplace["residency"][j]
                if depth and not at_router and j + depth < len(pre_n):   # layer j+d's guesses, when this layer ends
                    spans[j + depth] = (t, t + pre_n[j + depth])
                if depth and j + depth < len(inplace["copy"]) and inplace["copy"][j + depth] > 0:
                    copies.add(t, j + depth, inplace["copy"][j + depth],      # layer j+d's guesses, side stream,
                               start=t + inplace["side_start"])              # after the kernels before the copy
            elif j is not None:
                t_fl_exp = 2.0 * spec.top_k * spec.expert_params / models[i].flop_rate
                sec["overhead"] += self.round_trip         # the router's ids reach the host: demand copies
                sec["round_trip"] += self.round_trip       # can only be issued after it
                t += self.round_trip
                stall = max(dem_p[j], dem_n[j]) + fill[j]
                sec["pcie" if dem_p[j] >= dem_n[j] else "nvme"] += max(dem_p[j], dem_n[j])
                sec["pcie"] += fill[j]
                # the host paces the copies when slower than the link; it gives the hints (issues the prefetches)
                # while the GPU runs this layer's attention and router, beyond which they delay it
                host = max(0.0, host_dem[j] - stall) + max(0.0, host_pre[j] - max(t_hbm[i], t_fl[i]))
                sec["overhead"] += host
                sec["host_fetch"] += host
                t += stall + host
                if depth and j >= depth:
                    pre, link = max(pre_p[j], pre_n[j]), "pcie" if pre_p[j] >= pre_n[j] else "nvme"
                    serial = (1.0 - self.prefetch_overlap) * pre     # the share the engine does not hide
                    sec[link] += serial
                    t += serial
                    # the hints' ids reach the host a round trip after their source
                    ready = moe_done[j - depth] + self.round_trip + pre
                    if ready > t:
                        sec[link] += ready - t
                        t = ready
                sec["hbm" if t_exp[j] > t_fl_exp else "compute"] += t_exp[j]
                t += t_exp[j]
                if t_peer is not None:                      # remote experts on the partner GPU (_remote)
                    sec["peer"] += t_peer[j]
                    t += t_peer[j]
                moe_done.append(t)
            finish[g].append(t)
        g, head = int(ug[-1]), models[-1]
        if g != ug[-2]:                                    # the head alone on the next GPU
            cross(int(ug[-2]), g)
        t_lm_hbm, t_lm_fl = units[-1] / head.hbm_rate, 2.0 * self.problem.head_params / head.flop_rate
        if not placement.dense_resident[-1] and inplace is not None:   # lm_head read in place
            pinned = copies.beside(t, self.in_place_dense_seconds(units[-1]))
            sec["pcie"] += pinned
            t += pinned
            t_lm_hbm = 0.0
        elif not placement.dense_resident[-1]:            # lm_head
            stream(g, len(units) - 1)
        sec["hbm" if t_lm_hbm >= t_lm_fl else "compute"] += max(t_lm_hbm, t_lm_fl)
        sec["overhead"] += head.head_overhead
        t += max(t_lm_hbm, t_lm_fl) + head.head_overhead
        if inplace is not None:                           # the token's end joins the copies' side stream
            end = copies.drained(t)
            sec["pcie"] += end - t
            t = end
        return sec, t

    def _prefill(self, placement, s: np.ndarray, b: np.ndarray) -> tuple[float, str, dict, dict]:
        p, tb, lay = self.problem, self._tables, self._layers
        spec, E, C = p.spec, p.curves.n_experts, p.prefill_chunk
        rows = np.arange(p.curves.n_layers)
        k = spec.top_k
        touched = tb["t_bytes"][:, E]
        warm = tb["t_bytes"][rows, b] - tb["t_bytes"][rows, s]
        cold = touched - tb["t_bytes"][rows, b]
        by_gpu = lambda m: {"pcie": m._tables["t_bg"][:, E] - m._tables["t_bg"][rows, s],   # noqa: E731
                            "expand": tb["t_count"][:, E] * spec.expert_params / m.expansion_rate}
        per = self._by_layer(placement, by_gpu) if placement.several else by_gpu(self)
        pcie, expand = per["pcie"], per["expand"]          # expand: [L] s, every touched expert once
        tn = self._nvme_table(self.prefill_in_flight(placement.prefetch_depth))
        nvme = tn[:, E] - tn[rows, b]
        sec = dict.fromkeys(RESOURCES, 0.0)
        ug = placement.unit_gpus()
        models = [self.gpu_model(int(g)) for g in ug]
        if placement.several:
            sec["peer"] = 0.0
        moe_index = {layer: j for j, layer in enumerate(spec.moe_layers)}
        rem = placement.remote_counts
        units = p.dense_units
        T = 0.0
        for i in range(spec.n_layers):
            j, m = moe_index.get(i), models[i]
            if i and ug[i] != ug[i - 1]:                   # a split point: the chunk's hidden states move on
                h = self.hop_seconds(C * 2 * spec.hidden, int(ug[i - 1]), int(ug[i]))
                sec["peer"] += h
                T += h
            w_bytes = lay["dense"][i] + (touched[j] if j is not None else 0.0)
            flops = C * (lay["flops_pre"][i] + (2 * k * spec.expert_params if j is not None else 0.0))
            parts = {"compute": max(flops / m.flop_rate, expand[j] if j is not None else 0.0),
                     "hbm": w_bytes / m.hbm_rate,
                     "pcie": (pcie[j] if j is not None else 0.0)
                     + (0.0 if placement.dense_resident[i] else m._stream_time(units[i])),
                     "nvme": nvme[j] if j is not None else 0.0}
            worst = max(parts, key=parts.get)
            sec[worst] += parts[worst]
            host = self.overhead + (self.round_trip if j is not None else 0.0)   # a MoE layer's fetches wait
            sec["overhead"] += host                                               # for its router's ids
            T += parts[worst] + host
            if j is not None and rem[j]:     # remote experts: the chunk's states to the partner and its output back
                a = int(ug[i])
                b = placement.partner(a, p.n_gpus)
                h = self.hop_seconds(C * 2 * spec.hidden, a, b) + self.hop_seconds(C * 2 * spec.hidden, b, a)
                sec["peer"] += h
                T += h
        head = models[-1]
        if ug[-1] != ug[-2]:                               # the head alone on the next GPU: one token's state
            h = self.hop_seconds(2 * spec.hidden, int(ug[-2]), int(ug[-1]))
            sec["peer"] += h
            T += h
        lm = max(units[-1] / head.hbm_rate, 2.0 * p.head_params / head.flop_rate,
                 0.0 if placement.dense_resident[-1] else head._stream_time(units[-1]))
        sec["pcie" if not placement.dense_resident[-1] else "hbm"] += lm
        T += lm
        sec["chunk"] = T
        streamed = sum(u for u, res in zip(units, placement.dense_resident) if not res)
        bpc = {"vram": float(np.sum(touched - warm - cold)), "ram": float(warm.sum()) + streamed,
               "nvme": float(cold.sum())}
        binding = max(RESOURCES + (("peer",) if placement.several else ()), key=lambda r: sec[r])
        return C / T, binding, sec, bpc
