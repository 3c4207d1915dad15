"""Activation statistics from a calibration text, for the quantizer's importance input (`pack --calib`).

    stats = activation_stats("checkpoint/", tokens, chunk=512)       # runs the float32 reference forward
    pack_expert(gate, up, down, fmt, importance=stats.importance(moe_index, expert))

Per MoE layer and routed expert: the mean square of each input feature over the tokens routed to it, for
gate and up (the MoE block's input, [H]) and for down (silu(gate x) * up x, [I]). The quantizer weights
each weight's squared error by its input feature's importance, so precision goes where activations are
large. An expert no calibration token reached gets its layer's statistics over all tokens (gate, up) and
over all routed pairs (down). The forward is the engine's own (`MoEModel` over the checkpoint, float32,
every expert a plain torch SwiGLU), so the statistics are those the packed model will see before
quantization; the windows run from an empty cache each, like `strata-plan eval`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from strata_plan.errors import UserError

from .experts import TorchExperts


@dataclass(frozen=True)
class ActivationStats:
    sq_in: torch.Tensor       # float64 [L, E, H]: sum over routed tokens of x^2 (gate and up inputs)
    sq_mid: torch.Tensor      # float64 [L, E, I]: sum of h^2, h = silu(gate x) * up x (down's input)
    counts: torch.Tensor      # int64 [L, E]: routed tokens per expert
    sq_all: torch.Tensor      # float64 [L, H]: sum over every token of x^2
    tokens: int               # calibration tokens run

    def importance(self, moe_index: int, expert: int) -> dict[str, torch.Tensor]:
        """{"gate": [H], "up": [H], "down": [I]} float32 mean squares for one expert (its layer's when unrouted)."""
        n = int(self.counts[moe_index, expert])
        if n:
            x = self.sq_in[moe_index, expert] / n
            h = self.sq_mid[moe_index, expert] / n
        else:
            x = self.sq_all[moe_index] / max(self.tokens, 1)
            h = self.sq_mid[moe_index].sum(0) / max(int(self.counts[moe_index].sum()), 1)
        return {"gate": x.float(), "up": x.float(), "down": h.float()}


class StatsExperts:
    """The reference experts (`TorchExperts`) that also add up their inputs' squares per expert."""

    def __init__(self, inner: TorchExperts):
        self.inner = inner
        L = len(inner.layers)
        E, I, H = inner.layers[0][0].shape
        self.sq_in = torch.zeros(L, E, H, dtype=torch.float64)
        self.sq_mid = torch.zeros(L, E, I, dtype=torch.float64)
        self.counts = torch.zeros(L, E, dtype=torch.int64)
        self.sq_all = torch.zeros(L, H, dtype=torch.float64)

    def __call__(self, moe_index: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        gate, up, _ = self.inner.layers[moe_index]
        self.sq_all[moe_index] += (x.double() ** 2).sum(0).cpu()
        for e in torch.unique(topk_ids).tolist():
            rows = (topk_ids == e).any(-1).nonzero().reshape(-1)               # tokens routed to e [n]
            xe = x[rows].float()
            h = F.silu(F.linear(xe, gate[e].float())) * F.linear(xe, up[e].float())
            self.sq_in[moe_index, e] += (xe.double() ** 2).sum(0).cpu()
            self.sq_mid[moe_index, e] += (h.double() ** 2).sum(0).cpu()
            self.counts[moe_index, e] += rows.numel()
        return self.inner(moe_index, x, topk_ids, topk_weights)


def calibration_tokens(checkpoint: str | Path, path: str | Path, max_tokens: int) -> list[int]:
    """A calibration file's token ids (at most max_tokens): a text file, tokenized with the checkpoint's
    tokenizer, or a .npz holding `tokens` (ids already)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(str(p), "--calib", "file not found", "give a calibration text file (or a .npz of token ids)")
    if p.suffix == ".npz":
        with np.load(p) as d:
            if "tokens" not in d:
                raise UserError(str(p), "tokens", "no `tokens` array in the .npz", "save the ids as `tokens`")
            ids = d["tokens"].astype(np.int64).reshape(-1).tolist()
    else:
        from .config import ModelConfig
        from .generate import encode_prompt, load_tokenizer
        ids = encode_prompt(load_tokenizer(checkpoint), p.read_text(encoding="utf-8", errors="replace"),
                            ModelConfig.load(checkpoint), checkpoint)
    if len(ids) < 2:
        raise UserError(str(p), "--calib", f"{len(ids)} tokens", "give a calibration text of many tokens")
    return ids[:max_tokens]


@torch.inference_mode()
def activation_stats(checkpoint: str | Path, tokens: Sequence[int], chunk: int, device: str = "cpu") -> ActivationStats:
    """Run the checkpoint's float32 forward over `tokens` in windows of `chunk` (the last may be shorter) and
    return its routed experts' input statistics."""
    from .config import ModelConfig
    from .model import MoEModel
    cfg = ModelConfig.load(checkpoint)
    chunk = min(chunk, cfg.max_positions)
    ids = torch.as_tensor(list(tokens), dtype=torch.long)
    if int(ids.max()) >= cfg.vocab:
        raise UserError("--calib", "", f"token id {int(ids.max())} outside the vocabulary of {cfg.vocab}",
                        "tokenize the calibration text with this checkpoint's tokenizer")
    experts = StatsExperts(TorchExperts.from_checkpoint(checkpoint, cfg, device=device, dtype=torch.float32))
    model = MoEModel.load(checkpoint, experts, chunk, device=device, dtype=torch.float32)
    for s in range(0, ids.numel(), chunk):
        model.reset()
        model.prefill(ids[s:s + chunk], chunk=chunk)
    return ActivationStats(experts.sq_in, experts.sq_mid, experts.counts, experts.sq_all, ids.numel())
