"""The routed-expert call on the tiered store: `engine.experts.Experts` for the engine's model.

    experts = StoreExperts(store, hidden, intermediate, depth=plan.prefetch_depth)
    model = MoEModel.load(folder, experts, context, device)
    model.after_moe = experts.after_moe          # router lookahead (omit for the on-demand / LRU-only runs)
    experts.model = model

One token (decode, `read_in_place`): graph-safe, no host part. The routed ids are counted on the device
(`store.count_uses`) and `fused_moe` reads the table `store.inplace_offsets[j]`: static experts in VRAM, the rest in
place from pinned RAM (with cache slots the device LRU first admits misses into their slots, `store.cache_decide` /
`cache_fill`). With a replay (`engine.replay`: the data movement is real, the text is not) the whole replay lives on
the device and the step reads its row at a device cursor (`replay_rows`, `advance_replay`). With lookahead
(`store.prefetch`, engine/prefetch.py) a layer first reads the guesses that landed in VRAM slots (`resolve`) and
frees its slots after its MoE (`release`); after it, `after_moe` runs the gates of layers j+1..j+d (`model.route`,
the definition of core/routing/TRACE.md; with the kernels `kernels.gate`, two launches a gate) and issues the guesses
for layer j+d on a side stream (joined after the last MoE layer: `DevicePrefetch.end_token`). With an NVMe tier
(`store.staging`, engine/staging.py) each layer asks the stager for its routed NVMe experts and waits on the GPU only
for those not yet staged in pinned RAM (`Staging.wait`); after the layer (with lookahead: with its gates' guesses)
it tells the stager it is done (`Staging.done`).

Several tokens (prefill, `chunk`): the router's ids come to the host, the chunk's experts go through the VRAM slots
in waves (`store.waves`), `fused_moe` per wave with the ids of the other waves skipped (-1), the partial outputs
summed.
"""
from __future__ import annotations

import torch

from strata_plan.kernels.gate import lookahead_gate
from strata_plan.kernels.ops import fused_moe


class StoreExperts:
    def __init__(self, store, hidden: int, intermediate: int, depth: int = 0, backend: str = "auto", replay=None):
        self.store, self.hidden, self.intermediate, self.backend = store, hidden, intermediate, backend
        self.skip_moe = False                 # timing only: the MoE call left out (`DeviceDecode.time_parts`)
        self.staged = False                   # replayed ids come from the device copy of the replay
        self.depth = depth
        self.model = None
        self.replay = replay                  # engine.replay.Replay or None
        if replay is not None:                # the replay on the device: [T, L, k] ids and weights, a cursor
            dev = store.device
            self._rid_all = torch.from_numpy(replay.experts.astype("int64")).to(dev)
            self._rw_all = torch.from_numpy(replay.weights.astype("float32")).to(dev)
            self._cursor = torch.zeros(1, dtype=torch.int64, device=dev)
            self._host_next = -1              # the host replay's cursor the device one was last set from
            self._rid = self._rw = None
            if depth:                         # its lookahead guesses too: [T, L, D, W]
                g, sc = replay.hint_table(depth, 2 * store.top_k)
                self._ghint_all, self._gscore_all = torch.from_numpy(g).to(dev), torch.from_numpy(sc).to(dev)
        elif depth:                           # the gates' guesses, written in place each layer
            L = store.n_layers
            self._gids = torch.full((L, depth, 2 * store.top_k), -1, dtype=torch.int64, device=store.device)
            self._gsc = torch.zeros((L, depth, 2 * store.top_k), dtype=torch.float32, device=store.device)
            self._gate_logits = torch.empty(store.E, dtype=torch.float32, device=store.device)
        self._stepping = False                # inside a step reading the device replay
        self._early = None                    # (gids, gscores) `before_moe` took for the layer running now

    # ---- the Experts interface -------------------------------------------------------------------
    def __call__(self, j: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 1:
            return self.chunk(j, x, topk_ids, topk_weights)
        return self.read_in_place(j, x, topk_ids, topk_weights)

    def read_in_place(self, j: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """One token's MoE call of layer j: static experts from the arena, the rest from pinned
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
        if prefetch is not None and store.lru is not None:     # guesses that landed in VRAM slots are read there,
            prefetch.resolve_step(j, topk_ids)                 # then the LRU's step: one launch
        elif prefetch is not None:
            prefetch.resolve(j, topk_ids)
            store.count_uses(j, topk_ids)
        elif store.lru is not None:           # the LRU on the device: hits, admissions, evictions
            store.cache_decide(j, topk_ids)
        else:
            store.count_uses(j, topk_ids)
        if staging is not None:               # NVMe experts (admitted ones too): wait only for what is not staged
            staging.wait(j, topk_ids, *(self._early or ()))      # (`early`: the guesses taken at the router)
        if store.lru is not None:             # admitted experts copied into their slots
            store.cache_fill(j, topk_ids)
        out = self.moe(j, x, topk_ids, topk_weights, self.store.inplace_offsets[j])
        if staging is not None and not staging.depth:
            staging.done(j)                   # its staged experts may be evicted once this layer's kernels ran
        return out

    def before_moe(self, j: int, h: torch.Tensor) -> None:
        """With lookahead taken at the router (`Staging.early`, one token): the gates of layers j+1..j+depth on layer
        j's residual after attention, into the guess buffers layer j's request carries to the stager
        (`read_in_place`), and that the VRAM prefetch takes after the layer (graph-safe)."""
        self._early = self._guesses(j, h) if h.shape[0] == 1 and not self.skip_moe else None

    def after_moe(self, j: int, out: torch.Tensor) -> None:
        """With lookahead (one token): the gates of layers j+1..j+depth on layer j's output (or the replay's
        guesses, on the device) go to the stager with layer j's end (an NVMe tier; `early`: those `before_moe` took
        went with the request), and the guesses for layer j+depth to the VRAM prefetch (graph-safe)."""
        if out.shape[0] != 1 or self.skip_moe:        # (timing the step without MoE: without its lookahead too)
            return
        pf, k, L = self.store.prefetch, self.store.top_k, self.store.n_layers
        staging = self.store.staging
        if staging is not None:
            if staging.early:                         # taken at the router (`before_moe`), sent with the request
                gids = self._early[0]
                staging.done(j)
            else:                                     # the stager takes every depth's guesses with the layer's end
                gids, gsc = self._guesses(j, out)
                staging.done(j, gids, gsc)
            if pf is not None and j + self.depth < L:
                pf.issue(j + self.depth, gids[self.depth - 1, :k], after=j)
        elif pf is not None and j + self.depth < L:   # VRAM lookahead alone: its gate runs on the side stream too
            pf.issue(j + self.depth, lambda: self._guesses(j, out)[0][self.depth - 1, :k], reads=out, after=j)
        if pf is not None and j == L - 1:
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

    def sync_replay(self, n: int = 1) -> None:
        """Before a device-loop launch of n steps (host): the device cursor follows the host replay where host work
        moved it (prefill), and the host replay is advanced past the tokens the launch runs (bookkeeping, no device
        work)."""
        r = self.replay
        if r is None or not self.staged:
            return
        if r._next != self._host_next:
            self._cursor.fill_(r._next % r.n_tokens)
        r.t, r._next, r._m = r._next, r._next + n, n
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

    def moe(self, j: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
            offs: torch.Tensor) -> torch.Tensor:
        """The fused MoE call over the arena (graph-safe: no host sync, no allocation in the kernels)."""
        return fused_moe(x, topk_ids, topk_weights, self.store.arena, offs, self.store.formats[j], self.hidden,
                         self.intermediate, backend=self.backend)

    def chunk(self, j: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """Several tokens (prefill): the router's ids to the host (replayed ids instead, when replaying), the chunk's
        experts in waves (`store.waves`), `fused_moe` per wave with the other waves' ids skipped (-1), the partial
        outputs summed."""
        if self.store.prefetch is not None:
            self.store.prefetch.before_prefill()
        if self.replay is not None:
            ids, w = self.replay.route(j, x.shape[0], "cpu")
            topk_ids, topk_weights = ids.to(topk_ids.device), w.to(topk_ids.device)
        else:
            ids = topk_ids.cpu()
        out = torch.zeros_like(x)
        skip = torch.full_like(topk_ids, -1)
        for wave in self.store.waves(j, ids.flatten().tolist()):
            masked = torch.where(wave.mask[topk_ids], topk_ids, skip)
            out += self.moe(j, x, masked, topk_weights, wave.offsets)
        return out

    def targets(self, j: int) -> list[int]:
        """The MoE layers MoE layer j's output guesses for."""
        return list(range(j + 1, min(self.store.n_layers, j + 1 + self.depth))) if self.depth else []
