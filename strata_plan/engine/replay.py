"""Routing replay: the engine's data movement on a model without trained weights.

    r = Replay.from_prior("olmoe-like", n_layers, n_experts, top_k, tokens=4096, seed=1)
    r = Replay.from_trace("trace.npz", spec)
    StoreExperts(..., replay=r)

`route(j, M)` replaces MoE layer j's router output with the next M tokens' replayed ids (and their gate
weights); the cursor advances when layer 0 is routed. `hint(j, d)` gives the lookahead hint for layer j+d
of the current token, drawn at the statistics' precision P_d and recall R_d: each of the token's true
ids is guessed with probability R_d, and wrong guesses (drawn from the layer's popularity, outside the
true ids) are added until right / guesses = P_d in expectation. The hints are drawn from their own
random stream (seeded apart from the routing sample and from the sample the plan's statistics came
from); the engine itself never sees an id before the router gives it. Hit rates measured on a replay are
properties of the replayed routing and of these P_d, R_d: the benchmark labels them inputs, not
measurements of a model. The data movement (reads, copies, kernels on the arena) is real; the text is not.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Replay:
    experts: np.ndarray                      # int [T, L, k], most weight first
    weights: np.ndarray                      # float32 [T, L, k]
    lookahead: dict[int, tuple[float, float]]   # depth -> (precision, recall)
    seed: int = 1
    source: str = ""

    def __post_init__(self) -> None:
        T, L, _ = self.experts.shape
        self.t, self._next, self._m = 0, 0, 1          # first row of the tokens being run, the next one, how many
        self._rng = np.random.default_rng(self.seed + 7919)     # hints: a stream of their own
        counts = np.stack([np.bincount(self.experts[:, j].ravel(), minlength=int(self.experts.max()) + 1)
                           for j in range(L)]).astype(np.float64)
        self.popularity = counts / counts.sum(axis=1, keepdims=True)     # [L, E]

    @property
    def n_tokens(self) -> int:
        return self.experts.shape[0]

    @classmethod
    def from_prior(cls, prior: str, n_layers: int, n_experts: int, top_k: int, tokens: int, seed: int = 1):
        """ids sampled from a named routing prior (ids = popularity ranks, as the plan's statistics of that
        prior number them); P_d, R_d from the prior's lookahead table."""
        from strata_plan.core.routing.priors import load_prior
        from strata_plan.core.routing.sample import sample_experts
        p = load_prior(prior)
        experts, weights, _ = sample_experts(p.zipf_s, p.locality, n_layers, n_experts, top_k, tokens, seed=seed,
                                             permute=False)
        la = {x.depth: (x.precision, x.recall) for x in p.lookahead}
        return cls(experts, weights, la, seed, f"prior {prior}, seed {seed}")

    @classmethod
    def from_trace(cls, path, spec, stats=None, seed: int = 1):
        """ids from a routing trace (`.npz`); P_d, R_d from `stats` (RoutingStats) or the trace's own
        lookahead arrays' figures."""
        from strata_plan.core.routing import load_trace
        from strata_plan.core.routing.compute import compute_stats
        tr = load_trace(path, spec)
        st = stats or compute_stats(tr)
        la = {x.depth: (x.precision, x.recall) for x in st.lookahead}
        return cls(tr.experts, tr.weights, la, seed, f"trace {path}")

    def route(self, j: int, m: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The current m tokens' ids int64 [m, k] and weights float32 [m, k] for MoE layer j; routing layer 0
        starts the next m tokens."""
        if j == 0:
            self.t, self._next = self._next, self._next + m
            self._m = m
        rows = [(self.t + i) % self.n_tokens for i in range(self._m)]
        ids = torch.from_numpy(self.experts[rows, j].astype(np.int64))
        w = torch.from_numpy(self.weights[rows, j].astype(np.float32))
        return ids.to(device), w.to(device)

    def hint_table(self, depth: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Every token's guesses for the device loop: ids int64 [T, L, depth, width] (-1 padded, past the last
        layer -1) and scores float32 (popularity), drawn as `hint` draws them (their own seeded stream, so a
        table is the same for the same replay), the first `width` guesses of each."""
        T, L, _ = self.experts.shape
        ids = np.full((T, L, depth, width), -1, dtype=np.int64)
        scores = np.zeros((T, L, depth, width), dtype=np.float32)
        saved_t, saved_rng = self.t, self._rng
        self._rng = np.random.default_rng(self.seed + 104729)
        try:
            for t in range(T):
                self.t = t
                for j in range(L):
                    for d in range(1, depth + 1):
                        if j + d >= L:
                            break
                        g, sc = self.hint(j, d)
                        ids[t, j, d - 1, :len(g[:width])] = g[:width]
                        scores[t, j, d - 1, :len(sc[:width])] = sc[:width]
        finally:
            self.t, self._rng = saved_t, saved_rng
        return ids, scores

    def hint(self, j: int, d: int) -> tuple[list[int], list[float]]:
        """Lookahead guesses for MoE layer j+d of the current token, at (P_d, R_d); scores: popularity."""
        P, R = self.lookahead.get(d, (0.0, 0.0))
        truth = self.experts[self.t % self.n_tokens, j + d]
        right = [int(e) for e in truth if self._rng.random() < R]
        n_wrong = len(right) * (1 - P) / P if P > 0 else 0.0
        n_wrong = int(n_wrong) + (self._rng.random() < n_wrong - int(n_wrong))
        pop = self.popularity[j + d].copy()
        pop[truth] = 0.0
        wrong = []
        if n_wrong and pop.sum() > 0:
            wrong = self._rng.choice(len(pop), size=min(n_wrong, int((pop > 0).sum())), replace=False,
                                     p=pop / pop.sum()).tolist()
        guesses = right + wrong
        scores = [float(self.popularity[j + d, e]) for e in guesses]
        return guesses, scores
