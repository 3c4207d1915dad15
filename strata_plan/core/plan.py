"""The plan file: everything the engine needs to run a model on one machine, and what we predict it does.

A plan (schema `strata-plan/plan`, version 1) lists, per MoE layer, which expert ids live in VRAM, pinned
RAM and NVMe and which packed format each expert has; which dense units stay in VRAM; the LRU cache slots,
staging buffers, NVMe read shape, prefetch depth and prefill chunk; the predicted tok/s (labelled
predicted) with the physical bound and binding resource; bytes per token per tier; and the model, profile
and statistics it came from with their sha256. It is parsed as strictly as a hardware profile
(`strata_plan.schema.parse`) and written atomically. PLANNER.md documents every field.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from strata_plan.core.lookahead import MAX_DEPTH
from strata_plan.errors import UserError
from strata_plan.kernels.formats import FORMATS
from strata_plan.schema import bounded, check_schema, parse, to_data
from strata_plan.yamlio import atomic_write_yaml, read_yaml

LOOKAHEAD_POINTS = ("output", "attention")   # staging.lookahead_point (EngineOptions.lookahead_point)
SCHEMA_NAME = "strata-plan/plan"
SCHEMA_VERSION = 1
Resource = Literal["pcie", "nvme", "hbm", "compute", "overhead", "peer"]     # peer: a split plan's hidden-state hops
Link = Literal["pcie", "nvme", "hbm", "compute", "peer"]


@dataclass(frozen=True)
class SourceRef:
    """One input of the plan: its name, where it was read from, and a sha256 of its content."""

    name: str
    sha256: str
    path: str = ""
    kind: str = ""              # statistics: "trace" or "prior"


@dataclass(frozen=True)
class Sources:
    model: SourceRef            # sha256 of the model's config.json (ModelSpec.config_sha256)
    profile: SourceRef          # sha256 of the profile's canonical JSON (after --gpu-preset)
    statistics: SourceRef       # sha256 of the statistics' canonical JSON
    statistics_source_sha256: str = ""   # the trace or prior the statistics were computed from
    gpu_preset: str = ""


@dataclass(frozen=True)
class Budgets:
    vram_bytes: int = bounded(0, None)
    ram_bytes: int = bounded(0, None)
    nvme_bytes: int = bounded(0, None)
    vram_reserve_bytes: int = bounded(0, None)


@dataclass(frozen=True)
class LayerPlan:
    """One MoE layer. Expert ids are listed most used first; each id appears in exactly one tier and in
    exactly one format."""

    layer: int = bounded(0, None)           # decoder layer index (ModelSpec.moe_layers[i])
    vram: tuple[int, ...] = ()
    ram: tuple[int, ...] = ()
    nvme: tuple[int, ...] = ()
    cache_slots: int = bounded(0, None, default=0)
    formats: dict[str, tuple[int, ...]] | None = None
    remote: tuple[int, ...] | None = None     # several GPUs: the last ids of `vram`, held and run by `remote_gpu`
    remote_gpu: int | None = None

    def __post_init__(self) -> None:
        if self.remote is not None and (self.remote_gpu is None or not self.remote
                                        or tuple(self.vram[len(self.vram) - len(self.remote):]) != self.remote):
            raise ValueError(f"layer {self.layer}: remote must be the last (least used) ids of vram, with remote_gpu")
        ids = self.vram + self.ram + self.nvme
        E = len(ids)
        if sorted(ids) != list(range(E)):
            raise ValueError(f"layer {self.layer}: vram, ram and nvme must list every expert id 0..{E - 1} exactly once")
        fmt_ids = sorted(e for v in (self.formats or {}).values() for e in v)
        if fmt_ids != list(range(E)):
            raise ValueError(f"layer {self.layer}: formats must give every expert id 0..{E - 1} exactly one format")
        unknown = [f for f in (self.formats or {}) if f not in FORMATS]
        if unknown:
            raise ValueError(f"layer {self.layer}: unknown format {unknown[0]!r} (known: {', '.join(FORMATS)})")
        if self.cache_slots > E - len(self.vram):
            raise ValueError(f"layer {self.layer}: {self.cache_slots} cache slots for {E - len(self.vram)} non-static experts")

    @property
    def n_experts(self) -> int:
        return len(self.vram) + len(self.ram) + len(self.nvme)

    def format_of(self, expert: int) -> str:
        for f, ids in (self.formats or {}).items():
            if expert in ids:
                return f
        raise KeyError(expert)


@dataclass(frozen=True)
class DensePlan:
    resident_layers: tuple[int, ...]        # decoder layers whose non-routed weights stay in VRAM
    streamed_layers: tuple[int, ...]        # ... streamed from pinned RAM every token (double buffered)
    lm_head: Literal["vram", "ram"]
    embeddings: Literal["ram"] = "ram"      # one row per token is copied from pinned RAM

    def __post_init__(self) -> None:
        if set(self.resident_layers) & set(self.streamed_layers):
            raise ValueError("a dense layer is both resident and streamed")


@dataclass(frozen=True)
class GpuPlan:
    """One GPU of a plan over several GPUs (a pipeline split): the decoder layers [first_layer, end_layer) run
    on it with their dense weights, static experts, cache slots and KV cache; `lm_head` says whether the head
    runs here. `vram` is what the plan puts on it, by the parts of `memory.vram`."""

    index: int = bounded(0, 63)                    # CUDA device (cuda:N; llama.cpp's CUDAN)
    name: str
    first_layer: int = bounded(0, None)
    end_layer: int = bounded(0, None)
    lm_head: bool
    vram_budget_bytes: int = bounded(0, None)
    vram: dict[str, int] | None = None

    def __post_init__(self) -> None:
        if self.end_layer < self.first_layer:
            raise ValueError(f"GPU {self.index}: end_layer {self.end_layer} before first_layer {self.first_layer}")

    @property
    def holds_layers(self) -> bool:
        return self.end_layer > self.first_layer or self.lm_head


@dataclass(frozen=True)
class CachePlan:
    policy: Literal["lru"] = "lru"
    slot_bytes: int = bounded(1, None, default=1)    # a slot holds any expert: the largest format
    total_slots: int = bounded(0, None, default=0)


@dataclass(frozen=True)
class NvmeRead:
    """How the expert store reads one expert blob of this format: `split` O_DIRECT requests of
    ceil(bytes / split / 4 KiB) x 4 KiB each, all submitted at once; `queue_depth` = experts in flight x
    split, the requests outstanding when the phase's experts in flight are all of this format. PLANNER.md
    ("What the engine must do") says how the store must issue them for the predictions to hold."""

    split: int = bounded(1, 1024)
    queue_depth: int = bounded(1, 4096)
    batch_splits: tuple[int, ...] = ()      # split when i experts of this format are read together, i = 1, 2, ..

    def __post_init__(self) -> None:
        if any(not 1 <= s <= 1024 for s in self.batch_splits):
            raise ValueError("batch_splits must lie in 1..1024")


@dataclass(frozen=True)
class StagingPlan:
    vram_slots: int = bounded(0, None)       # landing slots for in-flight experts: lookahead.staging_slots
    host_slots: int = bounded(0, None)       # pinned RAM slots for NVMe reads: the staging cache (engine/staging.py)
    slot_bytes: int = bounded(1, None)
    dense_buffers: int = bounded(0, 2)       # VRAM buffers for streamed dense weights
    dense_buffer_bytes: int = bounded(0, None)
    nvme_reads: dict[str, NvmeRead] | None = None           # decode: a layer's misses together (top_k in flight)
    nvme_reads_prefill: dict[str, NvmeRead] | None = None   # prefill: every staging slot in flight
    nvme_in_flight: int = bounded(0, 4096, default=0)           # decode: experts read at once (0: a plan before
    nvme_in_flight_prefill: int = bounded(0, 4096, default=0)   # issue 26, which modelled one at decode)
    # with an NVMe tier and lookahead, where the guesses for layers j+1.. are taken: layer j's output (absent: when it
    # ends) or its router ("attention", submitted behind its demand reads); the engine's EngineOptions default
    lookahead_point: Literal["output", "attention"] | None = None

    @property
    def point(self) -> str:
        """Where the NVMe lookahead's guesses are taken: "output" (the layer's end) or "attention" (its router)."""
        return self.lookahead_point or "output"


@dataclass(frozen=True)
class Memory:
    """Bytes the plan puts in each tier (capacity.Footprint), and the budgets it was planned for."""

    vram: dict[str, int] = bounded(0, None)      # bytes per item: never negative
    ram: dict[str, int] = bounded(0, None)
    nvme: dict[str, int] = bounded(0, None)
    budgets: Budgets

    @property
    def vram_total(self) -> int:
        return sum(self.vram.values())

    @property
    def ram_total(self) -> int:
        return sum(self.ram.values())

    @property
    def nvme_total(self) -> int:
        return sum(self.nvme.values())


@dataclass(frozen=True)
class Predicted:
    """Predictions of the cost model (never measurements), with the independent physical bound."""

    label: Literal["predicted"]
    decode_tok_s: float = bounded(0.0, None)
    prefill_tok_s: float = bounded(0.0, None)
    decode_binding: Resource = "pcie"
    prefill_binding: Resource = "pcie"
    bound_decode_tok_s: float = bounded(0.0, None, default=0.0)
    bound_prefill_tok_s: float = bounded(0.0, None, default=0.0)
    bound_decode_binding: Link = "pcie"
    bound_prefill_binding: Link = "pcie"
    bytes_per_token: dict[str, float] | None = None    # decode, by source tier: vram, ram, nvme; wasted; pcie
    bytes_per_chunk: dict[str, float] | None = None    # prefill, by source tier
    seconds_per_token: dict[str, float] | None = None  # critical path per resource, link busy times
    vram_hit_rate: float = bounded(0.0, 1.0, default=0.0)
    ram_share: float = bounded(0.0, 1.0, default=0.0)
    nvme_share: float = bounded(0.0, 1.0, default=0.0)
    machine_decode_tok_s: float = bounded(0.0, None, default=0.0)     # the machine bound (bound.machine_bound);
    machine_prefill_tok_s: float = bounded(0.0, None, default=0.0)    # 0: a plan written before it was recorded
    machine_decode_binding: Literal["", "pcie", "nvme", "hbm", "compute", "peer"] = ""
    machine_prefill_binding: Literal["", "pcie", "nvme", "hbm", "compute", "peer"] = ""

    def __post_init__(self) -> None:
        if self.decode_tok_s > self.bound_decode_tok_s * (1 + 1e-9) or self.prefill_tok_s > self.bound_prefill_tok_s * (1 + 1e-9):
            raise ValueError("a prediction exceeds its physical bound")
        if self.machine_decode_tok_s and (self.bound_decode_tok_s > self.machine_decode_tok_s * (1 + 1e-9)
                                          or self.bound_prefill_tok_s > self.machine_prefill_tok_s * (1 + 1e-9)):
            raise ValueError("the plan's bound exceeds the machine bound")


@dataclass(frozen=True)
class SearchInfo:
    objective: Literal["decode", "prefill", "mix"]
    mix_weight: float = bounded(0.0, 1.0, default=0.5)
    sampler: str = "optuna TPE (multivariate)"
    trials: int = bounded(0, None, default=0)
    seed: int = 0
    knobs: dict[str, float] | None = None      # empty when the plan is a caller's starting placement
    greedy_decode_tok_s: float = bounded(0.0, None, default=0.0)
    greedy_prefill_tok_s: float = bounded(0.0, None, default=0.0)
    study: str = ""
    storage: str = ""


@dataclass(frozen=True)
class Plan:
    schema: str
    version: int
    model: str
    n_experts: int = bounded(1, None)
    top_k: int = bounded(1, None)
    context: int = bounded(1, None)
    prefill_chunk: int = bounded(1, None)
    prefetch_depth: int = bounded(0, MAX_DEPTH)
    sources: Sources | None = None
    dense: DensePlan | None = None
    cache: CachePlan | None = None
    staging: StagingPlan | None = None
    layers: tuple[LayerPlan, ...] = ()
    memory: Memory | None = None
    predicted: Predicted | None = None
    search: SearchInfo | None = None
    created: str = ""
    strata_plan_version: str = ""
    gpus: tuple[GpuPlan, ...] | None = None      # a plan over several GPUs: which holds what; absent for one GPU

    def __post_init__(self) -> None:
        check_schema(self, SCHEMA_NAME, SCHEMA_VERSION)
        for name in ("sources", "dense", "cache", "staging", "memory", "predicted", "search"):
            if getattr(self, name) is None:
                raise ValueError(f"missing section `{name}`")
        if not self.layers:
            raise ValueError("layers is empty (one entry per MoE layer)")
        if any(l.n_experts != self.n_experts for l in self.layers):
            raise ValueError(f"every layer must place all {self.n_experts} experts")
        idx = [l.layer for l in self.layers]
        if idx != sorted(set(idx)):
            raise ValueError("layers must be listed once each, in increasing layer order")
        if self.cache.total_slots != sum(l.cache_slots for l in self.layers):
            raise ValueError("cache.total_slots must equal the sum of the layers' cache_slots")
        if self.gpus is not None:
            n = len(self.dense.resident_layers) + len(self.dense.streamed_layers)
            g = self.gpus
            if len(g) < 2 or [x.index for x in g] != list(range(len(g))):
                raise ValueError("gpus lists two or more GPUs, indices 0, 1, ... in order (one GPU: no `gpus`)")
            if g[0].first_layer != 0 or g[-1].end_layer != n or any(a.end_layer != b.first_layer for a, b in zip(g, g[1:])):
                raise ValueError(f"gpus: the layer ranges must cover decoder layers 0..{n - 1} in order, each once")
            if sum(x.lm_head for x in g) != 1:
                raise ValueError("gpus: exactly one GPU holds the lm_head")

    @property
    def gpu_split(self) -> tuple[int, ...]:
        """The pipeline split (`Placement.gpu_split`): where each GPU after the first that holds anything begins."""
        if not self.gpus:
            return ()
        used = [x for x in self.gpus if x.holds_layers]
        return tuple(x.first_layer for x in used[1:])

    @property
    def n_gpus_used(self) -> int:
        """GPUs holding layers or remote experts."""
        if not self.gpus:
            return 1
        return len({x.index for x in self.gpus if x.holds_layers} | {l.remote_gpu for l in self.layers if l.remote})


# ------------------------------------------------------------------------------------------------
# Saving and loading
# ------------------------------------------------------------------------------------------------
def sha256_of(data) -> str:
    """sha256 of a YAML-able object's canonical JSON."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _with_paths(plan: Plan, change) -> Plan:
    """The plan with `change(path)` applied to the model and statistics paths it records."""
    src = plan.sources
    model, st = src.model, src.statistics
    return dataclasses.replace(plan, sources=dataclasses.replace(
        src, model=dataclasses.replace(model, path=change(model.path) if model.path else ""),
        statistics=dataclasses.replace(st, path=change(st.path) if st.path else "")))


def _relative_to(folder: Path):
    """A recorded path as the plan file stores it: relative to the plan's folder."""
    def change(p: str) -> str:
        if not os.path.isabs(p):
            return p
        return os.path.relpath(p, folder)
    return change


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write the plan atomically; the input paths it records are stored relative to the plan's folder, so the
    plan keeps working from any folder, and moves with its statistics."""
    header = (f"strata-plan plan ({SCHEMA_NAME} v{SCHEMA_VERSION}) for {plan.model}. Throughputs under `predicted`\n"
              f"are predictions of the cost model, not measurements. See planner/PLANNER.md for every field.")
    folder = Path(os.path.abspath(path)).parent
    return atomic_write_yaml(path, to_data(_with_paths(plan, _relative_to(folder))), header)


def load_plan(path: str | Path, spec=None) -> Plan:
    """Read a plan strictly; with `spec`, also check that it places that model's experts and layers."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise UserError(str(path), "", "is not a mapping of plan fields", "write it with `strata-plan plan --out`")
    if data.get("schema") != SCHEMA_NAME:
        raise UserError(str(path), "schema", f"got {data.get('schema')!r}",
                        f"a plan starts with `schema: {SCHEMA_NAME}` (make one with `strata-plan plan`)")
    plan = parse(Plan, data, str(path))
    folder = Path(os.path.abspath(path)).parent
    plan = _with_paths(plan, lambda p: os.path.normpath(os.path.join(folder, p)))   # absolute, as make_plan records
    if spec is not None:
        check_plan_model(plan, spec, str(path))
    return plan


def check_plan_model(plan: Plan, spec, where: str) -> None:
    """The plan places `spec`'s experts (count and top-k), its MoE layers and each of its decoder layers once."""
    if plan.n_experts != spec.n_routed:
        raise UserError(where, "n_experts", f"plan is for {plan.n_experts} experts top-{plan.top_k}, "
                        f"{spec.name} has {spec.n_routed} top-{spec.top_k}", f"plan again for {spec.name}")
    if plan.top_k != spec.top_k:
        raise UserError(where, "top_k", f"{plan.top_k}, {spec.name} routes each token to {spec.top_k} experts",
                        f"write `top_k: {spec.top_k}` back, or plan again for {spec.name}")
    if tuple(l.layer for l in plan.layers) != spec.moe_layers:
        raise UserError(where, "layers", f"plan places layers that are not {spec.name}'s MoE layers",
                        f"plan again for {spec.name}")
    dense = set(plan.dense.resident_layers) | set(plan.dense.streamed_layers)
    if dense != set(range(spec.n_layers)):
        raise UserError(where, "dense", f"must place each of {spec.name}'s {spec.n_layers} decoder layers once",
                        f"plan again for {spec.name}")
