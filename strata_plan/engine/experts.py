"""The routed-expert call the model makes once per MoE layer, behind one small interface, and two plain
implementations of it.

    experts(moe_index, x, topk_ids, topk_weights) -> out
        moe_index     int, 0..n_moe_layers-1 (the i-th MoE layer; decoder layer = config.moe_layers[i])
        x             [M, hidden], the model dtype, on the model's device: the MoE block's input (the
                      post-attention RMSNorm of the residual stream)
        topk_ids      int64 [M, k], same device, sorted by gate weight (highest first)
        topk_weights  float32 [M, k], same device: what each expert's output is multiplied by
        out           [M, hidden] in x's dtype: sum_j topk_weights[m, j] * expert_{topk_ids[m, j]}(x[m]),
                      experts being SwiGLU: down(silu(gate(x)) * up(x)); shared experts are not included

The model never moves the ids to the host; an implementation that must know them there (prefill's waves, the
per-expert loop below) makes that one device-to-host copy itself.

- `TorchExperts`: BF16 (or any dtype) weights of every routed expert from a Hugging Face checkpoint,
  stacked per layer; a loop over the experts that were hit, as transformers' eager experts do (one
  host sync per call: the counts per expert).
- `PackedExperts`: a packed folder's blobs (`strata-plan pack`), each MoE layer's file as one uint8 arena
  on the device with its offsets table, run through `strata_plan.kernels.ops.fused_moe`: the torch
  reference (`backend="torch"`, runs on the CPU) or the Triton kernels (`backend="auto"` on a GPU).
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from .config import ModelConfig


class Experts(Protocol):
    def __call__(self, moe_index: int, x: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> torch.Tensor: ...


class TorchExperts:
    """Every routed expert's weights, stacked per MoE layer: gate, up [E, I, H], down [E, H, I]."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
        self.layers = layers

    @staticmethod
    def from_checkpoint(folder: str | Path, cfg: ModelConfig, device="cpu", dtype: torch.dtype = torch.bfloat16) -> "TorchExperts":
        from strata_plan.engine.pack import Checkpoint, expert_weights
        ckpt = Checkpoint(Path(folder))
        layers = []
        for layer in cfg.moe_layers:
            _, get = expert_weights(ckpt, layer, cfg.spec.n_routed)
            mats = [get(e) for e in range(cfg.spec.n_routed)]
            layers.append(tuple(torch.stack([m[i] for m in mats]).to(device=device, dtype=dtype) for i in range(3)))
        return TorchExperts(layers)

    def __call__(self, moe_index: int, x: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> torch.Tensor:
        gate, up, down = self.layers[moe_index]
        k = topk_ids.shape[1]
        flat = topk_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)                          # slots grouped by expert
        counts = torch.bincount(flat, minlength=gate.shape[0]).tolist()   # the host sync
        weights = topk_weights.reshape(-1)
        out = torch.zeros_like(x)
        start = 0
        for e, c in enumerate(counts):
            if not c:
                continue
            slots = order[start:start + c]
            start += c
            rows = slots // k
            xe = x[rows]
            h = F.linear(F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e]), down[e])
            out.index_add_(0, rows, (h * weights[slots, None]).to(out.dtype))
        return out


class PackedExperts:
    """The experts of a packed folder, every layer resident: one uint8 arena per MoE layer (its
    `experts-layerNNN.bin`), offsets int64 [E] and the per-expert formats, through `fused_moe`."""

    def __init__(self, folder: str | Path, cfg: ModelConfig, device="cpu", backend: str = "torch"):
        from strata_plan.kernels.ops import ExpertFormats
        from strata_plan.engine.packed import load_index, verify_blob
        folder = Path(folder)
        index = load_index(folder)
        self.hidden, self.intermediate, self.backend = index.hidden, index.moe_intermediate, backend
        self.layers = []
        for layer in cfg.moe_layers:
            rows = sorted((e for e in index.entries if e.layer == layer), key=lambda e: e.expert)
            files = {e.file for e in rows}
            assert len(files) == 1 and [e.expert for e in rows] == list(range(cfg.spec.n_routed)), (layer, files)
            data = np.fromfile(folder / rows[0].file, dtype=np.uint8)
            for e in rows:                       # every blob checked against index.json before a kernel reads it
                verify_blob(index, e, data[e.offset:e.offset + e.nbytes])
            arena = torch.from_numpy(data).to(device)
            offsets = torch.tensor([e.offset for e in rows], dtype=torch.int64, device=device)
            self.layers.append((arena, offsets, ExpertFormats.from_names([e.format for e in rows], device)))

    def __call__(self, moe_index: int, x: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> torch.Tensor:
        from strata_plan.kernels.ops import fused_moe
        arena, offsets, formats = self.layers[moe_index]
        return fused_moe(x, topk_ids, topk_weights, arena, offsets, formats, self.hidden, self.intermediate,
                         backend=self.backend)
