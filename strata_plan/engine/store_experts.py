"""The routed-expert call on the tiered store: `engine.experts.Experts` for the decode loop.

    experts = StoreExperts(store, hidden, intermediate, depth=plan.prefetch_depth)
    model = MoEModel.load(folder, experts, context, device)
    model.after_moe = experts.after_moe          # router lookahead (omit for the on-demand / LRU-only runs)
    experts.model = model

Per MoE layer j and call:
1. the router's ids come to the host: the one device-to-host round trip of the layer (`host_sync_s`);
2. decode (one token): `store.ensure(j, ids)` makes every routed expert resident and
   returns the layer's offsets row; one `fused_moe` call reads the arena; `store.release(j)`;
   several tokens (prefill): the chunk's experts in waves (`store.waves`), `fused_moe` per wave with the ids of the other
   waves skipped (-1), the partial outputs summed;
3. lookahead (`after_moe`): the gates of MoE layers j+1..j+d on the layer's output (`model.route`, the
   definition of core/routing/TRACE.md; in the device loop with its kernels `kernels.gate`, two launches a gate)
   are computed on the device and copied to pinned host memory
   without a wait; at the next layer's round trip, before reading its router's ids (the GPU is running
   that layer's attention meanwhile), the main thread gives them to the store (`store.hint(j+d, ids,
   scores, d)`, which queues the prefetches); their chunks go on the copy stream from the main thread
   (`Transfers.pump`), also while it waits for the next router's ids. One thread issues every RAM fetch:
   no hint or copy thread competing for the interpreter lock. `replay` replaces the router's ids by a replayed routing
(`engine.replay`): the data movement is real, the text is not.

The device loop (`in_place`, the store opened with `StoreOptions(in_place=True)`): a decode call is graph-safe and
has no host part: the routed ids are counted on the device (`store.count_uses`) and `fused_moe` reads the table
`store.inplace_offsets[j]`, static experts in VRAM and the rest in place from pinned RAM (with cache slots the
device LRU first admits misses into their slots, `store.cache_decide` / `cache_fill`). With a replay, the whole replay lives on the
device and the step reads its row at a device cursor (`replay_rows`, `advance_replay`): no host work a token.
With lookahead (`store.prefetch`, engine/prefetch.py) a layer first reads the guesses that landed in VRAM slots
(`resolve`) and frees its slots after its MoE (`release`); after it, `after_moe_device` runs the lookahead gates and
issues the guesses for layer j+d on a side stream (joined after the last MoE layer: `DevicePrefetch.end_token`). With an NVMe tier
(`store.staging`, engine/staging.py) each layer asks the stager for its routed NVMe experts and waits on the GPU only
for those not yet staged in pinned RAM (`Staging.wait`); after the layer (with lookahead: with its gates' guesses)
it tells the stager it is done (`Staging.done`). Prefill (several tokens) takes the path above.
"""
from __future__ import annotations

import time

import torch

from strata_plan.kernels.gate import lookahead_gate
from strata_plan.kernels.ops import fused_moe



class StoreExperts:
    def __init__(self, store, hidden: int, intermediate: int, depth: int = 0, backend: str = "auto", replay=None,
                 in_place: bool = False):
        self.store, self.hidden, self.intermediate, self.backend = store, hidden, intermediate, backend
        self.in_place = in_place
        self.skip_moe = False                 # device loop, timing only: the MoE call left out (`DeviceDecode.time_parts`)
        self.staged = False                   # device loop: replayed ids come from the device copy of the replay
        self.depth = depth
        self.model = None
        self.replay = replay                  # engine.replay.Replay or None
        self.host_sync_s = 0.0                # time the main thread waited for the router's ids
        self.syncs = 0
        self.moe_s = 0.0                      # host time in ensure + launch + release
        self.cuda = store.device.type == "cuda"
        n = store.n_layers
        self._ring = [torch.empty((depth, 2, store.top_k), dtype=torch.float32, pin_memory=True)
                      for _ in range(2 * n)] if self.cuda and depth and not in_place else []   # the host loop's hints
        self._ring_i = 0
        self._hints: list = []                # (target layers, [depth, 2, k] ids and weights, event or None)
        self.hints_s = 0.0                    # host time giving hints to the store (its prefetches issued)
        self._ids_host = None                 # pinned copy of the router's ids (`_ids_to_host`)
        self._ids_event = torch.cuda.Event() if self.cuda else None
        if in_place and replay is not None:   # the replay on the device: [T, L, k] ids and weights, a cursor
            dev = store.device
            self._rid_all = torch.from_numpy(replay.experts.astype("int64")).to(dev)
            self._rw_all = torch.from_numpy(replay.weights.astype("float32")).to(dev)
            self._cursor = torch.zeros(1, dtype=torch.int64, device=dev)
            self._host_next = -1              # the host replay's cursor the device one was last set from
            self._rid = self._rw = None
            if depth:                         # its lookahead guesses too: [T, L, D, W]
                g, sc = replay.hint_table(depth, 2 * store.top_k)
                self._ghint_all, self._gscore_all = torch.from_numpy(g).to(dev), torch.from_numpy(sc).to(dev)
        elif in_place and depth:              # the gates' guesses, written in place each layer
            L = store.n_layers
            self._gids = torch.full((L, depth, 2 * store.top_k), -1, dtype=torch.int64, device=store.device)
            self._gsc = torch.zeros((L, depth, 2 * store.top_k), dtype=torch.float32, device=store.device)
            self._gate_logits = torch.empty(store.E, dtype=torch.float32, device=store.device)
        self._stepping = False                # inside a device-loop step reading the device replay

    # ---- the Experts interface -------------------------------------------------------------------
    def __call__(self, j: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 1:
            return self.chunk(j, x, topk_ids, topk_weights)
        if self.in_place:
            return self.read_in_place(j, x, topk_ids, topk_weights)
        topk_ids, topk_weights, offs = self.prepare(j, topk_ids, topk_weights)
        t1 = time.perf_counter()
        out = self.moe(j, x, topk_ids, topk_weights, offs)
        self.store.release(j)
        self.moe_s += time.perf_counter() - t1
        return out

    # ---- the device loop ------------------------------------------------------------------------------
    def read_in_place(self, j: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """One token's MoE call of layer j in the device loop: static experts from the arena, the rest from pinned
        RAM where they are (graph-safe: no host sync, no host work that changes per token)."""
        if self.replay is not None:
            if self._stepping:
                topk_ids, topk_weights = self._rid[j], self._rw[j]
            else:
                topk_ids, topk_weights = self.replay.route(j, 1, x.device)
        if self.skip_moe:
            return torch.zeros_like(x)
        store = self.store
        staging, prefetch = store.staging, store.prefetch
        if prefetch is not None:              # guesses that landed in VRAM slots are read there
            prefetch.resolve(j, topk_ids)
        if store.lru is not None:             # the LRU on the device: hits, admissions, evictions
            store.cache_decide(j, topk_ids)
        else:
            store.count_uses(j, topk_ids)
        if staging is not None:               # NVMe experts (admitted ones too): wait only for what is not staged
            staging.wait(j, topk_ids)
        if store.lru is not None:             # admitted experts copied into their slots
            store.cache_fill(j, topk_ids)
        out = self.moe(j, x, topk_ids, topk_weights, self.store.inplace_offsets[j])
        if prefetch is not None:
            prefetch.release(j)               # slots of layers <= j whose copies are over are free again
        if staging is not None and not staging.depth:
            staging.done(j)                   # its staged experts may be evicted once this layer's kernels ran
        return out

    def after_moe_device(self, j: int, out: torch.Tensor) -> None:
        """Device loop with lookahead (one token): the gates of layers j+1..j+depth on layer j's output (or the replay's
        guesses, on the device) go to the stager with layer j's end (an NVMe tier), and the guesses for layer j+depth
        to the VRAM prefetch (graph-safe)."""
        if out.shape[0] != 1 or self.skip_moe:        # (timing the step without MoE: without its lookahead too)
            return
        gids, gsc = self._guesses(j, out)
        if self.store.staging is not None:
            self.store.staging.done(j, gids, gsc)
        pf = self.store.prefetch
        if pf is not None and j + self.depth < self.store.n_layers:
            pf.issue(j + self.depth, gids[self.depth - 1, :self.store.top_k])
        if pf is not None and j == self.store.n_layers - 1:
            pf.end_token()                    # the token's last MoE layer: the side stream joins, its slots free

    def _guesses(self, j: int, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The lookahead guesses of layers j+1..j+depth, int64 / float32 [depth, W] (best first, -1 padded): the
        replay's (on the device inside a step), or the gates' on `out`."""
        W = 2 * self.store.top_k
        if self.replay is not None and self._stepping:
            return self._ghint[j], self._gscore[j]               # [D, W] at the replay's device cursor
        if self.replay is not None:                              # outside a step (prefill a token a call): the host's
            gids = torch.full((self.depth, W), -1, dtype=torch.int64)
            gsc = torch.zeros((self.depth, W), dtype=torch.float32)
            for d, _ in enumerate(self.targets(j), 1):
                ids, scores = self.replay.hint(j, d)
                gids[d - 1, :len(ids[:W])] = torch.tensor(ids[:W], dtype=torch.int64)
                gsc[d - 1, :len(scores[:W])] = torch.tensor(scores[:W], dtype=torch.float32)
            return gids.to(out.device), gsc.to(out.device)
        gids, gsc = self._gids[j], self._gsc[j]
        staged = self.store.staging is not None          # the stager takes every depth's; the VRAM prefetch the last's
        m = self.model
        for d, jj in enumerate(self.targets(j)):
            if not staged and d + 1 != self.depth:
                continue
            if self.store.kernels:                       # two launches (kernels.gate), straight into the guess row
                layer = m.moe[jj]
                lookahead_gate(out[0], layer.post_norm, m.cfg.rms_eps, layer.router, self._gate_logits, gids[d],
                               gsc[d])
                continue
            ids, w = m.route(jj, out)
            gids[d, :ids.shape[1]].copy_(ids[0])
            gsc[d, :w.shape[1]].copy_(w[0])
        return gids, gsc

    def check(self) -> None:
        """After a token reached the host: raise the NVMe stager's first error (one line), if any."""
        if self.store.staging is not None:
            self.store.staging.check()

    def sync_replay(self) -> None:
        """Before a device-loop step (host): the device cursor follows the host replay where host work moved it
        (prefill), and the host replay is advanced past the token the step runs (bookkeeping, no device work)."""
        r = self.replay
        if r is None or not self.staged:
            return
        if r._next != self._host_next:
            self._cursor.fill_(r._next % r.n_tokens)
        r.t, r._next, r._m = r._next, r._next + 1, 1
        self._host_next = r._next

    def replay_rows(self) -> None:
        """(device, start of a step) The step's replayed ids and weights of every layer, [L, 1, k], at the cursor."""
        if self.staged:
            self._rid = self._rid_all.index_select(0, self._cursor)[0].unsqueeze(1)
            self._rw = self._rw_all.index_select(0, self._cursor)[0].unsqueeze(1)
            if hasattr(self, "_ghint_all"):
                self._ghint = self._ghint_all.index_select(0, self._cursor)[0]
                self._gscore = self._gscore_all.index_select(0, self._cursor)[0]
            self._stepping = True

    def advance_replay(self) -> None:
        """(device, end of a step) The cursor to the next token's row."""
        if self.staged:
            self._cursor.add_(1).remainder_(self._rid_all.shape[0])
            self._stepping = False

    # the pieces of a decode call (engine.graphed runs `moe` inside a CUDA graph, the rest between graphs)
    def round_trip(self, j: int, m: int, topk_ids: torch.Tensor,
                   topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's one device-to-host copy of the router's ids (replayed ids instead, when replaying:
        the router's still make the round trip). Returns (ids on the host, ids, weights) for the MoE call."""
        self.give_hints()                     # while the GPU runs this layer's attention and router
        t0 = time.perf_counter()
        ids = self._ids_to_host(topk_ids)
        if self.replay is not None:
            ids, w = self.replay.route(j, m, "cpu")
            topk_ids, topk_weights = ids.to(topk_ids.device), w.to(topk_ids.device)
        self.host_sync_s += time.perf_counter() - t0
        self.syncs += 1
        return ids, topk_ids, topk_weights

    def _ids_to_host(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """The router's ids on the host. While prefetches wait in the store's pump, the main thread keeps
        putting their chunks on the copy stream until the ids have landed (polling the copy's event, the
        interpreter lock given up between polls), instead of blocking with the link idle."""
        tr = self.store.transfers
        if not (self.cuda and tr.pumping()):
            return topk_ids.cpu()
        if self._ids_host is None or self._ids_host.shape != topk_ids.shape or self._ids_host.dtype != topk_ids.dtype:
            self._ids_host = torch.empty(topk_ids.shape, dtype=topk_ids.dtype, pin_memory=True)
        self._ids_host.copy_(topk_ids, non_blocking=True)
        self._ids_event.record()
        while not self._ids_event.query():
            if not tr.pumping():
                self._ids_event.synchronize()
                break
            tr.pump()
            time.sleep(0)
        return self._ids_host.clone()

    def prepare(self, j: int, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        """One token's routed experts of MoE layer j resident: (ids, weights, offsets row) for `moe`."""
        ids, topk_ids, topk_weights = self.round_trip(j, 1, topk_ids, topk_weights)
        t1 = time.perf_counter()
        store = self.store
        offs = store.ensure(j, list(dict.fromkeys(ids.flatten().tolist())))    # slot order, each expert once
        if store.opt.poison:
            store.check_routed(j, ids)
        self.moe_s += time.perf_counter() - t1
        return topk_ids, topk_weights, offs

    def moe(self, j: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
            offs: torch.Tensor) -> torch.Tensor:
        """The fused MoE call over the arena (graph-safe: no host sync, no allocation in the kernels)."""
        return fused_moe(x, topk_ids, topk_weights, self.store.arena, offs, self.store.formats[j], self.hidden,
                         self.intermediate, backend=self.backend)

    def chunk(self, j: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """Several tokens (prefill): the chunk's experts in waves (`store.waves`), `fused_moe` per wave with
        the other waves' ids skipped (-1), the partial outputs summed."""
        if self.store.prefetch is not None:
            self.store.prefetch.before_prefill()
        ids, topk_ids, topk_weights = self.round_trip(j, x.shape[0], topk_ids, topk_weights)
        t1 = time.perf_counter()
        out = torch.zeros_like(x)
        skip = torch.full_like(topk_ids, -1)
        for wave in self.store.waves(j, ids.flatten().tolist()):
            masked = torch.where(wave.mask[topk_ids], topk_ids, skip)
            out += self.moe(j, x, masked, topk_weights, wave.offsets)
        self.moe_s += time.perf_counter() - t1
        return out

    # ---- lookahead ---------------------------------------------------------------------------------
    def after_moe(self, j: int, out: torch.Tensor) -> None:
        """MoE layer j's output [M, H] (decode only): hints for layers j+1..j+depth from their gates."""
        if out.shape[0] == 1:
            self.send_hints(j, self.lookahead(j, out))

    def targets(self, j: int) -> list[int]:
        """The MoE layers MoE layer j's output gives hints for."""
        return list(range(j + 1, min(self.store.n_layers, j + 1 + self.depth))) if self.depth else []

    def lookahead(self, j: int, out: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The gates of MoE layers j+1..j+depth on out [1, H] (device work only, graph-safe): [(ids [1, k],
        weights [1, k])]; none when replaying (the replay gives the hints)."""
        if self.replay is not None:
            return []
        return [self.model.route(jj, out) for jj in self.targets(j)]

    def send_hints(self, j: int, routed: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Queue the hints of MoE layer j's lookahead (from the replay, or the gates' `routed`, copied to pinned
        memory on the compute stream without a wait); `give_hints` hands them to the store at the next
        layer's round trip."""
        targets = self.targets(j)
        if not targets:
            return
        if self.replay is not None:
            for d, jj in enumerate(targets, 1):
                ids, scores = self.replay.hint(j, d)
                self.store.hint(jj, ids, scores, depth=d)
            return
        if not self.cuda:
            self._hints.append((targets, torch.stack([torch.stack([i[0].float(), w[0].float()]) for i, w in routed]),
                                None))
            return
        buf = self._ring[self._ring_i]
        self._ring_i = (self._ring_i + 1) % len(self._ring)     # given every layer: never reused in flight
        for d, (ids, w) in enumerate(routed):
            buf[d, 0].copy_(ids[0], non_blocking=True)
            buf[d, 1].copy_(w[0], non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._hints.append((targets, buf, ev))

    def give_hints(self) -> None:
        """Give the store the hints queued since the last call (their prefetches are issued from this thread:
        no hint thread competing with it for the interpreter lock). Called at each round trip before the
        router's ids are read: the GPU is then running the layer's attention and router, and the hints'
        copies, queued before them, have landed or are about to."""
        if not self._hints:
            return
        t0 = time.perf_counter()
        for targets, buf, ev in self._hints:
            if ev is not None:
                ev.synchronize()
            for d, jj in enumerate(targets, 1):
                self.store.hint(jj, buf[d - 1, 0].long().tolist(), buf[d - 1, 1].tolist(), depth=d)
        self._hints.clear()
        self.hints_s += time.perf_counter() - t0

    def close(self) -> None:
        self._hints.clear()
