"""The two budgets issue 29 plans a model under, scaled to the model: `strata-plan plan` flags from bytes.

    b = budgets("OUT/bench-moe", "OUT/bench-moe/bench-moe.trace.npz", "h200", context=1024, chunk=256)
    b["ramrich"].flags()      # ["--vram-gb", "1.062658298", "--ram-gb", ..., "--nvme-gb", "0"]

Both give 8% of the model's routed bytes in VRAM to experts, on top of the VRAM every placement needs (the
runtime reserve, KV cache at the context, prefill workspace, the top-k landing slots of one layer and every
dense weight, as `planner.capacity` counts them; the engine keeps dense weights resident). The plan spends
that 8% on static experts, LRU cache slots, and the further landing slots a lookahead depth needs.

- `ramrich`: pinned RAM holds the embeddings and every routed expert; no NVMe tier (`--nvme-gb 0`);
- `seed`: the seed's proportions: pinned RAM holds the embeddings, the NVMe bounce buffers and 24% of the
  routed bytes; NVMe takes the rest. Its budget is every routed byte: experts come in whole blobs of three
  sizes and a plan may spend part of its VRAM share on LRU cache slots rather than static experts, so the
  rest is 68% only when the faster tiers are filled exactly; the planner fills them first (`achieved` says
  what each plan did).

Routed bytes are counted at the formats the plan will give each expert (the planner's tier mix by
popularity rank, `Problem.rank_bytes`, from `ModelSpec.routed_expert_bytes`); nothing is counted here.
"""
from __future__ import annotations

from dataclasses import dataclass

VRAM_SHARE = 0.08
SEED_RAM_SHARE = 0.24


@dataclass(frozen=True)
class TierBudget:
    name: str
    vram: int                   # bytes, as passed to --vram-gb (the runtime reserve included)
    ram: int
    nvme: int
    routed: int                 # the model's routed-expert bytes at the plan's formats
    vram_fixed: int             # VRAM every placement needs (reserve, KV, workspace, top-k landing slots, dense)

    @property
    def expert_vram_share(self) -> float:
        """VRAM beyond the fixed part (static experts, cache slots, lookahead landing slots) / routed bytes."""
        return (self.vram - self.vram_fixed) / self.routed

    def flags(self) -> list[str]:
        """`strata-plan plan` arguments (GB = 1e9 bytes, to the byte)."""
        return ["--vram-gb", f"{self.vram / 1e9:.9f}", "--ram-gb", f"{self.ram / 1e9:.9f}",
                "--nvme-gb", "0" if self.nvme == 0 else f"{self.nvme / 1e9:.9f}"]

    def to_data(self) -> dict:
        return {"vram_gb": self.vram / 1e9, "ram_gb": self.ram / 1e9, "nvme_gb": self.nvme / 1e9,
                "routed_gb": self.routed / 1e9, "vram_fixed_gb": self.vram_fixed / 1e9,
                "expert_vram_share": self.expert_vram_share}


def budgets(model: str, stats: str, profile: str, context: int, chunk: int) -> dict[str, TierBudget]:
    """The `ramrich` and `seed` budgets of `model` (a checkpoint folder or config) planned from `stats`."""
    from strata_plan.planner.make import make_problem
    from strata_plan.planner.placement import Placement, footprint
    problem = make_problem(profile, model, stats=stats, context=context, chunk=chunk)   # whole-card budget
    spec = problem.spec
    n_layers, n_units = spec.n_moe_layers, len(problem.dense_units)
    routed = int(round(float(problem.rank_bytes.sum()))) * n_layers
    none = (0,) * n_layers

    def fp(ram: int):    # no expert in VRAM, `ram` of each layer's experts in pinned RAM, the rest on NVMe
        return footprint(problem, Placement(none, (ram,) * n_layers, none, (True,) * n_units, 0))

    all_ram, all_nvme = fp(spec.n_routed), fp(0)
    vram = all_ram.vram + int(VRAM_SHARE * routed)
    ramrich = TierBudget("ramrich", vram, all_ram.embeddings + routed, 0, routed, all_ram.vram)
    seed = TierBudget("seed", vram, all_nvme.embeddings + all_nvme.host_staging + int(SEED_RAM_SHARE * routed),
                      routed, routed, all_ram.vram)
    return {"ramrich": ramrich, "seed": seed}


def achieved(plan) -> dict:
    """Where a plan put the routed bytes (its own memory accounting, `plan.memory`): static experts and LRU
    cache slots in VRAM, experts in pinned RAM and on NVMe, in GB and as shares of the routed bytes."""
    v, r, n = plan.memory.vram, plan.memory.ram, plan.memory.nvme
    routed = v["static_experts"] + r["ram_experts"] + n["nvme_experts"]
    return {"static_gb": v["static_experts"] / 1e9, "cache_gb": v["cache_slots"] / 1e9,
            "ram_experts_gb": r["ram_experts"] / 1e9, "nvme_experts_gb": n["nvme_experts"] / 1e9,
            "static_share": v["static_experts"] / routed, "vram_experts_share": (v["static_experts"] + v["cache_slots"]) / routed,
            "ram_share": r["ram_experts"] / routed, "nvme_share": n["nvme_experts"] / routed,
            "dense_streamed_layers": len(plan.dense.streamed_layers), "prefetch_depth": plan.prefetch_depth,
            "cache_slots": plan.cache.total_slots}
