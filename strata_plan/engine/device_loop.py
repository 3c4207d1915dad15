"""The device loop: a whole decode token in one CUDA graph, no host work between layers.

    runner = DeviceDecode(model, experts)       # Engine.open installs it (unless graphs=False)
    logits = model.decode_step(token)           # eager first step, captured at the second, replayed after
    nxt = model.decode_step(token, greedy=True) # the same step with its argmax inside the graph: int64 [1]
    nxt = model.decode_step(token, pick=GumbelPick(0.7, 0.9, seed=1))   # a sampled token, in the graph
    runner.time_parts(reps=20)                  # GPU seconds of a step, and of the step without its MoE calls

It runs every plan (the engine runs one GPU): routed experts static in VRAM, in the device LRU's slots,
read in place from pinned RAM, or staged there from NVMe (`store_experts.StoreExperts.read_in_place`); the cache and
the lookahead are decided on the device, so the host has nothing to decide between layers. Per token it replays one
graph: the embedding row (gathered in place from pinned RAM by `kernels.gather` when the table lives there:
`embed_in_place`; from VRAM by the step too), every decoder layer, router, fused MoE, shared expert, the lm_head and,
with a pick (greedy: the argmax; sampling: `generate.GumbelPick`, a graph of each), the next token (`engine.picks`),
written into the step's own input buffer: fed back, the next step needs no host copy. The step also advances the
position `model.at` on the device, so the host launches one graph a token and nothing else (the token's copy to the
host aside). When replaying routing, the replay lives on the device and the step reads its row at a device cursor it
advances (`StoreExperts.replay_rows`, `advance_replay`); the host only keeps its own cursor in step
(`sync_replay`). Routed uses are counted on the device. On a CPU device, or with `graphs=False`, the same step runs
eagerly (tests hold it to the plain reference loop: `EngineOptions(graphs=False)`, mode on-demand).

`ahead`: the step needs nothing of the token on the host (graphs, and the embedding gathered on the device), so
a caller may queue token t+1's step before reading token t (`generate`, `bench.measure`) through a `TokenRing`:
each sampled id is copied to pinned memory on the stream right after its step, and the host waits (sleeping, a
blocking event) only for that copy, not for the step queued behind it; the GPU runs token after token.
`timing=True` times each step's device work with events; `split()` returns the sums (compute only: no waits).
"""
from __future__ import annotations

import gc
import statistics
import time

import torch

from strata_plan.kernels.gather import gather_rows

from .dense import EMBED
from .picks import GREEDY


class TokenRing:
    """Sampled ids read by the host one launch late: `push(ids)` (a device int64 tensor of up to `width` ids: a
    step's token, or a block's) queues their copy into pinned memory behind the work so far; `pop()` waits for the
    oldest pushed copy alone (a blocking event: the thread sleeps, so its CPU time is work) and returns its ids as a
    list of ints. `poll_s`: wait instead by sleeping that long between queries of the event (a diagnostic: whether
    the driver's blocking wait costs the thread CPU time). On a CPU device (`cuda=False`) the ids are read at once."""

    def __init__(self, n: int = 4, width: int = 1, poll_s: float | None = None, cuda: bool = True):
        self.poll_s, self.cuda = poll_s, cuda
        self._cpu: list[list[int]] = []
        if not cuda:
            return
        self.host = torch.empty((n, width), dtype=torch.int64, pin_memory=True)
        self._slots = [self.host[i] for i in range(n)]           # views made once: a push is one copy launch
        self._ids = self.host.numpy()                             # read without a tensor op
        self._n = [0] * n                                         # ids pushed into each slot
        self.events = [torch.cuda.Event(blocking=True) for _ in range(n)]
        self.head = self.size = 0

    def push(self, ids: torch.Tensor) -> None:
        if not self.cuda:
            self._cpu.append(ids.reshape(-1).tolist())
            return
        if self.size == len(self.events):
            raise RuntimeError("TokenRing is full: pop before pushing more")
        i = (self.head + self.size) % len(self.events)
        n = ids.numel()
        self._slots[i][:n].copy_(ids.reshape(n), non_blocking=True)
        self._n[i] = n
        self.events[i].record()
        self.size += 1

    def pop(self) -> list[int]:
        if not self.cuda:
            return self._cpu.pop(0)
        i = self.head
        if self.poll_s is None:
            self.events[i].synchronize()
        else:
            while not self.events[i].query():
                time.sleep(self.poll_s)
        self.head, self.size = (i + 1) % len(self.events), self.size - 1
        return self._ids[i, :self._n[i]].tolist()


class DeviceDecode:
    def __init__(self, model, experts, graphs: bool = True, tokens_per_graph: int = 1):
        self.m, self.ex = model, experts
        self.graphs = graphs and model.device.type == "cuda"
        self.k = max(1, int(tokens_per_graph))   # decode tokens a launch runs (`block`): the host's work a launch
        #                                          is shared by that many tokens
        self.x0 = torch.zeros((1, model.cfg.hidden), dtype=model.dtype, device=model.device)   # the token's row
        self.tok = torch.zeros(1, dtype=torch.long, device=model.device)    # the step's input; a pick's output too
        self.toks = torch.zeros(self.k, dtype=torch.long, device=model.device)   # a block's tokens, in order
        # inputs that already hold `tok`'s value (a step's pick, a block's last token): fed back, no copy
        self._fed = {self.tok.data_ptr()}
        self.owns_at = True                  # the step advances `model.at` itself (the host writes it only on a jump)
        self._at: int | None = None          # the position `model.at` holds on the device (None: unknown)
        self._events: list = []              # timing event pairs free for reuse
        self._embed_at: int | None = None      # embed_in_place: the table's byte offset from the arena
        self.dense_step_bytes: dict[str, int] = {}   # dense weights a step reads in place from pinned RAM (counted)
        experts.staged = experts.replay is not None
        self.calls: dict[str, int] = {}      # steps run, by variant ("step": logits; a pick's key: the next token)
        self.picks = True                    # the model may ask for the next token inside the step
        self._counters: dict[str, torch.Tensor] = {}   # per sampling key: the draw counter its graph advances
        self._picks: dict = {}               # the variants run, by key ("step": None), for `time_parts`
        self.launch_s = 0.0                  # host time launching steps (graph replays or eager launches)
        self._graphs: dict[str, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.timing = False
        self._pending: list = []             # timed steps' (start, end) event pairs not read yet
        self._split = self._zero()
        self.spent = False                   # `time_parts` ran: no more steps

    def release(self) -> None:
        """Free the captured graphs (and their memory pools) now, in the calling thread (`Engine.close`)."""
        for g, _ in self._graphs.values():
            g.reset()
        self._graphs.clear()
        self._pending.clear()
        self._events.clear()

    @property
    def ahead(self) -> bool:
        return self.graphs and self.blocks

    @property
    def blocks(self) -> bool:
        """The step needs nothing from the host between steps (its embedding row gathered on the device, or the
        step run eagerly): steps may be chained in one launch (`k` > 1), and with graphs queued before the host
        reads the last token (`ahead`)."""
        return not self.graphs or self._embed_at is not None or self.m.embed_rows is None

    def embed_in_place(self, address: int | None) -> None:
        """The embedding table is in registered pinned RAM at device `address`: the graphed step gathers the
        token's row there itself (None: the model gathers it before the step)."""
        if address is not None and self.graphs and self.m.embed.element_size() == 2:
            self._embed_at = address - self.ex.store.arena.data_ptr()

    # ---- the step (device work only) -------------------------------------------------------------------
    def _step(self, pick=None) -> torch.Tensor:
        m = self.m
        self.ex.replay_rows()
        if self._embed_at is not None:
            gather_rows(self.ex.store.arena, self._embed_at, self.tok, self.x0)
        elif m.embed_rows is None or not self.graphs:    # the table in VRAM, or an eager step: gathered in it
            self.x0.copy_(m.embed_tokens(self.tok))
        x = self.x0
        for layer in m.layers:
            x = m._layer(layer, x, 0, m.at)
        self.ex.advance_replay()
        m.at.add_(1)                         # the next step's position
        logits = m.logits(x[-1])
        if pick is None:
            return logits
        return self.tok.copy_(pick(logits))  # the next step's input already in place: no host copy between steps

    def _block(self, pick, n: int) -> torch.Tensor:
        """n steps one after the other, each picking the next one's input (`tok`); their tokens int64 [n]."""
        for i in range(n):
            self.toks[i:i + 1].copy_(self._step(pick))
        return self.toks[:n]

    def _work(self, pick, n: int) -> torch.Tensor:
        return self._step(pick) if n == 1 else self._block(pick, n)

    def _run(self, key: str, mode: str, pick=None, n: int = 1) -> torch.Tensor:
        if mode == "eager":
            return self._work(pick, n)
        if mode == "capture":
            g = torch.cuda.CUDAGraph()
            # no garbage collection inside a capture (`torch.cuda.graph` collects before it): a collection an
            # allocation set off mid-capture aborted the process once (H100, test_engine_run's streamed-dense GPU
            # test, 2026-12-05; what it freed is not known), and finalizers have no place in a captured step
            collecting = gc.isenabled()
            gc.disable()
            try:
                with torch.cuda.graph(g, capture_error_mode="thread_local"):
                    out = self._work(pick, n)
            finally:
                if collecting:
                    gc.enable()
            self._graphs[key] = (g, out)
        g, out = self._graphs[key]
        g.replay()
        return out

    def __call__(self, token_ids: torch.Tensor, pick=None, n: int = 1) -> torch.Tensor:
        """One token [1] (on the device) at the model's position `model.pos`; float32 logits [V] (the caller's own
        tensor), or with a pick the next token int64 [1] in the runner's input buffer `tok`: fed back as the next
        step's token it needs no copy, and the next step rewrites it (copy it to keep it). With a pick and n > 1
        (at most `k`), a block: n steps in one launch, each fed the one before's token; their tokens int64 [n] in
        `toks` (its last fed back needs no copy either). The device's position `model.at` is advanced by the step
        itself; the host writes it only when `model.pos` jumped (prefill, reset). Each variant (pick and n) is run
        eagerly at its first call, captured at its second, replayed after."""
        if self.spent:
            raise RuntimeError("time_parts ran on this engine: its decode state is a timing run's; open it again")
        if n > 1 and (pick is None or n > self.k or not self.blocks):
            raise ValueError(f"a block of {n} steps needs a pick, at most {self.k} steps (tokens_per_graph) and the "
                             "embedding gathered in the step")
        key = pick.key if pick is not None else "step"
        self._picks.setdefault(key, pick)
        key = key if n == 1 else f"{key}x{n}"
        if getattr(pick, "counter", False) is None:    # a fresh sampler: its key's counter (the graph reads it), from 0
            pick.counter = self._counters.setdefault(key, torch.zeros(1, dtype=torch.int64, device=self.m.device))
            pick.counter.zero_()
        runs = self.calls.get(key, 0)
        mode = "eager" if not self.graphs or runs == 0 else ("capture" if runs == 1 else "replay")
        self.calls[key] = runs + 1
        self._collect(wait=False)            # timed steps that ended: never a wait (the next step is queued ahead)
        t0 = time.perf_counter()
        self.ex.sync_replay(n)
        if self.ex.store.prefetch is not None:
            self.ex.store.prefetch.join()     # eager work (prefill) left the side stream forked: join it here
        counted = self.ex.store.counters.dense_bytes
        if self._at != self.m.pos:           # prefill or a reset moved the position: the device's copy follows
            self.m.at.fill_(self.m.pos)
        self._at = self.m.pos + n
        if token_ids.data_ptr() not in self._fed:           # not the last pick fed back: copy it in
            self.tok.copy_(token_ids.reshape(1), non_blocking=True)
        if self._embed_at is None and self.m.embed_rows is not None and self.graphs:
            self.x0.copy_(self.m.embed_tokens(self.tok))     # rows the host gathers (engine.dense): before the graph
        elif self._embed_at is not None:
            counted[EMBED] += n * self.x0.numel() * self.x0.element_size()
        for kind, b in self.dense_step_bytes.items():                  # streamed dense weights read in place
            counted[kind] += n * b
        timed = self.timing and self.graphs
        if timed:                            # blocking events: a wait for them sleeps (no spinning thread)
            ev = self._events.pop() if self._events else tuple(
                torch.cuda.Event(enable_timing=True, blocking=True) for _ in range(2))
            ev[0].record()
        out = self._run(key, mode, pick, n)
        if timed:
            ev[1].record()
            self._pending.append((*ev, n))
        self.launch_s += time.perf_counter() - t0
        self._fed = {self.tok.data_ptr()} | ({self.toks[n - 1].data_ptr()} if n > 1 else set())
        if pick is not None:
            return out                       # `tok` or `toks`: rewritten by the next launch (copy it to keep it)
        return out.clone() if mode != "eager" else out

    # ---- timing ------------------------------------------------------------------------------------------
    def _zero(self) -> dict:
        return {"compute_s": 0.0, "wait_s": 0.0, "idle_s": 0.0, "steps": 0, "layer_compute_s": [],
                "layer_wait_s": [], "layer_idle_s": []}

    def _collect(self, wait: bool) -> None:
        """Add the timed steps that ended (`wait`: all of them, sleeping until they do) to the split."""
        while self._pending and (wait or self._pending[0][1].query()):
            a, b, n = self._pending.pop(0)
            b.synchronize()
            self._split["compute_s"] += a.elapsed_time(b) / 1e3
            self._split["steps"] += n
            self._events.append((a, b))

    def split(self) -> dict:
        """Device seconds of the timed steps since the last call (the step's graph, from its launch to its end;
        nothing waits inside it), and how many steps they were (a block counts its steps)."""
        self._collect(wait=True)
        out, self._split = self._split, self._zero()
        return out

    @torch.inference_mode()                  # as the model's decode steps (a pick's counter is an inference tensor)
    def time_parts(self, reps: int = 20) -> dict:
        """Median GPU seconds of one decode step replayed as a graph (`step_s`: the greedy variant when it was
        run, else a sampling one that was, else the logits one), and of the same step captured with its MoE calls
        left out (`without_moe_s`: attention, routers, shared experts, dense layers, lm_head; no lookahead gates):
        t_nonMoE of the bound 1 / (t_nonMoE + B / R_zc); `*_replay_cpu_s`: the host's CPU time launching each graph.
        CUDA only, after a captured step, and last: the replays
        rewrite the last position's KV entries (without MoE: with other values), move the cache, the replay cursor
        and the counters, so the runner refuses further steps (read the counters first; open the engine again)."""
        picked = [p for p in self._picks.values() if p is not None]     # the variants decoded (a pick's key: tokens)
        pick = GREEDY if GREEDY.key in self._picks else (picked[0] if picked else None)
        base = pick.key if pick is not None else "step"
        if base not in self._graphs and not any(k.startswith(f"{base}x") for k in self._graphs):
            raise RuntimeError("time_parts needs a captured step: decode two tokens first")
        if base not in self._graphs:         # only blocks were run: one step of the same variant, captured here
            self._run(base, "capture", pick)
        bare = f"{base}_without_moe"
        if bare not in self._graphs:
            self.ex.skip_moe = True
            try:
                self._run(bare, "capture", pick)
            finally:
                self.ex.skip_moe = False
        torch.cuda.synchronize()
        self.spent = True
        last = max(0, self.m.pos - 1)        # each replay advances the device's position: put it back each time
        out = {}
        for key, graph in (("step", base), ("without_moe", bare)):
            g = self._graphs[graph][0]
            for _ in range(3):
                self.m.at.fill_(last)
                g.replay()
            times, cpu = [], []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                self.m.at.fill_(last)
                a.record()
                c0 = time.thread_time()
                g.replay()
                cpu.append(time.thread_time() - c0)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            out[f"{key}_s"] = statistics.median(times)
            out[f"{key}_replay_cpu_s"] = statistics.median(cpu)     # host CPU time of the graph launch alone
        return out
