"""What the expert store did, per MoE layer, and the hit rates it implies.

Every routed decode use (one token's one expert at one layer) is counted once, on the device, by how it was served
when its layer ran (`residency.USE_KINDS`):

    static      in the plan's static VRAM set
    cached      in the layer's LRU cache (the device LRU, `kernels.lru`)
    prefetched  copied into a VRAM slot by the lookahead's guess before the layer ran ("prefetched in time")
    late        guessed, but its copy was still in flight: read in place instead (the copy's bytes wasted)
    demand      an NVMe expert the layer waited for the stager to stage (engine.staging)
    in_place    read by the MoE kernel straight from pinned RAM over PCIe (no copy; a cache miss)
    staged      an NVMe expert read in place from the pinned staging cache, staged before the layer asked

**Hit rate** (the seeds' definition, "the needed expert was already there when the layer ran"):
(static + cached + prefetched) / uses. A use read in place or waited for is a miss.
**Resident hit rate**: (static + cached) / uses, the same quantity as the planner's
`predicted.vram_hit_rate` (static set plus LRU cache, prefetch not counted), so the two compare.
Dense weights in pinned RAM (`engine.dense`) are counted apart from the experts, in bytes read for the layers that
ran (`dense_bytes`: streamed decoder layers, lm_head, embedding rows) and, where they are copied through buffers, the
layer copies not prefetched by the time their layer started (`dense_demand`).
Lookahead precision and recall by depth follow the routing statistics' definitions: right guesses /
guesses, and right guesses / experts used, over the (token, layer) pairs that received a guess.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .residency import CACHED, DEMAND, LATE, PREFETCHED, STATIC, USE_KINDS


@dataclass
class LayerCounters:
    layer: int
    uses: dict[str, int] = field(default_factory=lambda: {k: 0 for k in USE_KINDS})
    bytes_from: dict[str, int] = field(default_factory=lambda: {"ram": 0, "nvme": 0})   # over PCIe (copied or in place)
    fetches_from: dict[str, int] = field(default_factory=lambda: {"ram": 0, "nvme": 0})
    prefetch_bytes: int = 0          # of bytes_from, fetched on a guess (VRAM prefetch, or a staged NVMe read)
    wasted_bytes: int = 0            # guessed, fetched, never used
    wasted_fetches: int = 0
    hint_guesses: dict[int, int] = field(default_factory=dict)     # depth -> ids hinted
    hint_right: dict[int, int] = field(default_factory=dict)       # depth -> hinted ids the token used
    hint_used: dict[int, int] = field(default_factory=dict)        # depth -> ids used where a hint existed
    staged_bytes: int = 0            # bytes the kernels read in place from the NVMe staging cache
    stage_wait_s: float = 0.0        # GPU time the layer's stage_wait polled for the stager

    @property
    def n_uses(self) -> int:
        return sum(self.uses.values())


class StoreCounters:
    def __init__(self, n_layers: int):
        self.layers = [LayerCounters(j) for j in range(n_layers)]
        self.dense_bytes = {"layers": 0, "lm_head": 0, "embeddings": 0}
        self.dense_demand = 0

    def total(self, kind: str) -> int:
        return sum(c.uses[kind] for c in self.layers)

    @property
    def uses(self) -> int:
        return sum(c.n_uses for c in self.layers)

    def hit_rate(self) -> float:
        return (self.total(STATIC) + self.total(CACHED) + self.total(PREFETCHED)) / max(1, self.uses)

    def resident_hit_rate(self) -> float:
        return (self.total(STATIC) + self.total(CACHED)) / max(1, self.uses)

    def lookahead(self) -> dict[int, dict[str, float]]:
        depths = sorted({d for c in self.layers for d in c.hint_guesses})
        out = {}
        for d in depths:
            g = sum(c.hint_guesses.get(d, 0) for c in self.layers)
            r = sum(c.hint_right.get(d, 0) for c in self.layers)
            u = sum(c.hint_used.get(d, 0) for c in self.layers)
            out[d] = {"precision": r / g if g else 0.0, "recall": r / u if u else 0.0, "guesses": g}
        return out

    def to_data(self) -> dict:
        """JSON-able: totals, hit rates (both definitions), lookahead, and every layer's counters."""
        tot = {k: self.total(k) for k in USE_KINDS}
        return {
            "uses": self.uses, "by_kind": tot,
            "hit_rate": self.hit_rate(), "resident_hit_rate": self.resident_hit_rate(),
            "late": tot[LATE], "demand": tot[DEMAND],
            "bytes_from": {t: sum(c.bytes_from[t] for c in self.layers) for t in ("ram", "nvme")},
            "fetches_from": {t: sum(c.fetches_from[t] for c in self.layers) for t in ("ram", "nvme")},
            "prefetch_bytes": sum(c.prefetch_bytes for c in self.layers),
            "wasted_bytes": sum(c.wasted_bytes for c in self.layers),
            "staged_bytes": sum(c.staged_bytes for c in self.layers),
            "stage_wait_s": sum(c.stage_wait_s for c in self.layers),
            "lookahead": {str(d): v for d, v in self.lookahead().items()},
            "dense_bytes": dict(self.dense_bytes), "dense_demand": self.dense_demand,
            "layers": [asdict(c) for c in self.layers],
        }
