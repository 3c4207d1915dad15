"""The fast decode loop: each layer's static parts in CUDA graphs, one host round trip per MoE layer.

    runner = GraphedDecode(model, experts)      # Engine.open installs it: model.step_runner = runner
    logits = model.decode_step(token)           # static step (position in model.at); graphs from the 2nd token

A decode token is cut at the host round trips (the router's ids must reach the host before the store can
make the experts resident), into segments whose shapes and addresses never change:

    head_0   the decoder layers before MoE layer 0, its attention and router (from the token's
             embedding row, gathered eagerly: the table may live in pinned RAM, engine.dense)
    tail_j   fused MoE of MoE layer j (reads the arena through offsets[j]), residual + shared experts,
             the lookahead gates of layers j+1..j+d on the output
    head_j+1 the dense layers after MoE layer j, the attention and router of MoE layer j+1
    final    the decoder layers after the last MoE layer, the final norm and lm_head

Between segments the host does only the store's part: after head_j the round trip and `ensure` (copies
queued, the compute stream made to wait for them, offsets[j] written on the stream), after tail_j `release`
and the lookahead's ids queued for the host (given to the store at the next round trip). The first step runs the segments eagerly (kernels compile, scratch is allocated), the
second captures each segment into its own CUDA graph just before its first replay, later steps replay.
On a CPU device, or with `graphs=False`, the segments run eagerly in the same order (tests hold this
loop to the model's own forward, which stays the plain reference).

Host time spent launching segments (graph replays, or eager launches) is summed in `launch_s`. With
`timing=True` (CUDA) events on the compute stream split each step's device time per MoE layer into
compute (head and tail segments), waiting (from the router's end to the tail's start: the round trip,
the store's work and the copies not yet landed) and idle (from the tail's end to the next segment's
launch: the host was still busy with `release` and queueing the hints; their small copies to the host
land there too); `split()` returns the sums since the last call.
"""
from __future__ import annotations

import time

import torch


class GraphedDecode:
    def __init__(self, model, experts, graphs: bool = True):
        self.m, self.ex = model, experts
        self.graphs = graphs and model.device.type == "cuda"
        self.x0 = torch.zeros((1, model.cfg.hidden), dtype=model.dtype, device=model.device)   # the token's row
        cfg = model.cfg
        moe = list(cfg.moe_layers)
        starts = [0] + [i + 1 for i in moe[:-1]]
        self.heads = [model.layers[a:b + 1] for a, b in zip(starts, moe)]   # dense layers, then the MoE layer
        self.rest = model.layers[moe[-1] + 1:]
        self.calls = 0
        self.launch_s = 0.0
        self._graphs: dict[str, tuple[torch.cuda.CUDAGraph, object]] = {}
        self.timing = False
        n_ev = 4 * len(self.heads) + 3
        self._ev = [torch.cuda.Event(enable_timing=True) for _ in range(n_ev)] if self.graphs else []
        self._split = self._zero()
        self._pending = False

    def _mark(self, i: int) -> None:
        if self.timing and self._ev:
            self._ev[i].record()

    def split(self) -> dict:
        """Device seconds since the last call, summed over timed steps: compute (segments) and waits
        (router end to tail start), in total and per MoE layer (from the end of the previous MoE layer's
        tail to the end of this one's); waits for the last step's events."""
        if self._pending:
            self._collect()
        out, self._split = self._split, self._zero()
        return out

    def _zero(self) -> dict:
        L = len(self.heads)
        return {"compute_s": 0.0, "wait_s": 0.0, "idle_s": 0.0, "steps": 0, "layer_compute_s": [0.0] * L,
                "layer_wait_s": [0.0] * L, "layer_idle_s": [0.0] * L}

    def _collect(self) -> None:
        """Events per MoE layer j (i = 1 + 4j): i before head j's launch, i+1 its router's end, i+2 the tail's
        start (after the store's waits), i+3 the tail's end; 0 the step's start, 4L+1 before the final
        segment, 4L+2 its end. idle: the stream had nothing queued (the host was late launching a segment)."""
        self._pending = False
        ev = self._ev
        ev[-1].synchronize()
        L = len(self.heads)
        sp = self._split
        for j in range(L):
            a, b, c, d = ev[1 + 4 * j:5 + 4 * j]
            prev = ev[0] if j == 0 else ev[4 * j]
            comp, wait, idle = (a.elapsed_time(b) + c.elapsed_time(d)) / 1e3, b.elapsed_time(c) / 1e3, prev.elapsed_time(a) / 1e3
            for key, v in (("compute_s", comp), ("wait_s", wait), ("idle_s", idle)):
                sp[key] += v
                sp["layer_" + key][j] += v
        sp["idle_s"] += ev[4 * L].elapsed_time(ev[4 * L + 1]) / 1e3
        sp["compute_s"] += ev[4 * L + 1].elapsed_time(ev[-1]) / 1e3
        sp["steps"] += 1

    # ---- the segments (device work only) ----------------------------------------------------------------
    def _head(self, j: int, x: torch.Tensor):
        m = self.m
        for layer in self.heads[j][:-1]:
            x = m._layer(layer, x, 0, m.at)
        layer = self.heads[j][-1]
        h, y = m.attention_part(layer, x, 0, m.at)
        ids, w = m.route_layer(layer, h, y)
        return h, y, ids, w

    def _tail(self, j: int, h, y, ids, w, offs):
        layer = self.heads[j][-1]
        out = self.m.moe_output(layer, h, y, self.ex.moe(j, y, ids, w, offs))
        return out, self.ex.lookahead(j, out)

    def _final(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        for layer in self.rest:
            x = m._layer(layer, x, 0, m.at)
        return m.logits(x[-1])

    # ---- running them -------------------------------------------------------------------------------------
    def _run(self, key: str, mode: str, fn):
        t0 = time.perf_counter()
        if mode == "eager":
            out = fn()
        else:
            if mode == "capture":
                g = torch.cuda.CUDAGraph()
                # thread_local: the store's copy and reader threads keep using CUDA while a segment is captured
                with torch.cuda.graph(g, capture_error_mode="thread_local"):
                    out = fn()
                self._graphs[key] = (g, out)
            g, out = self._graphs[key]
            g.replay()
        self.launch_s += time.perf_counter() - t0
        return out

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        """One token [1] (on the device) at the position in `model.at`; float32 logits [V], the caller's
        own tensor (not the graph's output buffer, which the next step overwrites)."""
        mode = "eager" if not self.graphs or self.calls == 0 else ("capture" if self.calls == 1 else "replay")
        self.calls += 1
        ex, store, m = self.ex, self.ex.store, self.m
        if self._pending:
            self._collect()
        self.x0.copy_(m.embed_tokens(token_ids.reshape(1)))    # eager: the rows may come from pinned RAM
        self._mark(0)
        self._mark(1)
        h, y, ids, w = self._run("head0", mode, lambda: self._head(0, self.x0))
        out = None
        L = len(self.heads)
        for j in range(L):
            self._mark(2 + 4 * j)
            rid, rw, offs = ex.prepare(j, ids, w)
            if rid is not ids:                          # replayed routing: into the tail's input tensors
                ids.copy_(rid)
                w.copy_(rw)
            self._mark(3 + 4 * j)
            out, routed = self._run(f"tail{j}", mode, lambda: self._tail(j, h, y, ids, w, offs))
            self._mark(4 + 4 * j)
            store.release(j)
            ex.send_hints(j, routed)
            self._mark(5 + 4 * j)                        # head j+1's launch (or the final segment's)
            if j + 1 < L:
                h, y, ids, w = self._run(f"head{j + 1}", mode, lambda: self._head(j + 1, out))
        logits = self._run("final", mode, lambda: self._final(out))
        if self.timing and self._ev:
            self._mark(len(self._ev) - 1)
            self._pending = True                        # read at the next step or split(): no sync here
        # a replayed graph writes its output into the same tensor every step: the caller gets its own copy
        return logits.clone() if mode != "eager" else logits
