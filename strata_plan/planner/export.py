"""Plan export for llama.cpp: the closest `-ot/--override-tensor` arguments, and what they cost.

llama.cpp keeps each MoE layer's routed experts as one merged tensor per projection
(`blk.N.ffn_{gate,up,down}_exps`) and places whole tensors: `-ot REGEX=BUFFER` sends every tensor whose
name matches to a buffer type (`CUDA0`, `CPU`). Experts held on the CPU are also computed there; the
NVMe tier exists only as the memory map of the GGUF file (the page cache keeps what fits in RAM).
So a plan, which places single experts in VRAM, pinned RAM or NVMe, exports layer by layer:

  * with every dense weight on the GPU (`-ngl 999`), whole MoE layers go to the GPU by a knapsack over
    layers: each layer's value is the routed-expert bytes per token it takes off the host (top-k x its
    popularity-weighted expert bytes, by the plan's statistics), its weight its experts' bytes (the same
    for every layer, as formats go by popularity rank), the capacity what the plan's VRAM budget leaves
    (the footprint the planner counts); the most valuable layers first, as many as fit, and of those
    prefixes the one whose own prediction scores best on the plan's objective;
  * CPU layers' experts are split between RAM and NVMe by popularity, as a page cache would keep them.

A plan over several GPUs keeps its pipeline split: `--tensor-split` gives each GPU its share of the decoder
layers (llama.cpp's default `--split-mode layer` places whole layers by those proportions), and each GPU's
chosen MoE layers go to its own buffer (`-ot ...=CUDA0`, `-ot ...=CUDA1`); the knapsack then fills each
GPU's VRAM budget with its own layers.

That layer-granular placement is predicted as llama.cpp runs it (`LlamaCppCost`) and reported beside the
plan's own per-expert prediction; the plan's own per-layer majority (more than half of a layer's experts static
in VRAM) only explains, in the notes, which layers moved. llama.cpp computes a CPU layer's experts on the CPU, in
series with the GPU (batch 1: each layer needs the last one's output), so decode a token takes

    T = T_gpu(every layer's experts in VRAM) - sum_cpu t_exp_j + sum_cpu (ram_j / RAM + nvme_j / NVMe + h)

with T_gpu and t_exp_j (the layer's fused expert call) from the cost model, ram_j / nvme_j the layer's routed
bytes a token held in RAM / left to the GGUF's memory map, and h the hand-off a CPU layer costs llama.cpp
beyond its bytes (the GPU's work synchronised, the hidden state copied both ways, the CPU thread pool's ops): a
measured latency (`--cpu-layer-us`, from `llama-bench -ncmoe N` against `-ncmoe 0`), else the estimate
`DEFAULT_CPU_LAYER_US`. Prefill is the cost model's for the placement (llama.cpp, too, copies CPU-held
experts to the GPU for batches of 32 tokens and more). Byte counts are those of strata-plan's packed formats,
not of a GGUF quantization.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

import numpy as np

from strata_plan.core.lookahead import staging_slots
from strata_plan.errors import UserError
from strata_plan.planner.bound import Throughput
from strata_plan.planner.placement import Placement, footprint
from strata_plan.profiles.schema import Figure
from strata_plan.units import fmt_bytes_pair

EXPERT_TENSORS = r"ffn_.*_exps\."
"""The part of the regex that picks a layer's merged routed-expert tensors (gate, up, down, or gate_up)
and none of its shared experts (`ffn_*_shexp`) or dense FFN tensors (`ffn_gate.weight`). Each model family states
its merged expert tensors (`llama_cpp_experts` in `core.families`); tests/test_families.py holds them to this."""
GPU_BUFFER = "CUDA0"
CPU_BUFFER = "CPU"
FORMATS = ("llama.cpp",)
DEFAULT_CPU_LAYER_US = Figure(193.0, "estimate", "H200, 16 threads, llama.cpp of llama-cpp-python 0.3.36, peer-moe "
                              "(benchmarks/peers/, 2026-12-05): 1/530 - 1/1076 s a token over the 5 MoE layers of "
                              "--n-cpu-moe 6, less their bytes at the RAM rate, plus their GPU expert call")
"""llama.cpp's time for one MoE layer whose experts run on the CPU, beyond reading their bytes (module docstring)."""


def majority_gpu(vram: int, n_experts: int) -> bool:
    """A layer goes to the GPU when more than half of its experts are static in VRAM in the plan."""
    return 2 * vram > n_experts


def measured_cpu_layer(us: float | None) -> Figure:
    """`--cpu-layer-us` as a measured `Figure` (today's date), or the estimate when it is not given."""
    if us is None:
        return DEFAULT_CPU_LAYER_US
    if not 0 <= us <= 1e6:
        raise UserError("--cpu-layer-us", str(us), "must lie in [0, 1e6] microseconds",
                        "pass the figure llama-bench gives, e.g. --cpu-layer-us 160")
    import datetime
    return Figure(float(us), "measured", "--cpu-layer-us", datetime.date.today().isoformat())


@dataclass(frozen=True)
class LayerChoice:
    """One MoE layer: the plan's expert counts per tier and where llama.cpp puts the merged tensors."""

    layer: int                 # decoder layer index = llama.cpp's blk.N
    vram: int                  # experts the plan keeps static in VRAM
    ram: int
    nvme: int
    cache_slots: int
    on_gpu: bool               # the export's choice
    gpu: int = 0               # the GPU holding the layer (a plan over several GPUs: its pipeline split)

    @property
    def n_experts(self) -> int:
        return self.vram + self.ram + self.nvme

    @property
    def majority_gpu(self) -> bool:
        return majority_gpu(self.vram, self.n_experts)

    @property
    def demoted(self) -> bool:
        """The majority said GPU, but the VRAM budget did not allow it."""
        return self.majority_gpu and not self.on_gpu

    @property
    def moved(self) -> int:
        """Experts whose tier differs from the plan's: VRAM <-> off-VRAM."""
        return self.ram + self.nvme if self.on_gpu else self.vram


@dataclass(frozen=True)
class LlamaCppExport:
    model: str
    plan: str                          # the plan file exported
    gpu_buffer: str
    context: int
    layers: tuple[LayerChoice, ...]
    vram_needed: int                   # bytes the layer-granular placement puts in VRAM (planner's footprint)
    vram_budget: int
    ram_experts: int                   # bytes of CPU-layer experts the page cache can keep in RAM ...
    nvme_experts: int                  # ... and the rest, read from the GGUF file on NVMe when used
    plan_predicted: Throughput         # the plan as planned (per expert, with cache and prefetch)
    predicted: Throughput              # the layer-granular placement as llama.cpp runs it (`LlamaCppCost`)
    cpu_bound_decode_tok_s: float | None   # llama.cpp computes CPU experts: host RAM bandwidth bounds decode
    streamed_dense_bytes: int          # dense weights the plan streams from RAM; -ngl 999 keeps them in VRAM
    notes: tuple[str, ...]             # what per-expert detail the export loses, and why
    tensor_split: tuple[int, ...] = ()     # several GPUs: decoder layers on each (llama.cpp --tensor-split)
    cpu_layer: Figure = DEFAULT_CPU_LAYER_US   # llama.cpp's hand-off a CPU layer, in `predicted`

    def buffer(self, g: int) -> str:
        """GPU g's buffer type: `gpu_buffer` with its device number replaced (CUDA0 -> CUDA1)."""
        return self.gpu_buffer if not self.tensor_split else self.gpu_buffer.rstrip("0123456789") + str(g)

    @property
    def gpu_layers(self) -> tuple[int, ...]:
        return tuple(c.layer for c in self.layers if c.on_gpu)

    @property
    def cpu_layers(self) -> tuple[int, ...]:
        return tuple(c.layer for c in self.layers if not c.on_gpu)

    @property
    def fits_vram(self) -> bool:
        return self.vram_needed <= self.vram_budget

    @property
    def override_args(self) -> tuple[str, ...]:
        """`-ot REGEX=BUFFER` pairs naming every MoE layer exactly once (GPU layers first)."""
        out: list[str] = []
        groups = [(tuple(c.layer for c in self.layers if c.on_gpu and c.gpu == g), self.buffer(g))
                  for g in range(max(1, len(self.tensor_split)))]
        for layers, buffer in (*groups, (self.cpu_layers, CPU_BUFFER)):
            if layers:
                out += ["-ot", f"{layer_regex(layers)}={buffer}"]
        return tuple(out)

    def command(self, gguf: str = "MODEL.gguf", binary: str = "llama-server") -> list[str]:
        return [*self._base(gguf, binary), *self.override_args]

    def _base(self, gguf: str, binary: str) -> list[str]:
        split = ["--tensor-split", ",".join(str(n) for n in self.tensor_split)] if self.tensor_split else []
        return [binary, "-m", gguf, "-ngl", "999", "-c", str(self.context), *split]

    def shell(self, gguf: str = "MODEL.gguf", binary: str = "llama-server") -> str:
        """The command as a shell script with the export's explanation as comments."""
        head = shlex.join(self._base(gguf, binary))
        ot = self.override_args
        pairs = [f"{ot[i]} {shlex.quote(ot[i + 1])}" for i in range(0, len(ot), 2)]
        lines = [f"# llama.cpp placement for {self.model}, exported by strata-plan from {self.plan}",
                 *(f"# {line}" for line in self.summary_lines()), head + "".join(f" \\\n  {p}" for p in pairs)]
        return "\n".join(lines) + "\n"

    def summary_lines(self) -> list[str]:
        pp, p = self.plan_predicted, self.predicted
        need, budget = fmt_bytes_pair(self.vram_needed, self.vram_budget)
        gpus = (f"the GPUs ({', '.join(f'{self.buffer(g)}: {n} decoder layers' for g, n in enumerate(self.tensor_split))}"
                f", --tensor-split)" if self.tensor_split else f"the GPU ({self.gpu_buffer})")
        lines = [f"MoE layers: {len(self.gpu_layers)} with experts on {gpus}, "
                 f"{len(self.cpu_layers)} on the CPU, chosen for this placement's own best predicted score "
                 f"under the VRAM budget; every dense weight on the GPU (-ngl 999).",
                 f"VRAM: {need} needed of the plan's {budget} budget"
                 + ("" if self.fits_vram else " (DOES NOT FIT: even with every expert on the CPU)") + ".",
                 f"CPU-layer experts: {self.ram_experts / 1e9:.2f} GB kept in RAM by the page cache, "
                 f"{self.nvme_experts / 1e9:.2f} GB read from the GGUF on NVMe when used.",
                 f"Predicted (cost model), the plan as planned: decode {_tok(pp.decode_tok_s)} tok/s "
                 f"({pp.decode_binding}), prefill {_tok(pp.prefill_tok_s)} tok/s ({pp.prefill_binding}).",
                 f"Predicted, llama.cpp running this layer-granular placement{'' if self.fits_vram else ' (over budget)'}: "
                 f"decode {_tok(p.decode_tok_s)} tok/s "
                 f"({p.decode_binding}), prefill {_tok(p.prefill_tok_s)} tok/s ({p.prefill_binding}); physical bound "
                 f"{_tok(p.bound_decode_tok_s)} / {_tok(p.bound_prefill_tok_s)} tok/s."]
        if self.cpu_bound_decode_tok_s is not None:
            h = self.cpu_layer
            lines.append(f"Decode computes the CPU layers' experts on the CPU, each layer {h.value:.0f} us of hand-off "
                         f"beyond its bytes ({h.provenance}: {h.source}); reading them from host RAM alone bounds "
                         f"decode at {_tok(self.cpu_bound_decode_tok_s)} tok/s (bound, not a prediction).")
        return lines + [f"Lost: {n}" for n in self.notes]

    def as_data(self, gguf: str = "MODEL.gguf") -> dict:
        import dataclasses
        return {"format": "llama.cpp", "model": self.model, "plan": self.plan, "gpu_buffer": self.gpu_buffer,
                **({"tensor_split": list(self.tensor_split)} if self.tensor_split else {}),
                "override_args": list(self.override_args), "command": self.command(gguf),
                "gpu_layers": list(self.gpu_layers), "cpu_layers": list(self.cpu_layers),
                "demoted_layers": [c.layer for c in self.layers if c.demoted],
                "vram_needed_bytes": self.vram_needed, "vram_budget_bytes": self.vram_budget,
                "fits_vram": self.fits_vram, "ram_experts_bytes": self.ram_experts,
                "nvme_experts_bytes": self.nvme_experts, "label": "predicted",
                "plan_predicted": dataclasses.asdict(self.plan_predicted),
                "predicted": dataclasses.asdict(self.predicted),
                "cpu_bound_decode_tok_s": self.cpu_bound_decode_tok_s, "cpu_layer_us": dataclasses.asdict(self.cpu_layer),
                "notes": list(self.notes),
                "layers": [dataclasses.asdict(c) for c in self.layers]}


def _tok(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def layer_regex(layers) -> str:
    """`blk\\.(3|4|17)\\.ffn_.*_exps\\.`: matches the merged expert tensors of exactly these layers."""
    return rf"blk\.({'|'.join(str(i) for i in sorted(layers))})\.{EXPERT_TENSORS}"


# ------------------------------------------------------------------------------------------------
# Layer-granular placement
# ------------------------------------------------------------------------------------------------
def _page_cache(problem, on_gpu: np.ndarray, ram_bytes: float) -> np.ndarray:
    """[L] experts of each CPU layer the page cache keeps in RAM: the most used first across CPU layers (ranks
    of a layer stay a prefix), as long as their bytes fit in `ram_bytes`."""
    pop, rb = problem.curves.pop, problem.rank_bytes
    L, E = pop.shape
    layer, rank = np.nonzero(~on_gpu[:, None] & np.ones((L, E), dtype=bool))
    order = np.lexsort((rank, layer, -pop[layer, rank]))
    n = int(np.searchsorted(np.cumsum(rb[rank[order]]), max(ram_bytes, 0.0), side="right"))
    return np.bincount(layer[order[:n]], minlength=L)


def layer_placement(problem, on_gpu, gpu_split: tuple[int, ...] = ()) -> Placement:
    """Whole layers of experts on the GPU or the CPU, every dense unit resident, no cache, no prefetch;
    CPU layers' experts split between RAM and NVMe by `_page_cache` within the RAM budget; `gpu_split`:
    the plan's pipeline split over several GPUs."""
    spec, budget = problem.spec, problem.budget
    gpu = np.asarray(on_gpu, dtype=bool)
    L, E = problem.curves.pop.shape
    room = budget.ram - spec.embedding_bytes
    ram = _page_cache(problem, gpu, room)
    if int(ram.sum()) < int((~gpu).sum()) * E:          # experts left on NVMe: bounce buffers take RAM too
        ram = _page_cache(problem, gpu, room - staging_slots(spec.top_k, 0) * problem.slot_bytes)
    vram = np.where(gpu, E, 0)
    return Placement(tuple(int(v) for v in vram), tuple(int(r) for r in ram), (0,) * L,
                     (True,) * (spec.n_layers + 1), 0, gpu_split)


def layer_values(problem) -> np.ndarray:
    """[L] routed-expert bytes per token a layer's experts cost when they are not in VRAM: top-k x the
    popularity-weighted bytes of its experts (the plan's statistics)."""
    pop, rb = problem.curves.pop, problem.rank_bytes
    return problem.spec.top_k * (pop * rb).sum(axis=1)


class LlamaCppCost:
    """llama.cpp's decode of whole layers of experts on the GPU or the CPU (the module docstring's T), with the
    cost model's prefill of the same placement, and the bound of that placement run llama.cpp's way."""

    def __init__(self, problem, cost=None, cpu_layer: Figure = DEFAULT_CPU_LAYER_US, gpu_split: tuple[int, ...] = ()):
        from strata_plan.planner.cost import CostModel
        self.problem, self.cpu_layer, self.gpu_split = problem, cpu_layer, gpu_split
        self.cost = cost or CostModel(problem)
        L = problem.curves.pop.shape[0]
        self.all_gpu = layer_placement(problem, [True] * L, gpu_split)
        self.gpu_pred = self.cost.predict(self.all_gpu)
        self.t_exp = self.cost.expert_call_seconds                 # [L] the fused expert call on the GPU
        self.ram_rate = problem.profile.host.ram_gbps.value * 1e9
        self.nvme_rate = self.cost.nvme(float(problem.rank_bytes.mean()), 1)   # the memory map's page faults, in turn

    def cpu_bytes(self, placement) -> tuple[np.ndarray, np.ndarray]:
        """[L] routed bytes a token each layer's CPU-held experts read from RAM and from the GGUF on NVMe (the page
        cache keeps `placement.ram` of its most used ranks; no cache); zero for GPU layers."""
        return self.cost.miss_bytes(placement)

    def predict(self, on_gpu, placement=None):
        """(placement, the cost model's `Prediction` with decode replaced by llama.cpp's T); `placement`: on_gpu's
        `layer_placement` when the caller has it already."""
        import dataclasses
        gpu = np.asarray(on_gpu, dtype=bool)
        p = layer_placement(self.problem, gpu, self.gpu_split) if placement is None else placement
        pred = self.cost.predict(p)
        ram, nvme = self.cpu_bytes(p)
        cpu = ~gpu
        t_read = float((ram[cpu] / self.ram_rate + nvme[cpu] / self.nvme_rate).sum())
        t_hand = int(cpu.sum()) * self.cpu_layer.value * 1e-6
        t_gpu = 1.0 / self.gpu_pred.decode_tok_s - float(self.t_exp[cpu].sum())
        T = t_gpu + t_read + t_hand
        row = 2 * self.problem.spec.hidden
        bpt = dict(self.gpu_pred.bytes_per_token, ram=float(ram.sum()), nvme=float(nvme.sum()), wasted=0.0,
                   pcie=float(2 * row * cpu.sum() + row))
        bpt["vram"] -= bpt["ram"] + bpt["nvme"]
        seconds = dict(self.gpu_pred.decode_seconds, cpu_experts=t_read, cpu_handoff=t_hand, gpu=t_gpu, token=T)
        binding = "cpu" if t_read + t_hand > t_gpu else self.gpu_pred.decode_binding
        return p, dataclasses.replace(pred, decode_tok_s=1.0 / T, decode_binding=binding, decode_seconds=seconds,
                                      bytes_per_token=bpt)

    def bound(self, placement, on_gpu):
        """The placement's `Bound` with decode run llama.cpp's way: the GPU's links without the CPU layers' expert
        bytes, then those bytes at the RAM peak, in series (bound.cpu_layers_bound)."""
        from strata_plan.planner.bound import cpu_layers_bound
        return cpu_layers_bound(self.problem, self.all_gpu, placement, on_gpu)


def choose_layers(plan, problem, model: LlamaCppCost | None = None) -> tuple[tuple[bool, ...], Placement, object]:
    """The knapsack over layers of the module docstring: layers ordered by value per byte (the plan's VRAM
    experts, then the layer index, break ties), each prefix that fits the VRAM budget predicted, the best by
    the plan's objective kept (`LlamaCppCost`: llama.cpp's decode). Every layer weighs the same (`problem.rank_bytes` is shared), so taking
    layers in value order is the knapsack's exact answer for each count of layers. Returns (on_gpu,
    placement, prediction); with no prefix fitting (the dense weights alone exceed the budget), every
    layer on the CPU."""
    from strata_plan.planner.search import score
    model = model or LlamaCppCost(problem, gpu_split=plan.gpu_split)
    L = len(plan.layers)
    value = layer_values(problem) / float(problem.rank_bytes.sum())
    order = sorted(range(L), key=lambda j: (-value[j], -len(plan.layers[j].vram), j))
    objective, weight = plan.search.objective, plan.search.mix_weight
    split = plan.gpu_split
    best = None
    gpu = [False] * L
    for k in range(L + 1):
        if k:
            gpu[order[k - 1]] = True
        p = layer_placement(problem, gpu, split)
        if footprint(problem, p).overflow(problem.budget)[0] > 0:
            if not split:
                break                                # equal weights: no longer prefix fits either
            gpu[order[k - 1]] = False                # several GPUs: this layer's GPU is full, another may not be
            continue
        _, pred = model.predict(gpu, p)
        s = score(pred, objective, weight)
        if best is None or s > best[0]:
            best = (s, tuple(gpu), p, pred)
    if best is None:
        p, pred = model.predict([False] * L)
        return (False,) * L, p, pred
    return best[1], best[2], best[3]


def cpu_expert_bound(problem, on_gpu) -> float | None:
    """Decode tok/s bound when llama.cpp computes CPU layers' experts on the CPU: their routed bytes per token
    (top-k x popularity-weighted expert bytes) read at the profile's host RAM bandwidth."""
    gpu = np.asarray(on_gpu, dtype=bool)
    if gpu.all():
        return None
    return problem.profile.host.ram_gbps.value * 1e9 / float(layer_values(problem)[~gpu].sum())


def _notes(plan, layers: tuple[LayerChoice, ...], problem, streamed: int, fits: bool) -> tuple[str, ...]:
    E = plan.n_experts
    moved = sum(c.moved for c in layers)
    out = [f"{moved} of {E * len(layers)} experts change tier: llama.cpp places a layer's {E} experts as one "
           f"merged tensor per projection, so a layer's experts all go to the GPU or all to the CPU."]
    demoted = [c.layer for c in layers if c.demoted]
    if demoted:
        out.append(f"layers {', '.join(map(str, demoted))} have most experts in VRAM in the plan but go to the CPU "
                   f"here: more whole layers on the GPU (with every dense weight, -ngl 999) would exceed the "
                   f"{problem.budget.vram / 1e9:.2f} GB VRAM budget, or predict no faster.")
    promoted = [c.layer for c in layers if c.on_gpu and not c.majority_gpu]
    if promoted:
        out.append(f"layers {', '.join(map(str, promoted))} have most experts off VRAM in the plan (its cache and "
                   f"prefetch serve them) but go to the GPU here, where the budget has room for them whole.")
    remote = [l.layer for l in plan.layers if l.remote]
    if remote:
        out.append(f"layers {', '.join(map(str, remote))} keep some experts on a second GPU (remote experts): "
                   f"llama.cpp places a layer's merged expert tensors on one device, so they stay with the layer.")
    slots = sum(c.cache_slots for c in layers)
    if slots:
        out.append(f"the plan's LRU expert cache ({slots} slots in all): llama.cpp has no dynamic expert cache.")
    if plan.prefetch_depth:
        out.append(f"router lookahead prefetch (depth {plan.prefetch_depth}): llama.cpp does not prefetch experts.")
    if any(c.nvme for c in layers) or any(c.ram for c in layers):
        out.append("the pinned-RAM / NVMe split: CPU layers' experts are memory-mapped from the GGUF file and the "
                   "page cache decides what stays in RAM (keep mmap on: no --no-mmap or --mlock).")
    if len(plan.layers[0].formats or {}) > 1:
        out.append(f"per-expert formats ({', '.join(plan.layers[0].formats)}): one merged tensor has one "
                   f"quantization type in a GGUF, and its bytes differ from strata-plan's packed formats.")
    if streamed:
        out.append(f"the plan streams {streamed / 1e9:.2f} GB of dense weights from RAM; -ngl 999 keeps them all in "
                   f"VRAM (llama.cpp does not stream weights), which the VRAM figure above includes.")
    if not fits:
        out.append("the dense weights, KV cache and buffers alone exceed the VRAM budget: lower -ngl or -c "
                   "(llama.cpp then runs whole layers on the CPU, which this export does not model).")
    return tuple(out)


def export_llama_cpp(plan, problem, plan_path: str = "plan.yaml", gpu_buffer: str = GPU_BUFFER,
                     cpu_layer: Figure = DEFAULT_CPU_LAYER_US) -> LlamaCppExport:
    """The layer-granular llama.cpp placement closest to `plan` (see the module docstring); `cpu_layer`: llama.cpp's
    hand-off a CPU layer (a measured `Figure`, or the estimate)."""
    if not gpu_buffer or "=" in gpu_buffer or " " in gpu_buffer:
        raise UserError("--gpu-buffer", gpu_buffer, "is not a llama.cpp buffer type name",
                        "pass e.g. CUDA0, Vulkan0 or Metal")
    model = LlamaCppCost(problem, cpu_layer=cpu_layer, gpu_split=plan.gpu_split)
    on_gpu, p, pred = choose_layers(plan, problem, model)
    fp = footprint(problem, p)
    predicted = Throughput.of(pred, model.bound(p, on_gpu))
    pr = plan.predicted
    planned = Throughput(pr.decode_tok_s, pr.prefill_tok_s, pr.decode_binding, pr.prefill_binding,
                         pr.bound_decode_tok_s, pr.bound_prefill_tok_s)
    mg = p.moe_gpus(problem.spec.moe_layers)
    layers = tuple(LayerChoice(l.layer, len(l.vram), len(l.ram), len(l.nvme), l.cache_slots, g, int(d))
                   for l, g, d in zip(plan.layers, on_gpu, mg))
    streamed = sum(problem.dense_units[i] for i in plan.dense.streamed_layers) + (
        problem.dense_units[-1] if plan.dense.lm_head == "ram" else 0)
    fits = fp.overflow(problem.budget)[0] <= 0
    ug = p.unit_gpus()[:-1]
    tensor_split = tuple(int((ug == g).sum()) for g in range(problem.n_gpus)) if problem.n_gpus > 1 else ()
    return LlamaCppExport(plan.model, plan_path, gpu_buffer, plan.context, layers, fp.vram, problem.budget.vram,
                          fp.ram_experts, fp.nvme_experts, planned, predicted, cpu_expert_bound(problem, on_gpu),
                          streamed, _notes(plan, layers, problem, streamed, fits), tensor_split, cpu_layer)


def export_text(plan, problem, plan_path: str, gguf: str = "MODEL.gguf", gpu_buffer: str = GPU_BUFFER,
                as_json: bool = False, cpu_layer: Figure = DEFAULT_CPU_LAYER_US) -> str:
    """What `strata-plan export` prints and writes, and the wizard's Save step writes: the shell script, or
    its JSON."""
    ex = export_llama_cpp(plan, problem, plan_path, gpu_buffer, cpu_layer)
    if as_json:
        import json
        return json.dumps(ex.as_data(gguf), indent=2) + "\n"
    return ex.shell(gguf)
