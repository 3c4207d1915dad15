"""The plan with nothing to plan: every routed expert of a packed folder static in VRAM, in the formats it
was packed in, every dense layer and the lm_head resident, no cache, no lookahead.

    plan = resident_plan(load_index(folder), context=512, prefill_chunk=512)
    with Engine.open(folder, plan, EngineOptions(device="cpu")) as eng: ...

What `strata-plan eval` runs when it is given no `--plan`: the engine computes exactly what it computes
under any other plan for the same folder (tiers change where experts are read from, never the logits;
tests/test_engine_run.py), so the fidelity of a packed folder does not depend on a placement. The predicted
section is zero (nothing was predicted) and the sources name the packed folder itself, so the plan passes
the engine's checks against the index (engine.packed.check_plan_matches) and nothing else.
"""
from __future__ import annotations

from strata_plan import __version__
from strata_plan.core.plan import (SCHEMA_NAME, SCHEMA_VERSION, Budgets, CachePlan, DensePlan, LayerPlan, Memory,
                                      Plan, Predicted, SearchInfo, SourceRef, Sources, StagingPlan)

from .config import ModelConfig
from .packed import PackIndex


def resident_plan(index: PackIndex, context: int, prefill_chunk: int) -> Plan:
    """An all-resident plan for the packed folder `index` was loaded from (its config.json gives the dense
    layers and top-k)."""
    cfg = ModelConfig.load(index.folder)
    formats = index.layer_formats()
    E = index.n_experts
    layers = []
    for layer in index.layers:
        by_format: dict[str, list[int]] = {}
        for e in range(E):
            by_format.setdefault(formats[layer][e], []).append(e)
        layers.append(LayerPlan(layer, vram=tuple(range(E)), formats={f: tuple(v) for f, v in by_format.items()}))
    slot = max(e.nbytes for e in index.entries)
    top_k = cfg.router.top_k
    none = SourceRef("none", "")
    sources = Sources(SourceRef(index.model, index.config_sha256, index.folder), none, none)
    memory = Memory({"static_experts": index.expert_bytes, "dense_resident": index.dense_nbytes}, {}, {},
                    Budgets(0, 0, 0, 0))
    return Plan(SCHEMA_NAME, SCHEMA_VERSION, index.model, E, top_k, context, prefill_chunk, 0, sources,
                DensePlan(tuple(range(cfg.n_layers)), (), "vram"), CachePlan("lru", slot, 0),
                StagingPlan(vram_slots=top_k, host_slots=0, slot_bytes=slot, dense_buffers=0, dense_buffer_bytes=0),
                tuple(layers), memory, Predicted("predicted", 0.0, 0.0), SearchInfo("decode", knobs={}),
                strata_plan_version=__version__)
