"""A planning problem: one model, one machine, one routing distribution, budgets, context and chunk.

Checks that the pieces agree (the statistics describe this model's MoE layers and experts) and derives the
per-rank byte sizes once: experts take their format from the tier mix by popularity rank, most used in the
best format, so rank r of every layer has the same format and size.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from strata_plan.errors import UserError
from strata_plan.kernels.formats import TierMix, tier_mix
from strata_plan.planner.capacity import Budget, check_working_set
from strata_plan.planner.curves import RankCurves

DEFAULT_CONTEXT = 8192
DEFAULT_CHUNK = 2048
DEFAULT_LOOKAHEAD_POINT = "attention"   # where the NVMe guesses are taken (`Problem.lookahead_point`)
DEFAULT_TRIALS = 200        # Optuna trials of a search (`strata-plan plan --trials`, the wizard)


@dataclass(frozen=True, eq=False)
class Problem:
    spec: object            # ModelSpec
    profile: object         # HardwareProfile (with a GPU)
    stats: object           # RoutingStats
    budget: Budget
    context: int = DEFAULT_CONTEXT
    prefill_chunk: int = DEFAULT_CHUNK
    mix: TierMix = field(default_factory=tier_mix)
    # the engine computes the lookahead's gates (its own router); False: replayed routing hands the guesses over (the
    # benchmarks of synthetic models), no gate runs (cost.CostModel.lookahead_gpu_seconds)
    lookahead_gates: bool = True
    depth: int | None = None    # the lookahead depth held fixed (`strata-plan plan --depth`); None: searched
    # decode draws its tokens by temperature / top-p: the draw's GPU time (the profile's measured `pick_us`) joins each
    # token's head (cost.CostModel.head_overhead); False: the argmax (`strata-plan run`'s default, greedy)
    sampled: bool = False
    # with an NVMe tier and lookahead, where the engine takes the guesses for layers j+1.. (the plan's
    # staging.lookahead_point): "attention", when layer j's router runs, queued behind its demand reads (the default:
    # a MoE layer sooner; measured faster on the trained seed, ENGINE.md); "output", when layer j ends. The statistics'
    # precision and recall are the layer's end's either way (the traces record no other)
    lookahead_point: str = DEFAULT_LOOKAHEAD_POINT

    def __post_init__(self) -> None:
        s, st = self.spec, self.stats
        where = f"statistics {getattr(st, 'source', '') or getattr(st, 'model', '')}".strip()
        if int(st.n_experts) != s.n_routed:
            raise UserError(where, "n_experts", f"{st.n_experts} experts, but {s.name} has {s.n_routed}",
                            f"use statistics or a prior for {s.name}")
        if len(st.layers) != s.n_moe_layers:
            raise UserError(where, "layers", f"{len(st.layers)} MoE layers, but {s.name} has {s.n_moe_layers}",
                            f"use statistics or a prior for {s.name}")
        if int(st.top_k) != s.top_k:
            raise UserError(where, "top_k", f"top-{st.top_k}, but {s.name} routes top-{s.top_k}",
                            f"use statistics or a prior for {s.name}")
        if self.context < 1 or self.prefill_chunk < 1:
            raise UserError("--context/--chunk", f"{self.context}/{self.prefill_chunk}", "must be positive",
                            "pass positive token counts")
        if self.profile.gpu is None:
            raise UserError(f"profile {self.profile.name}", "gpus", "has no GPU to plan for",
                            "pass --gpu-preset NAME (a shipped profile's GPU)")
        if self.budget.n_gpus > self.profile.n_gpus:
            raise UserError(f"profile {self.profile.name}", "gpus", f"has {self.profile.n_gpus} GPU(s), the budgets "
                            f"name {self.budget.n_gpus}", "give one --vram-gb figure per GPU of the profile at most")
        machine = sum(int(g.vram_gb.value * 1e9) for g in self.profile.gpus[:self.budget.n_gpus])
        check_working_set(s, self.budget, self.context, self.prefill_chunk, self.slot_bytes, machine)

    @property
    def n_gpus(self) -> int:
        """GPUs planned over: one, or as many as the budgets list (`Budget.gpus`)."""
        return self.budget.n_gpus

    @property
    def gpus(self) -> tuple:
        """The profile's GPUs planned over, in order (the first holds the first layers)."""
        return tuple(self.profile.gpus[:self.n_gpus])

    @cached_property
    def curves(self) -> RankCurves:
        return RankCurves(self.stats)

    @property
    def depths(self) -> tuple[int, int]:
        """The lookahead depths a search may choose, (lowest, highest): `depth` alone when fixed, else 0 .. the
        statistics' deepest lookahead."""
        top = self.curves.max_depth
        if self.depth is None:
            return 0, top
        if not 0 <= self.depth <= top:
            raise UserError("--depth", str(self.depth), f"out of range: the routing statistics describe lookahead "
                            f"depths 0 to {top}", f"pass --depth between 0 and {top}")
        return self.depth, self.depth

    @cached_property
    def rank_formats(self) -> tuple[str, ...]:
        """Format of the expert at each popularity rank (the same for every layer)."""
        out: list[str] = []
        for name, c in zip(self.mix.formats, self.mix.counts(self.spec.n_routed)):
            out += [name] * c
        return tuple(out)

    @cached_property
    def rank_bytes(self) -> np.ndarray:
        """[E] bytes of the expert at each rank."""
        sizes = {f: self.spec.routed_expert_bytes(f) for f in self.mix.formats}
        return np.array([sizes[f] for f in self.rank_formats], dtype=np.float64)

    @cached_property
    def slot_bytes(self) -> int:
        """A cache or staging slot holds any expert: the largest format's size."""
        return max(self.spec.routed_expert_bytes(f) for f in self.mix.formats)

    @cached_property
    def dense_units(self) -> tuple[int, ...]:
        """BF16 bytes of each unit of dense weights that is placed as a whole: every decoder layer's
        non-routed weights, then the head (lm_head with the final norm; with tied embeddings the logits read
        the embedding matrix, so it is the head) as the last unit."""
        s = self.spec
        head = s.lm_head_bytes + (s.embedding_bytes if s.tied_embeddings else 0)
        return tuple(s.dense_layer_bytes(i) for i in range(s.n_layers)) + (head,)

    @cached_property
    def layer_kv_bytes(self) -> tuple[int, ...]:
        """KV cache of each decoder layer at `context` (ModelSpec.kv_cache_layer_bytes)."""
        return tuple(self.spec.kv_cache_layer_bytes(i, self.context) for i in range(self.spec.n_layers))

    @property
    def head_params(self) -> int:
        """Parameters the logits of one token multiply by (lm_head or tied embeddings, and the final norm)."""
        s = self.spec
        return s.lm_head_params + s.hidden + (s.embedding_params if s.tied_embeddings else 0)

    def replace(self, **changes) -> "Problem":
        """The same problem with other fields (budget, profile, ...); memoised routing curves are shared."""
        p = dataclasses.replace(self, **changes)
        if "stats" not in changes and "curves" in self.__dict__:
            p.__dict__["curves"] = self.curves
        if "context" not in changes and "spec" not in changes and "layer_kv_bytes" in self.__dict__:
            p.__dict__["layer_kv_bytes"] = self.layer_kv_bytes
        return p
