"""The NVMe tier in the device loop: the pinned staging cache, its stager thread and the kernels' control block.

    n = stage_slots(plan)                               # slots of the staging cache (the plan's host_slots)
    nbytes = staging_bytes(plan, slot_bytes)            # pinned bytes: slots + the shared block
    st = Staging(store, mem, base, depth, lru_src)      # mem: pinned uint8 [nbytes], base: its arena-relative offset
    st.wait(j, ids); ...fused_moe...; st.done(j, gids, gscores)     # per MoE layer, graph-safe on a GPU
    st.fold(counters); st.check(); st.close()

`wait` and `done` are `kernels.stage_wait` on a GPU and its plain references on a CPU (where the arena and the
staging memory are one buffer, so the reference kernel follows the same offsets). The stager (`engine.stager`) reads
what the requests and guesses ask for. Counting: a routed NVMe use read from staging is `staged` when the expert
was there as the layer ran, `demand` when the layer waited for it; its bytes crossed PCIe (`staged_bytes`). The
bytes the stager read from NVMe are `bytes_from["nvme"]` (each read once, however often it is used while staged);
reads of guesses evicted unused are wasted.
"""
from __future__ import annotations

import torch

from strata_plan.core.lookahead import pinned_staging_slots
from strata_plan.kernels import stage_wait as sw

from .residency import DEMAND, STAGED_USE
from .stager import RING_ROWS, Stager


def stage_slots(plan) -> int:
    """Slots of the staging cache (`core.lookahead.pinned_staging_slots`: the plan's `staging.host_slots`, at least
    2 x top_k x (depth + 1))."""
    return pinned_staging_slots(plan.top_k, plan.prefetch_depth, plan.staging.host_slots)


def guesses_per_layer(top_k: int) -> int:
    """Guess ids a lookahead layer may carry in the ring (the gates give top_k; a replay up to twice that)."""
    return 2 * top_k


def staging_bytes(plan, slot_bytes: int, n_layers: int) -> int:
    """Pinned bytes of the staging cache and the block shared with the GPU (`kernels.stage_wait.block_layout`)."""
    G = plan.prefetch_depth * guesses_per_layer(plan.top_k)
    return stage_slots(plan) * slot_bytes + sw.block_layout(n_layers, plan.n_experts, plan.top_k, G, RING_ROWS)["size"]


class Staging:
    def __init__(self, store, mem: torch.Tensor, base: int, depth: int, lru_src: torch.Tensor | None,
                 read_depths: str = "all", io: str = "threads", early: bool = False):
        plan, dev = store.plan, store.device
        L = store.n_layers
        self.store, self.K, self.depth = store, store.top_k, depth
        self.W = guesses_per_layer(self.K)
        self.stager = Stager(store, mem, base, stage_slots(plan), depth, self.W, read_depths, io, early=early)
        self.early = self.stager.early        # the guesses go with the request (`wait`), not with the layer's end
        at = self.stager.offsets()
        self.cb = sw.ControlBlock(seq=torch.zeros(1, dtype=torch.int64, device=dev), tier=store.tier_codes,
                                  table=store.inplace_offsets, src=lru_src,
                                  admit=store.lru.admit if store.lru is not None else None,
                                  nbytes=store.nbytes_dev,
                                  counts=torch.zeros((L, 4), dtype=torch.int64, device=dev),
                                  words_at=at["words"], ready_at=at["ready"], ring_at=at["ring"],
                                  scores_at=at["scores"], rows=RING_ROWS, guesses=self.stager.G,
                                  cached_hi=store.poison_offset, poison=store.poison_offset)
        self.kernels = store.kernels           # else the plain references (a CPU)
        self.last: dict | None = None          # the stager's counters at the last `fold`

    def wait(self, j: int, ids: torch.Tensor, gids: torch.Tensor | None = None,
             gscores: torch.Tensor | None = None) -> None:
        """After layer j's router (one token): every routed NVMe id staged and in the table. `gids` / `gscores`
        (`early`): the guesses for layers j+1.. taken at this router, published with the request."""
        g = dict(gids=gids, gscores=gscores, per_layer=self.W) if gids is not None else {}
        if self.kernels:
            sw.stage_wait(self.store.arena, ids, j, self.cb, **g)
        else:
            sw.reference_wait(ids, j, self.cb, self.stager.hv, **g)
        if self.store.device.type != "cuda":
            self.stager.check()                 # a CPU stops before the MoE reads a bad blob

    def done(self, j: int, gids: torch.Tensor | None = None, gscores: torch.Tensor | None = None) -> None:
        """After layer j's MoE (and its lookahead gates): the guesses for layers j+1.. (int64 / float32 [D, W])."""
        if self.kernels:
            sw.stage_done(self.store.arena, j, self.cb, self.K, gids, gscores, per_layer=self.W)
        else:
            sw.reference_done(j, self.cb, self.stager.hv, self.K, gids, gscores, per_layer=self.W)

    def check(self) -> None:
        self.stager.check()

    def fold(self, counters) -> dict:
        """Add the device's staged-use counts and the stager's reads to the store's counters, zero the device's;
        returns per layer the staged uses and bytes (the LRU's misses include them). Waits for the device."""
        got = self.cb.counts.cpu().numpy().copy()
        self.cb.counts.zero_()
        sc = self.stager.counts
        for j, c in enumerate(counters.layers):
            uses, nbytes, waited = int(got[j, sw.USES]), int(got[j, sw.BYTES]), int(got[j, sw.WAITED])
            c.uses[STAGED_USE] += uses - waited
            c.uses[DEMAND] += waited
            c.staged_bytes += nbytes
            c.stage_wait_s += float(got[j, sw.WAIT_NS]) / 1e9
            c.bytes_from["nvme"] += int(sc.read_bytes[j])
            c.fetches_from["nvme"] += int(sc.reads_demand[j] + sc.reads_guess[j])
            c.prefetch_bytes += int(sc.guess_bytes[j])
            c.wasted_bytes += int(sc.wasted_bytes[j])
            c.wasted_fetches += int(sc.wasted_reads[j])
            for d in range(1, self.depth + 1):             # lookahead by depth, over the ids read from staging
                c.hint_guesses[d] = c.hint_guesses.get(d, 0) + int(sc.guesses[d - 1, j])
                c.hint_right[d] = c.hint_right.get(d, 0) + int(sc.right[d - 1, j])
                c.hint_used[d] = c.hint_used.get(d, 0) + int(sc.hinted_used[d - 1, j])
        self.last = self.stager.counts.to_data()
        self.stager.reset_counters()
        return {"uses": got[:, sw.USES], "bytes": got[:, sw.BYTES]}

    def reset(self) -> None:
        self.cb.counts.zero_()
        self.stager.reset_counters()

    def close(self) -> None:
        self.stager.close()
