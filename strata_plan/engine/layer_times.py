"""GPU time of a model's decoder layers at batch-1 decode, measured: the engine's own layers on random weights of
the model's geometry, each prefix of them replayed as one CUDA graph, as the device loop runs a token.

    t = measure_layer_times("kimi-k3.1-pro", context=1024)     # a LayerTime (profiles.schema), microseconds
    t.head_us, t.dense_layer_us, t.moe_layer_us

The model is cut after its second MoE layer (`core.spec.truncate_config`: its dense layers before it kept) and
built in VRAM from random BF16 tensors named and shaped as its checkpoints (`engine.synthetic.dense_tensor_specs`),
with no routed experts: the MoE call returns zeros, as `DeviceDecode.time_parts` leaves it out. Graph k runs the
token's embedding row, the first k decoder layers (attention over the whole static cache of `context` positions,
norms, router with its top-k, shared expert or dense MLP), the final norm, the lm_head and the argmax; each is
replayed `reps` times after a warm-up and timed with CUDA events, each replay after a write of twice the L2 cache
(outside the events): the whole model's step finds no layer's weights in L2 (the rest of the model evicted them),
while the cut's few layers stay there between back-to-back replays (bench-moe on the H100: a step of 726 us from the
warm cut, 837 us from the cold one, 835-853 us in the whole model's graph; benchmarks/tools/cut_probe.py). Layer i's
time is the median over the repeats of graph i + 1 less graph i, run back to back in each repeat (so clock drift
falls on both), and 0 where noise makes that median negative (the layer below what the clock resolves); `head_us` is
graph 0's median. These are what the cost model charges a decoder layer without its routed experts (`planner.cost`):
kernels as the engine launches them, each at its own rate, launch gaps inside a graph included; no constant fitted
to decode runs.
"""
from __future__ import annotations

import dataclasses
import datetime
import statistics
import time

import torch

from strata_plan.core.spec import load_spec, spec_from_config, truncate_config
from strata_plan.kernels.bench import l2_bytes
from strata_plan.profiles.schema import LayerTime, load_profile

from .config import ModelConfig
from .model import MoEModel
from .picks import GumbelPick
from .synthetic import config_of, dense_tensor_specs, random_dense


class _NoExperts:
    """The routed experts' call left out (zeros of the input's shape): the layers' own work is what is timed."""

    def __call__(self, moe_index, x, topk_ids, topk_weights):
        return torch.zeros_like(x)


class RandomSource:
    """name -> a random BF16 (router bias: float32) tensor of the geometry's checkpoint names, made on the device
    when asked (`engine.synthetic.random_dense`), in `engine.weights.TensorSource`'s interface."""

    def __init__(self, spec, device, seed: int = 0):
        self._specs = {n: (dt, sh) for n, dt, sh in dense_tensor_specs(spec)}
        self._gen = torch.Generator(device=device)
        self._gen.manual_seed(seed)
        self._device = device

    @property
    def names(self) -> set[str]:
        return set(self._specs)

    def __contains__(self, name: str) -> bool:
        return name in self._specs

    def get(self, name: str, device="cpu", dtype=None):
        dt, shape = self._specs[name]
        return random_dense(name, dt, shape, self._gen, self._device).to(device=device, dtype=dtype or dt)

    def first(self, names: list[str], device="cpu", dtype=None):
        return self.get(next((n for n in names if n in self._specs), names[0]), device, dtype)


def _graph(run):
    """`run` captured in a CUDA graph (after two warm-up calls on a side stream): its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                      # warm-up off the capture (allocator, autotuned kernels)
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    return g.replay


def _timed(run, device: str) -> float:
    """Microseconds of one call: CUDA events on a GPU, the wall clock on a CPU (tests)."""
    if device == "cpu":
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e6
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    run()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3


def _cut_config(spec) -> dict:
    return truncate_config(config_of(spec), min(2, spec.n_moe_layers), spec.source or spec.name)


@torch.inference_mode()
def _prefix_times(cfg, cut, context: int, reps: int, device: str, cold: bool = True,
                  pick=None) -> list[list[float]]:
    """Microseconds of each prefix step (embedding, the first k layers, head and argmax), k = 0..n_layers, in each of
    `reps` interleaved repeats: [k][repeat]; `cold`: the L2 written over before each replay (False: back to back,
    for benchmarks/tools/cut_probe.py's comparison). `pick` (a GumbelPick): one more step last, the head with the
    token drawn by it instead of the argmax."""
    m = MoEModel(cfg, RandomSource(cut, device), _NoExperts(), context, device)
    m.fused_router = m.rope.fused = device != "cpu"     # as Engine.open sets them where the kernels run
    tok = torch.zeros(1, dtype=torch.long, device=device)
    m.at.fill_(context - 1)                     # the static step's shapes do not depend on the position

    def prefix(k: int):
        def run():
            x = m.embed_tokens(tok)
            for layer in m.layers[:k]:
                x = m._layer(layer, x, 0, m.at)
            return m.logits(x[-1]).argmax()
        return run

    runs = [prefix(k) for k in range(cut.n_layers + 1)]
    if pick is not None:
        runs.append(lambda: pick(m.logits(m.embed_tokens(tok)[-1])))
    flush = None
    if device != "cpu":
        runs = [_graph(run) for run in runs]
        if cold:                                # before each timed replay, outside its events: the L2 cold
            flush = torch.empty(2 * l2_bytes(device), dtype=torch.uint8, device=device).zero_
    for run in runs:
        run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(reps):                       # interleaved: drift lands on every prefix alike
        for k, run in enumerate(runs):
            if flush is not None:
                flush()
            times[k].append(_timed(run, device))
    return times


def check_model(model: str) -> None:
    """Refuse in one line (UserError) a model whose layers cannot be timed: unknown, or a family the engine does not
    run or whose checkpoint tensors `engine.synthetic` does not name. Cheap: nothing is built."""
    spec = load_spec(model)
    cfg = _cut_config(spec)
    ModelConfig.from_dict(cfg, spec.source or f"{spec.name}/config.json")
    dense_tensor_specs(spec)


def measure_layer_times(model: str, context: int = 1024, reps: int = 30, device: str = "cuda") -> LayerTime:
    """The LayerTime of `model` (a shipped spec name or a config.json path, `NAME@Nmoe` too) on this GPU."""
    spec = load_spec(model)
    cfg_dict = _cut_config(spec)
    cut = spec_from_config(cfg_dict, spec.name, spec.source or spec.name)
    cfg = ModelConfig.from_dict(cfg_dict, spec.source or f"{spec.name}/config.json")
    times = _prefix_times(cfg, cut, context, reps, device, pick=GumbelPick(1.0, 0.95, 0))
    layer = [max(0.0, statistics.median(b - a for a, b in zip(times[i], times[i + 1])))     # paired, per repeat
             for i in range(cut.n_layers)]
    pick = max(0.0, statistics.median(b - a for a, b in zip(times[0], times[-1])))         # the draw over argmax
    dense = [t for t, kind in zip(layer, cut.layer_kinds) if kind == "dense"]
    moe = [t for t, kind in zip(layer, cut.layer_kinds) if kind == "moe"]
    name = "" if device == "cpu" else torch.cuda.get_device_name()
    if device != "cpu":
        torch.cuda.empty_cache()
    base = spec.name.split("@")[0]
    return LayerTime(
        geometry=spec.layer_geometry, model=base, context=context, head_us=round(statistics.median(times[0]), 2),
        dense_layer_us=round(statistics.mean(dense), 2) if dense else 0.0, moe_layer_us=round(statistics.mean(moe), 2),
        pick_us=round(pick, 2), provenance="measured",
        source=f"strata-plan profile: the engine's decoder layers of {base} cut after MoE layer "
               f"{cut.n_moe_layers}, random BF16 weights, routed experts left out, context {context}; the pick at "
               f"temperature 1, top-p 0.95 against the argmax; each prefix "
               + (f"one CUDA graph, median of {reps} interleaved replays (CUDA events), {name}" if device != "cpu" else
                  f"run eagerly, median of {reps} interleaved runs, wall clock on the CPU"),
        date=datetime.date.today().isoformat())


def with_layer_times(profile, times):
    """`profile` (a HardwareProfile, shipped name or YAML path) with `times` (LayerTime) in its first GPU's
    `layer_times`, each replacing an entry of the same geometry."""
    prof = load_profile(profile) if isinstance(profile, str) else profile
    g = prof.gpus[0]
    new = {t.geometry for t in times}
    kept = tuple(t for t in g.layer_times or () if t.geometry not in new)
    return dataclasses.replace(prof, gpus=(dataclasses.replace(g, layer_times=kept + tuple(times)), *prof.gpus[1:]))
