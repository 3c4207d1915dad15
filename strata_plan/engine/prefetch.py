"""Router lookahead in the device loop: the guesses of MoE layer j + d, made from layer j's output inside the token's
graph, copied from pinned RAM into VRAM staging slots on a side stream while the link would otherwise idle.

    pf = DevicePrefetch(store, depth)
    pf.resolve(j, ids)            # before layer j's cache step and MoE: landed guesses are read from their slots
    ...fused_moe...
    pf.issue(j + d, gids, after=j)  # after layer j, all on the side stream: the slots of layers <= j freed, its
                                  # lookahead gate (or the guesses), claim, copy (each slot READY as its bytes land)
    pf.end_token()                # the side stream joins the main one; every slot whose copy is over is freed
    pf.fold(counters)

The protocol (`kernels.prefetch`) never makes a layer wait: a guess still being copied when its layer runs is read in
place from pinned RAM (counted `late`, its copy wasted). The slots are the store's dynamic slots outside the device
LRU's (prefill's waves use them between decode runs: `before_prefill` orders prefill's copies after the decode work
queued). On a CPU the side stream is the main one (the references in order), so a claimed guess has landed when its
layer runs. Partial landing (`partial`, layers with a device LRU): a routed guess still copying is filled into its cache
slot from both, the part that landed from the staging slot, the rest from pinned RAM (`partial`). Counting (folded into
the store's counters): uses served from a slot are `prefetched`, uses whose guess was still copying `late` (nothing
landed) or `partial`; the copies' bytes cross PCIe (`bytes_from["ram"]`, `prefetch_bytes`), slots freed unused are
wasted, as are the bytes copied past those a layer read; precision and recall of the guesses at the plan's depth as the
routing statistics define them.
"""
from __future__ import annotations

import torch

from strata_plan.kernels import prefetch as pk

from .residency import IN_PLACE, LATE, PARTIAL, PREFETCHED


class DevicePrefetch:
    def __init__(self, store, depth: int, partial: torch.Tensor | None = None):
        self.store, self.depth = store, depth
        dev = store.device
        L, E = store.n_layers, store.E
        n = store.n_slots - store.plan.cache.total_slots          # the slots outside the device LRU's
        rows = store.inplace_offsets.clone()                       # RAM experts' in-place offsets, never changed
        self.st = pk.PrefetchState(
            state=torch.zeros(n, dtype=torch.int64, device=dev),
            slot_offset=torch.tensor([store.dyn_base + i * store.slot_bytes for i in range(n)], dtype=torch.int64,
                                     device=dev),
            where=torch.full((L, E), -1, dtype=torch.int64, device=dev),
            assign=torch.full((store.top_k,), -1, dtype=torch.int64, device=dev),
            ram_rows=rows, tier=store.tier_codes, nbytes=store.nbytes_dev,
            table=store.inplace_offsets, src=store.lru.ram_offset if store.lru is not None else None,
            counts=torch.zeros((L, pk.N_COUNTS), dtype=torch.int64, device=dev), cached_hi=store.poison_offset,
            guessed=torch.full((L, store.top_k), -1, dtype=torch.int64, device=dev),
            **(dict(landed=torch.zeros((n, -(-store.slot_bytes // pk.COPY_CHUNK)), dtype=torch.int32, device=dev),
                    partial=partial, tail=store.lru.tail, split=store.lru.split) if partial is not None else {}))
        self.cuda = dev.type == "cuda"
        self.kernels = store.kernels          # else the plain references (a CPU)
        self.side = torch.cuda.Stream(dev) if self.cuda else None
        self.forked = False
        self.programs: int | None = None      # the copy kernel's thread blocks (None: kernels.prefetch.copy_programs)

    def resolve(self, j: int, ids: torch.Tensor) -> None:
        """Before layer j's cache step and MoE kernels (one token): routed guesses that landed are read from their
        slots."""
        (pk.resolve if self.kernels else pk.reference_resolve)(ids, j, self.st)

    def resolve_step(self, j: int, ids: torch.Tensor) -> None:
        """`resolve`, then the store's device LRU step, in one launch (the lookahead adds no kernel to the layer's main
        chain)."""
        (pk.resolve_step if self.kernels else pk.reference_resolve_step)(ids, j, self.st, self.store.lru)

    def release(self, j: int) -> None:
        """After layer j's MoE kernels: the slots of layers <= j whose copies are over are free again."""
        (pk.release if self.kernels else pk.reference_release)(j, self.st)

    def issue(self, jj: int, gids, reads: torch.Tensor | None = None, after: int | None = None) -> None:
        """Guesses int64 [k] (best first) for MoE layer jj, or a function that makes them (the lookahead gate on
        `reads`, the layer's output): made, noted, claimed and copied (each slot published as its bytes land) on the
        side stream (graph-safe: the side stream forks from the main one here and joins it in `end_token`), so the
        main stream's next layer starts at once. First, there, the slots of layers <= `after` (the layer just run:
        its MoE kernels are before the fork) are freed: `release` is off the main stream, and every copy issued
        before is over by then. `note_guesses` keeps the guesses for `resolve`'s precision and recall: a layer
        resolved before its guesses were noted (the side stream a whole layer late) counts none."""
        st = self.st
        if not (self.kernels and self.cuda):  # one stream, in order: the references, or the kernels interpreted
            if after is not None:
                self.release(after)
            gids = gids() if callable(gids) else gids
            pk.note_guesses(gids, jj, st)
            if self.kernels:
                self._claim_copy(gids, jj)
                return
            pk.reference_claim(gids, jj, st)
            pk.reference_copy(self.store.arena, gids, jj, st)
            return
        self.side.wait_stream(torch.cuda.current_stream())
        for t in (reads, None if callable(gids) else gids):
            if t is not None:                 # not reused before the side stream read it (in a capture: not before the
                t.record_stream(self.side)    # capture ends, the caching allocator defers the block's reuse)
        with torch.cuda.stream(self.side):
            if after is not None:
                self.release(after)
            gids = gids() if callable(gids) else gids
            pk.note_guesses(gids, jj, st)
            self._claim_copy(gids, jj)
        self.forked = True

    def _claim_copy(self, gids: torch.Tensor, jj: int) -> None:
        pk.claim(gids, jj, self.st)
        pk.copy(self.store.arena, gids, jj, self.st, self.store.slot_bytes, programs=self.programs)

    def end_token(self) -> None:
        """The token's last layer ran: the side stream joins the main one, then every slot is freed (those of the
        last `depth` layers, which no `issue` follows, among them)."""
        self.join()
        self.release(self.store.n_layers - 1)

    def join(self) -> None:
        """The main stream waits for the side stream's work so far (a fork left open by eager layers)."""
        if self.forked:
            torch.cuda.current_stream().wait_stream(self.side)
            self.forked = False

    def before_prefill(self) -> None:
        """Prefill's waves copy into the same slots on the copy stream: every guess still held is let go first (the
        side stream joined, every slot freed), and the copies wait for the decode work queued so far."""
        self.end_token()
        if self.cuda:
            self.store.transfers.copy_stream.wait_stream(torch.cuda.current_stream())

    def fold(self, counters) -> None:
        """Add the device's prefetch counts to the store's counters (a served use was counted in place by the cache
        step or `count_uses`: it moves to `prefetched`, a late one to `late`) and zero them. Waits for the device."""
        self.join()                           # the side stream's counts too
        got = self.st.counts.cpu().numpy().copy()
        self.st.counts.zero_()
        for j, row in enumerate(got):
            c = counters.layers[j]
            used, late, part = int(row[pk.USED]), int(row[pk.LATE]), int(row[pk.PART_USED])
            c.uses[IN_PLACE] -= used + late + part
            c.uses[PREFETCHED] += used
            c.uses[LATE] += late
            c.uses[PARTIAL] += part
            c.bytes_from["ram"] += int(row[pk.COPIED]) - int(row[pk.USED_BYTES])    # copies, not in-place reads
            c.prefetch_bytes += int(row[pk.COPIED])
            c.wasted_bytes += int(row[pk.WASTED_BYTES])
            c.wasted_fetches += int(row[pk.WASTED])
            d = self.depth                    # precision and recall of the guesses at the prefetched depth
            c.hint_guesses[d] = c.hint_guesses.get(d, 0) + int(row[pk.GUESSES])
            c.hint_right[d] = c.hint_right.get(d, 0) + int(row[pk.RIGHT])
            c.hint_used[d] = c.hint_used.get(d, 0) + int(row[pk.HINTED_USED])

    def reset(self) -> None:
        self.st.counts.zero_()
