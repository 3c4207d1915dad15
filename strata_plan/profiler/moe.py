"""The fused MoE call the engine makes (`strata_plan.kernels.ops.fused_moe`), timed on this GPU.

Decode: batch 1, one layer's top-k experts in the seed's tier mix (`formats.tier_mix().names(k)`), both
launches (gate/up, down), at a few expert shapes (DECODE_SHAPES). Enough layers with distinct experts
are captured in one CUDA graph that a replay reads more than 4x the L2 cache (weights never come from L2);
seconds a layer = the median replay / layers. Recorded as GB/s of the k experts' stored bytes
(`formats.expert_bytes`, what the planner counts): points [hidden, intermediate, top_k, layer_bytes, GB/s].

Prefill: a chunk of M tokens (PREFILL_TOKENS) through a whole layer of E experts in the tier mix (formats
interleaved over ids), top-k of random logits; eager calls timed with CUDA events (one call takes
milliseconds), median. Recorded as weights expanded a second: touched experts x 3 x hidden x intermediate
over the call's seconds: points [hidden, intermediate, top_k, n_experts, tokens, Gweights/s].

Random bytes stand in for quantized weights (the kernels' speed does not depend on the values); the fp16
scale segments hold ordinary small numbers. `measure` takes a `timer` so the CPU tests run it through the
kernels' plain-torch reference path with a host clock.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

DECODE_SHAPES = ((2048, 768), (4096, 1536), (7168, 2048), (7168, 3584))
"""(hidden, moe_intermediate): Qwen3-30B-A3B, a 4096-wide model, Kimi-K2 / DeepSeek-V3, kimi-k3.1-pro."""
TOP_K = 8
PREFILL_SHAPE = (7168, 3584)            # kimi-k3.1-pro, the seed model
PREFILL_TOKENS = (512, 2048)
GB = 1e9


@dataclass(frozen=True)
class MoESettings:
    decode_shapes: tuple[tuple[int, int], ...] = DECODE_SHAPES
    top_k: int = TOP_K
    prefill_shape: tuple[int, int] = PREFILL_SHAPE
    prefill_experts: int = 384
    prefill_tokens: tuple[int, ...] = PREFILL_TOKENS
    repeats: int = 10
    l2_bytes: int = 0                   # 0: read from the device


@dataclass(frozen=True)
class MoEResult:
    decode: tuple[tuple[int, int, int, int, float], ...]          # [hidden, intermediate, top_k, layer_bytes, GB/s]
    prefill: tuple[tuple[int, int, int, int, int, float], ...]    # [hidden, intermediate, top_k, E, tokens, Gweights/s]
    decode_us: dict                      # (hidden, intermediate) -> microseconds a layer
    prefill_ms: dict                     # tokens -> milliseconds a call


def random_arena(names: list[str], hidden: int, inter: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert blobs of `names` (each 4 KiB aligned, random codes, small fp16 scales) and their int64 offsets."""
    from strata_plan.kernels.formats import expert_layout
    lays = [expert_layout(f, hidden, inter) for f in names]
    offsets = [0]
    for lay in lays[:-1]:
        offsets.append(offsets[-1] + lay.nbytes)
    arena = torch.randint(0, 256, (offsets[-1] + lays[-1].nbytes,), dtype=torch.uint8, device=device)
    for lay, off in zip(lays, offsets):
        for s in lay.segments:
            if s.dtype != "uint8":
                vals = (torch.rand(s.nbytes // 2, device=device) * 0.01).to(getattr(torch, s.dtype))
                arena[off + s.offset: off + s.offset + s.nbytes] = vals.view(torch.uint8)
    return arena, torch.tensor(offsets, dtype=torch.int64, device=device)


def cuda_graph_seconds(fn: Callable[[], None], reps: int) -> float:
    """Median seconds of one replay of a CUDA graph holding fn (launch gaps removed), CUDA events."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()                                            # warm-up and compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    return cuda_event_seconds(g.replay, reps)


def cuda_event_seconds(fn: Callable[[], None], reps: int) -> float:
    """Median seconds of fn (which launches GPU work), CUDA events around each call, after a warm-up."""
    from strata_plan.kernels.bench import event_times
    return statistics.median(event_times(fn, reps, warmup=1)) / 1e3


def host_seconds(fn: Callable[[], None], reps: int) -> float:
    """Median host-clock seconds of fn (the CPU tests' timer)."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def decode_point(hidden: int, inter: int, top_k: int, device, l2_bytes: int, reps: int,
                 graph_timer: Callable) -> tuple[int, float, float]:
    """(layer bytes, GB/s, microseconds a layer) of the fused MoE decode call on a layer in the tier mix."""
    from strata_plan.kernels import ops
    from strata_plan.kernels.formats import expert_bytes, tier_mix
    per_layer = tier_mix().names(top_k)
    layer_bytes = sum(expert_bytes(f, hidden, inter) for f in per_layer)
    layers = max(2, math.ceil(4 * l2_bytes / layer_bytes))
    arena, offsets = random_arena(per_layer * layers, hidden, inter, device)
    fm = ops.ExpertFormats.from_names(per_layer * layers, device)
    ids = [torch.arange(l * top_k, (l + 1) * top_k, device=device, dtype=torch.int32)[None] for l in range(layers)]
    wts = torch.softmax(torch.randn(1, top_k, device=device), -1)
    x = torch.randn(1, hidden, dtype=torch.bfloat16, device=device)
    out = torch.empty(1, hidden, dtype=torch.bfloat16, device=device)

    def run() -> None:
        for i in ids:
            ops.fused_moe(x, i, wts, arena, offsets, fm, hidden, inter, out=out)
    sec = graph_timer(run, reps) / layers
    return layer_bytes, layer_bytes / sec / GB, sec * 1e6


def prefill_points(hidden: int, inter: int, top_k: int, n_experts: int, tokens: tuple[int, ...], device, reps: int,
                   timer: Callable) -> list[tuple[int, float, float]]:
    """(tokens, Gweights/s expanded, milliseconds) of the fused MoE prefill call on a whole layer."""
    from strata_plan.kernels import ops
    from strata_plan.kernels.formats import tier_mix
    gen = torch.Generator().manual_seed(0)
    names = tier_mix().names(n_experts)
    names = [names[i] for i in torch.randperm(n_experts, generator=gen).tolist()]   # formats interleaved over ids
    arena, offsets = random_arena(names, hidden, inter, device)
    fm = ops.ExpertFormats.from_names(names, device)
    out = []
    for m in tokens:
        top = torch.topk(torch.randn(m, n_experts, generator=gen).to(device), top_k, dim=-1)
        ids, wts = top.indices.to(torch.int32), torch.softmax(top.values, -1)
        x = torch.randn(m, hidden, dtype=torch.bfloat16, device=device)
        y = torch.empty(m, hidden, dtype=torch.bfloat16, device=device)
        sec = timer(lambda: ops.fused_moe(x, ids, wts, arena, offsets, fm, hidden, inter, out=y), reps)
        touched = int(torch.unique(ids).numel())
        out.append((m, touched * 3 * hidden * inter / sec / 1e9, sec * 1e3))
    del arena
    return out


def measure(s: MoESettings, device="cuda", graph_timer: Callable | None = None, timer: Callable | None = None,
            tick: Callable[[], None] | None = None) -> MoEResult:
    """Both figures on `device`; timers default to CUDA graphs / CUDA events (pass host_seconds on CPU)."""
    cuda = torch.device(device).type == "cuda"
    graph_timer = graph_timer or cuda_graph_seconds
    timer = timer or cuda_event_seconds
    from strata_plan.kernels.bench import l2_bytes
    l2 = s.l2_bytes or (l2_bytes(device) if cuda else 1)
    decode, us = [], {}
    for h, i in s.decode_shapes:
        b, gbps, t = decode_point(h, i, s.top_k, device, l2, s.repeats, graph_timer)
        decode.append((h, i, s.top_k, b, float(f"{gbps:.5g}")))
        us[(h, i)] = t
        if tick:
            tick()
    h, i = s.prefill_shape
    pre = prefill_points(h, i, s.top_k, s.prefill_experts, s.prefill_tokens, device, max(3, s.repeats // 2), timer)
    if tick:
        tick()
    return MoEResult(tuple(decode), tuple((h, i, s.top_k, s.prefill_experts, m, float(f"{g:.5g}")) for m, g, _ in pre),
                     us, {m: ms for m, _, ms in pre})
