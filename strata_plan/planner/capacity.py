"""Capacity: the budgets of the three memory tiers and what a placement puts in each.

VRAM holds a runtime reserve, the KV cache at the chosen context, a prefill workspace, landing slots for
in-flight experts (staging), double buffers for streamed dense weights, the resident dense weights, the
static experts and the dynamic cache slots. Pinned RAM holds the embeddings, the streamed dense weights,
the RAM-tier experts and the NVMe bounce buffers. NVMe holds the remaining experts. Every byte count
comes from `ModelSpec` and the format registry; this module only adds them up. GB = 1e9 bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from strata_plan.core.lookahead import staging_slots
from strata_plan.errors import UserError
from strata_plan.units import fmt_bytes, fmt_bytes_pair

RUNTIME_RESERVE = 1_000_000_000
"""VRAM held back for the CUDA context, cuBLAS/Triton workspaces and allocator slack (an estimate: a CUDA
context alone takes 0.3-0.6 GB on current drivers); `--vram-gb` budgets include it."""

ACTIVATION_COPIES = 4
"""Live [chunk, hidden] BF16 activations during a prefill chunk (residual, normed input, attention output,
MoE output); the expert intermediate [chunk * top_k, 2 * moe_intermediate] comes on top."""


@dataclass(frozen=True)
class Budget:
    """Bytes each tier may use. `vram` is the whole card (or --vram-gb); the reserve is part of it."""

    vram: int
    ram: int
    nvme: int
    reserve: int = RUNTIME_RESERVE
    gpus: tuple[int, ...] = ()      # several GPUs: each one's VRAM budget (`vram` is then their sum); () one GPU

    def __post_init__(self) -> None:
        if len(self.gpus) == 1:
            raise ValueError("Budget.gpus lists two or more GPUs' budgets, or none (one GPU: `vram`)")

    @property
    def n_gpus(self) -> int:
        return max(1, len(self.gpus))

    @property
    def vram_per_gpu(self) -> tuple[int, ...]:
        return self.gpus or (self.vram,)

    def contains(self, small: "Budget") -> bool:
        """At least `small` in every tier (and on every GPU)."""
        gpus = len(self.gpus) == len(small.gpus) and all(x >= y for x, y in zip(self.gpus, small.gpus))
        return small.vram <= self.vram and small.ram <= self.ram and small.nvme <= self.nvme and gpus

    @classmethod
    def from_profile(cls, profile, vram_gb: float | tuple | list | None = None, ram_gb: float | None = None,
                     nvme_gb: float | None = None, reserve: int = RUNTIME_RESERVE, gpus: int | None = None) -> "Budget":
        """Budgets from the profile, with the flags' overrides. `vram_gb` is one figure (one GPU, or each of
        `gpus` GPUs) or one per GPU (`--vram-gb 24,24`: plans over that many GPUs); `gpus`: how many of the
        profile's GPUs to plan over (default: as many as `vram_gb` lists, else one). A budget above the profile's
        hardware (a GPU's VRAM, the host's RAM, its drives' capacity) is refused: this plans for that machine."""
        gpu = profile.gpu
        if gpu is None:
            raise UserError(f"profile {profile.name}", "gpus", "has no GPU to plan for",
                            "pass --gpu-preset NAME (a shipped profile's GPU) or profile a machine with a GPU")
        per = tuple(vram_gb) if isinstance(vram_gb, (tuple, list)) else None
        n = gpus if gpus is not None else (len(per) if per else 1)
        if per is not None and len(per) != n:
            raise UserError("--vram-gb", ",".join(f"{v:g}" for v in per), f"lists {len(per)} budgets for {n} GPUs",
                            "give one budget per GPU planned over, or a single figure")
        if not 1 <= n <= profile.n_gpus:
            raise UserError("--gpus" if gpus is not None else "--vram-gb", str(n),
                            f"profile {profile.name} has {profile.n_gpus} GPU(s)",
                            f"plan over 1..{profile.n_gpus} GPUs, or use a profile with more")
        for v in (per or ()) + ((vram_gb,) if per is None else ()):
            if v is not None and not v > 0:
                raise UserError("--vram-gb", str(v), "must be a positive number of GB", "pass e.g. --vram-gb 24")
        for i, (g, v) in enumerate(zip(profile.gpus, per or (vram_gb,) * n)):
            if v is not None:
                _within_machine("--vram-gb", v, g.vram_gb.value, "VRAM" + (f" on GPU {i}" if n > 1 else ""),
                                profile.name, f"GPU {i}: " if n > 1 else "")
        if n > 1:
            each = per or (vram_gb,) * n
            vrams = tuple(int((g.vram_gb.value if v is None else v) * 1e9) for g, v in zip(profile.gpus, each))
            one = cls.from_profile(profile.first_gpus(1), None, ram_gb, nvme_gb, reserve)
            return cls(sum(vrams), one.ram, one.nvme, reserve, vrams)
        if per is not None:
            vram_gb = per[0]
        if ram_gb is not None and not ram_gb > 0:
            raise UserError("--ram-gb", str(ram_gb), "must be a positive number of GB", "pass e.g. --ram-gb 24")
        if ram_gb is not None:
            _within_machine("--ram-gb", ram_gb, profile.host.ram_gb.value, "RAM", profile.name)
        if nvme_gb is not None and not nvme_gb >= 0:       # 0: no NVMe tier (everything in VRAM and RAM)
            raise UserError("--nvme-gb", str(nvme_gb), "must be 0 (no NVMe tier) or a positive number of GB",
                            "pass e.g. --nvme-gb 24, or 0 to keep every expert in VRAM and pinned RAM")
        if nvme_gb is not None and profile.nvme:
            _within_machine("--nvme-gb", nvme_gb, sum(d.capacity_gb.value for d in profile.nvme), "NVMe", profile.name)
        vram = gpu.vram_gb.value if vram_gb is None else vram_gb
        ram = profile.host.pinnable_gb.value if ram_gb is None else ram_gb
        nvme = (profile.nvme[0].capacity_gb.value if profile.nvme else 0.0) if nvme_gb is None else nvme_gb
        return cls(int(vram * 1e9), int(ram * 1e9), int(nvme * 1e9), reserve)

    def scaled(self, factor: float) -> "Budget":
        gpus = tuple(int(v * factor) for v in self.gpus)
        return Budget(sum(gpus) if gpus else int(self.vram * factor), int(self.ram * factor), int(self.nvme * factor),
                      self.reserve, gpus)


def _within_machine(flag: str, gb: float, have_gb: float, what: str, profile: str, label: str = "") -> None:
    """Refuse a budget above what the profile's machine has: `plan` (and the wizard) plan for the machine the
    profile describes; `what-if` builds its budgets itself to explore hardware one does not have."""
    if not gb <= have_gb * (1 + 1e-9):
        at_most = f"give {label.rstrip(': ')} {have_gb:g} GB or less" if label else f"pass {flag} {have_gb:g} or less"
        raise UserError(flag, f"{label}{gb:g}", f"exceeds the {have_gb:g} GB of {what} of profile {profile}",
                        f"{at_most} (strata-plan what-if explores hardware this machine does not have)")


def max_context(spec, kv_bytes: int, most: int) -> int:
    """The longest context, at most `most` tokens, whose KV cache fits in `kv_bytes` (0: not one token)."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if spec.kv_cache_bytes(mid) <= kv_bytes else (lo, mid - 1)
    return lo


def workspace_bytes(spec, chunk: int) -> int:
    """Peak activation memory of one prefill chunk (decode needs far less)."""
    hidden = ACTIVATION_COPIES * chunk * spec.hidden
    expert = chunk * spec.top_k * 2 * spec.moe_intermediate
    return 2 * (hidden + expert)


@dataclass(frozen=True)
class Footprint:
    """What one placement puts in each tier, in bytes."""

    reserve: int
    kv_cache: int
    workspace: int
    staging: int            # VRAM landing slots for in-flight experts
    dense_buffers: int      # VRAM double buffer for streamed dense weights
    dense_resident: int
    static_experts: int
    cache_slots: int
    embeddings: int         # pinned RAM
    dense_streamed: int     # pinned RAM
    ram_experts: int
    host_staging: int       # pinned bounce buffers for NVMe reads
    nvme_experts: int
    per_gpu: tuple[dict, ...] = ()         # several GPUs: each one's VRAM parts (the fields above are their sums)

    @property
    def per_gpu_vram(self) -> tuple[int, ...]:
        return tuple(sum(d.values()) for d in self.per_gpu)

    @property
    def vram(self) -> int:
        return (self.reserve + self.kv_cache + self.workspace + self.staging + self.dense_buffers
                + self.dense_resident + self.static_experts + self.cache_slots)

    @property
    def ram(self) -> int:
        return self.embeddings + self.dense_streamed + self.ram_experts + self.host_staging

    @property
    def nvme(self) -> int:
        return self.nvme_experts

    def overflow(self, budget: Budget) -> tuple[int, int, int]:
        """Bytes over budget per tier (VRAM, RAM, NVMe); all <= 0 means the placement fits. With several GPUs
        the VRAM figure is the worst GPU's."""
        vram = self.vram - budget.vram
        if budget.gpus:
            vram = max(u - b for u, b in zip(self.per_gpu_vram or (self.vram,) + (0,) * (len(budget.gpus) - 1),
                                             budget.gpus))
        return vram, self.ram - budget.ram, self.nvme - budget.nvme

    def fits(self, budget: Budget) -> bool:
        return max(self.overflow(budget)) <= 0


def check_working_set(spec, budget: Budget, context: int, chunk: int, slot_bytes: int, machine_vram: int = 0) -> None:
    """Refuse a VRAM budget that cannot hold the working set: reserve, KV cache, workspace, the top-k
    staging slots and one layer's dense weights (several GPUs: each GPU's own part, the KV cache shared out).
    `machine_vram`: the VRAM of the GPUs planned over (0: unknown); a KV cache that would not fit even there
    is the context's doing (`--context` names it), one that would is the budget's (`--vram-gb`)."""
    layer = max(spec.dense_layer_bytes(i) for i in range(spec.n_layers))
    fixed = budget.reserve + workspace_bytes(spec, chunk) + staging_slots(spec.top_k, 0) * slot_bytes + max(layer, spec.lm_head_bytes)
    for g, v in enumerate(budget.gpus):         # several GPUs: each runs its layers with its own working set
        if fixed > v:
            have, needed = fmt_bytes_pair(v, fixed)
            raise UserError("--vram-gb", f"GPU {g}: {have}", f"below the working set of a GPU, {needed} (runtime "
                            "reserve, prefill workspace, staging and one layer)", "raise --vram-gb or lower --chunk")
    n = len(budget.gpus) or 1
    kv = spec.kv_cache_bytes(context)
    need = fixed * n + kv
    cap = max(budget.vram, machine_vram)         # the most VRAM a budget may name
    if need <= budget.vram:
        pass
    elif machine_vram and fixed * n + spec.kv_cache_bytes(1) <= cap < need:     # no budget would hold this KV cache
        have, needed = fmt_bytes(cap), fmt_bytes(need)
        where = f"the {have} of VRAM of the GPU{'s' if n > 1 else ''}" if cap == machine_vram else f"the {have} budget"
        raise UserError("--context", str(context), f"its KV cache, {fmt_bytes(kv)}, and the working set "
                        f"(runtime reserve, prefill workspace, staging and one layer{' on each GPU' if n > 1 else ''}, "
                        f"{fmt_bytes(fixed * n)}) need {needed}, more than {where}",
                        f"lower --context to at most {max_context(spec, cap - fixed * n, context)} tokens")
    else:
        have, needed = fmt_bytes_pair(budget.vram, need)
        most = max_context(spec, budget.vram - fixed * n, context)
        fix = "raise --vram-gb" + (f", lower --context (at most {most} tokens fit)" if most else "") + " or lower --chunk"
        if budget.gpus:
            raise UserError("--vram-gb", f"{have} over {n} GPUs", f"below the working set of {needed}: each GPU's "
                            f"{fmt_bytes(fixed, 4)} (runtime reserve, prefill workspace, staging and one layer) and the KV "
                            f"cache at context {context}, {fmt_bytes(kv)}, shared out", fix)
        raise UserError("--vram-gb", have, f"below the working set of {needed} (runtime reserve "
                        f"{fmt_bytes(budget.reserve)}, KV cache at context {context} {fmt_bytes(kv)}, prefill "
                        "workspace, staging and one layer)", fix)
    if spec.embedding_bytes > budget.ram:
        have, needed = fmt_bytes_pair(budget.ram, spec.embedding_bytes)
        raise UserError("--ram-gb", have, f"below the {needed} of embeddings kept in pinned RAM", "raise --ram-gb")
