"""A plan file (`core.plan.Plan`) from a search result: expert ids per tier from the statistics' ranking,
staging and NVMe read shapes from the cost model, the footprint, the predictions and the bounds."""
from __future__ import annotations

import datetime as _dt

from strata_plan import __version__
from strata_plan.core.lookahead import pinned_staging_slots, staging_slots
from strata_plan.core.plan import (SCHEMA_NAME, SCHEMA_VERSION, Budgets, CachePlan, DensePlan, GpuPlan, LayerPlan,
                                   Memory, NvmeRead, Plan, Predicted, SearchInfo, Sources, StagingPlan)
from strata_plan.planner.placement import Placement, staged


def build_plan(problem, result, bound, sources: Sources, cost, machine=None) -> Plan:
    """A Plan from a search result (`search.SearchResult`), its bound, the cost model used and the machine
    bound (`bound.machine_bound`, optional)."""
    spec, cur, best = problem.spec, problem.curves, result.best
    p, fp, pred = best.placement, best.footprint, best.prediction
    E = cur.n_experts
    mg = p.moe_gpus(spec.moe_layers)
    layers = []
    for j, layer in enumerate(spec.moe_layers):
        order = [int(e) for e in cur.order[j]]
        s, m = p.vram[j], p.ram[j]
        fmts: dict[str, list[int]] = {f: [] for f in problem.mix.formats}
        for e, f in zip(order, problem.rank_formats):
            fmts[f].append(e)
        r = int(p.remote_counts[j])
        remote = dict(remote=tuple(order[s - r:s]), remote_gpu=p.partner(int(mg[j]), problem.n_gpus)) if r else {}
        layers.append(LayerPlan(layer, tuple(order[:s]), tuple(order[s:s + m]), tuple(order[s + m:]), p.cache[j],
                                {f: tuple(v) for f, v in fmts.items() if v}, **remote))
    streamed = [i for i in range(spec.n_layers) if not p.dense_resident[i]]
    reads = lambda n: {f: NvmeRead(r.split, r.queue_depth, r.splits) for f, r in cost.nvme_reads(n).items()}  # noqa: E731
    slots = staging_slots(spec.top_k, p.prefetch_depth)
    host = 0                                   # several GPUs: bounce buffers; one GPU: the pinned staging cache
    if fp.host_staging:
        host = pinned_staging_slots(spec.top_k, p.prefetch_depth, p.staging) if staged(problem, p.gpu_split) else slots
    staging = StagingPlan(vram_slots=slots, host_slots=host, slot_bytes=problem.slot_bytes,
                          lookahead_point=None if problem.lookahead_point == "output" else problem.lookahead_point,
                          dense_buffers=2 if fp.dense_buffers else 0, dense_buffer_bytes=fp.dense_buffers // 2,
                          nvme_reads=reads(cost.decode_in_flight),
                          nvme_reads_prefill=reads(cost.prefill_in_flight(p.prefetch_depth)),
                          nvme_in_flight=cost.decode_in_flight,
                          nvme_in_flight_prefill=cost.prefill_in_flight(p.prefetch_depth))
    b = problem.budget
    memory = Memory(
        vram={"reserve": fp.reserve, "kv_cache": fp.kv_cache, "workspace": fp.workspace, "staging": fp.staging,
              "dense_buffers": fp.dense_buffers, "dense_resident": fp.dense_resident,
              "static_experts": fp.static_experts, "cache_slots": fp.cache_slots},
        ram={"embeddings": fp.embeddings, "dense_streamed": fp.dense_streamed, "ram_experts": fp.ram_experts,
             "host_staging": fp.host_staging},
        nvme={"nvme_experts": fp.nvme_experts}, budgets=Budgets(b.vram, b.ram, b.nvme, b.reserve))
    predicted = Predicted(
        "predicted", pred.decode_tok_s, pred.prefill_tok_s, pred.decode_binding, pred.prefill_binding,
        bound.decode_tok_s, bound.prefill_tok_s, bound.decode_binding, bound.prefill_binding,
        dict(pred.bytes_per_token), dict(pred.bytes_per_chunk),
        {k: float(v) for k, v in pred.decode_seconds.items()}, min(pred.hit_rate, 1.0),
        min(max(pred.ram_share, 0.0), 1.0), min(max(pred.nvme_share, 0.0), 1.0),
        *((machine.decode_tok_s, machine.prefill_tok_s, machine.decode_binding, machine.prefill_binding)
          if machine is not None else ()))
    search = SearchInfo(result.objective, result.mix_weight, trials=result.trials, seed=result.seed,
                        knobs=best.knobs.as_params() if best.knobs else {},
                        greedy_decode_tok_s=result.greedy.prediction.decode_tok_s,
                        greedy_prefill_tok_s=result.greedy.prediction.prefill_tok_s,
                        study=result.study_name, storage=result.storage)
    return Plan(SCHEMA_NAME, SCHEMA_VERSION, spec.name, E, spec.top_k, problem.context, problem.prefill_chunk,
                p.prefetch_depth, sources, DensePlan(tuple(i for i in range(spec.n_layers) if p.dense_resident[i]),
                                                     tuple(streamed), "vram" if p.dense_resident[-1] else "ram"),
                CachePlan("lru", problem.slot_bytes, sum(p.cache)), staging, tuple(layers), memory, predicted, search,
                _dt.date.today().isoformat(), __version__, gpu_plans(problem, p, fp))


def gpu_plans(problem, p: Placement, fp) -> tuple[GpuPlan, ...] | None:
    """The `gpus` section of a plan over several GPUs (None for one GPU): each GPU's decoder layers, head and
    VRAM parts; a GPU the split leaves empty gets an empty range at the end of the one before."""
    if problem.n_gpus == 1:
        return None
    ug = p.unit_gpus()
    L = problem.spec.n_layers
    out, start = [], 0
    for g, gpu in enumerate(problem.gpus):
        mine = [i for i in range(L) if ug[i] == g]
        end = mine[-1] + 1 if mine else start
        out.append(GpuPlan(g, gpu.name, start, end, bool(ug[-1] == g), problem.budget.gpus[g],
                           {k: int(v) for k, v in fp.per_gpu[g].items()}))
        start = end
    return tuple(out)
