"""A model family and the registry of families by `model_type` (re-exported by `strata_plan.core.families`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from strata_plan.core.geometry import Cfg, Geometry
from strata_plan.errors import UserError

LLAMA_CPP_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class TensorNames:
    """Where a family's Hugging Face checkpoints keep a MoE layer's tensors, under `model.layers.L.`: the names
    the engine's loader (`engine.model`), packer (`engine.pack`) and synthetic writer (`engine.synthetic`) use.
    Spellings are tried in order; the synthetic writer writes the first."""

    experts: tuple[tuple[str, tuple[str, str, str]], ...]   # (prefix, (gate, up, down)): PREFIX.E.GATE.weight
    router: tuple[str, ...]            # the gate's prefix: PREFIX.weight (+ PREFIX.e_score_correction_bias)
    shared: str = ""                   # the shared expert(s) as one SwiGLU: SHARED.{gate,up,down}_proj.weight
    shared_gate: str = ""              # a sigmoid gate on the shared expert's output (Qwen2-MoE): SHARED_GATE.weight


@dataclass(frozen=True)
class Family:
    """One model architecture: its `model_type`s, how its geometry is read from config.json, its router and
    attention kinds, its llama.cpp tensor names, and whether the engine runs it (with the checkpoint names)."""

    name: str                          # the engine's family name (engine.config.ModelConfig.family)
    title: str                         # for messages: "DeepSeek-V3/Kimi-K2"
    model_types: tuple[str, ...]
    read: Callable[[Cfg], Geometry]    # config.json (with model_type) -> geometry; UserError on a bad field
    router: str                        # "sigmoid_grouped", "softmax_topk", "softmax_grouped", "sigmoid_topk",
                                       # "sparsemixer"
    attention: str                     # "mla" or "gqa" (what the reader's AttentionSpec.kind is)
    llama_cpp_arch: str                # general.architecture of its GGUF files
    llama_cpp_experts: tuple[str, ...] = LLAMA_CPP_EXPERTS   # merged routed-expert tensors: blk.N.NAME.weight
    runs: bool = False                 # the engine runs it (`strata-plan pack` / `run`)
    tensors: TensorNames | None = None   # checkpoint tensor names (every family the engine runs has them)
    text_config: bool = False          # a multimodal config: the decoder's fields under `text_config`
    layers_field: str = "num_hidden_layers"   # the decoder layer count's config field


FAMILIES: dict[str, Family] = {}       # name -> family, in registration order
_BY_TYPE: dict[str, Family] = {}       # model_type -> family


def register(family: Family) -> Family:
    """Add a family: every one of its model_types must be new (or already this family's)."""
    if family.runs and family.tensors is None:
        raise ValueError(f"family {family.name}: the engine runs it, so it names its checkpoint tensors")
    taken = [t for t in family.model_types if t in _BY_TYPE and _BY_TYPE[t].name != family.name]
    if taken or not family.model_types:
        raise ValueError(f"family {family.name}: model_types {taken or '()'} already registered or none given")
    unregister(family.name)
    FAMILIES[family.name] = family
    _BY_TYPE.update((t, family) for t in family.model_types)
    return family


def unregister(name: str) -> None:
    old = FAMILIES.pop(name, None)
    for t in old.model_types if old else ():
        _BY_TYPE.pop(t, None)


def family_of(model_type: str | None) -> Family | None:
    """The family a config's `model_type` belongs to, or None."""
    return _BY_TYPE.get(str(model_type)) if model_type is not None else None


def model_types() -> tuple[str, ...]:
    """Every model_type a family reads, in registration order."""
    return tuple(_BY_TYPE)


def require_runs(model_type: str, where: str) -> Family:
    """The family of a model_type the engine runs, else one line naming the families that run."""
    fam = family_of(model_type)
    if fam is not None and fam.runs:
        return fam
    running = [f for f in FAMILIES.values() if f.runs]
    what = f" ({fam.title}, read by the planner only)" if fam else ""
    raise UserError(where, "model_type", f"{model_type!r}{what}: the engine runs "
                    f"{', '.join(t for f in running for t in f.model_types)}",
                    f"use a {_or([f.title for f in running])} model (`strata-plan plan` reads every family)")


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
