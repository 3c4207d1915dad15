"""Fidelity: how far a packed model's next-token distributions are from its reference model's, measured
through the engine on held-out tokens (what `strata-plan eval` prints).

    f = evaluate("packed/", "checkpoint/", tokens, chunk=512)          # tokens: int list, the held-out stream
    f.top1, f.top5, f.kl_mean, f.kl_p99, f.ppl_packed, f.ppl_reference
    f = evaluate_dequantized("packed/", "checkpoint/", tokens, chunk=512)   # the packed weights alone, float32

The stream is cut into windows of `chunk` tokens (whole windows only; with `max_tokens`, that many tokens'
worth of windows spread evenly over the stream, so a short run does not see only its first document), each run
from an empty cache with teacher forcing: one prefill with every position's logits, so a window of C tokens
gives C - 1 next-token predictions. Per prediction, with p the reference's and q the packed model's
softmax: top-1 agreement (q's argmax is p's argmax), top-5 agreement (q's argmax is among p's 5 most
likely), KL(p || q) = sum_v p_v (log p_v - log q_v) in float64 (mean and 99th percentile over the
predictions), and each model's perplexity exp(mean -log prob of the actual next token).

The packed side is the engine (`Engine.open` with the given plan, or `resident_plan`: every expert static),
so on a GPU it includes the kernels' own arithmetic (bf16 dense weights, int8 activations in the fused MoE);
on the CPU, or with backend="torch" on a GPU, the fused MoE's torch reference computes in float32 over the
dequantized weights: the two runs on one GPU separate weight quantization from the kernels' arithmetic. The reference
is the engine's own float32 model over the checkpoint's weights (`MoEModel` + `TorchExperts`), which
tests/test_engine_models.py holds to transformers within 2e-4 + 1e-4 |logit| (measured 1.1e-5): it runs every
architecture the engine runs, on the same device, without transformers.

`evaluate_dequantized` runs the packed folder's experts dequantized once (the kernels' reference dequantizer) in
that same float32 model instead: weight quantization alone, as fast on a GPU as the reference (the fused MoE's
torch reference goes one token and one expert at a time). `evaluate(..., packed_chunk=1)` feeds each window token
by token, so on a GPU the fused MoE runs its batch-1 decode kernels (int8 activations) rather than the prefill path.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from strata_plan.errors import UserError

from .config import ModelConfig

TOP = 5


@dataclass(frozen=True)
class Fidelity:
    predictions: int          # next tokens compared (chunks x (chunk - 1))
    chunks: int
    chunk: int
    top1: float               # share of predictions whose packed argmax is the reference's argmax
    top5: float               # ... is among the reference's 5 most likely tokens
    kl_mean: float            # KL(reference || packed), nats per token
    kl_p99: float
    ppl_packed: float         # against the actual next tokens
    ppl_reference: float

    @property
    def ppl_change(self) -> float:
        """Relative perplexity change of the packed model over the reference (0.01 = +1%)."""
        return self.ppl_packed / self.ppl_reference - 1.0

    def to_data(self) -> dict:
        return {**asdict(self), "ppl_change": self.ppl_change}


class Tally:
    """Per-prediction figures of chunk after chunk, kept on the host (one float64 per prediction each)."""

    def __init__(self):
        self.kl: list[torch.Tensor] = []
        self.nll_packed: list[torch.Tensor] = []
        self.nll_ref: list[torch.Tensor] = []
        self.top1 = self.top5 = 0

    def add(self, ref: torch.Tensor, packed: torch.Tensor, targets: torch.Tensor) -> None:
        """ref, packed: logits [T, V] of the same positions; targets int64 [T]: the actual next tokens."""
        lp = torch.log_softmax(ref.double(), dim=-1)                          # [T, V]
        lq = torch.log_softmax(packed.double(), dim=-1)
        self.kl.append((lp.exp() * (lp - lq)).sum(-1).cpu())                  # [T]
        t = targets.to(lp.device).reshape(-1, 1)
        self.nll_ref.append(-lp.gather(1, t).reshape(-1).cpu())
        self.nll_packed.append(-lq.gather(1, t).reshape(-1).cpu())
        q1 = packed.argmax(-1, keepdim=True)                                  # [T, 1]
        top = ref.topk(TOP, dim=-1).indices                                   # [T, 5], most likely first
        self.top1 += int((top[:, :1] == q1).sum())
        self.top5 += int((top == q1).any(-1).sum())

    def result(self, chunks: int, chunk: int) -> Fidelity:
        kl = torch.cat(self.kl)
        n = kl.numel()
        return Fidelity(n, chunks, chunk, self.top1 / n, self.top5 / n, float(kl.mean()),
                        float(torch.quantile(kl, 0.99)), float(torch.cat(self.nll_packed).mean().exp()),
                        float(torch.cat(self.nll_ref).mean().exp()))


def windows(tokens: Sequence[int], chunk: int, max_tokens: int | None, where: str) -> np.ndarray:
    """The stream as whole windows [n, chunk]: all of them, or max_tokens // chunk spread evenly over the stream;
    refuses a stream shorter than one window."""
    if chunk < 2:
        raise UserError("--chunk", str(chunk), "a window needs at least 2 tokens (one prediction)", "use --chunk 2 or more")
    if max_tokens is not None and max_tokens < chunk:
        raise UserError("--tokens", str(max_tokens), f"fewer than one window of --chunk {chunk} tokens",
                        f"use --tokens {chunk} or more, or a smaller --chunk")
    t = np.asarray(tokens, dtype=np.int64).reshape(-1)
    n = t.size // chunk
    if n == 0:
        raise UserError(where, "", f"{t.size} tokens, shorter than one window of --chunk {chunk} tokens",
                        f"give a longer text, or a --chunk of at most {t.size}")
    rows = t[:n * chunk].reshape(n, chunk)
    keep = n if max_tokens is None else min(n, max_tokens // chunk)
    return rows[np.linspace(0, n - 1, keep).round().astype(np.int64)] if keep < n else rows


def check_same_model(packed: ModelConfig, reference: ModelConfig, packed_where: str, ref_where: str) -> None:
    """Refuse a reference of another architecture or shape than the packed model (one line, exit code 2)."""
    for field, a, b in (("model_type", packed.family, reference.family), ("vocab_size", packed.vocab, reference.vocab),
                        ("hidden_size", packed.hidden, reference.hidden), ("num_hidden_layers", packed.n_layers, reference.n_layers),
                        ("n_routed_experts", packed.spec.n_routed, reference.spec.n_routed)):
        if a != b:
            raise UserError(ref_where, field, f"{b}, the packed model ({packed_where}) has {a}",
                            "give the checkpoint the folder was packed from as --reference")


def load_config(folder: str | Path, flag: str) -> ModelConfig:
    p = Path(folder)
    if not (p / "config.json").is_file():
        raise UserError(str(p / "config.json"), flag, "file not found",
                        f"give {flag} a folder with config.json ({'a packed folder: strata-plan pack' if flag == '--packed' else 'a Hugging Face checkpoint'})")
    return ModelConfig.load(p)


def reference_model(checkpoint: str | Path, cfg: ModelConfig, context: int, device: torch.device):
    """The checkpoint in float32 through the engine's own forward (every expert a plain torch SwiGLU)."""
    from .experts import TorchExperts
    from .model import MoEModel
    experts = TorchExperts.from_checkpoint(checkpoint, cfg, device=device, dtype=torch.float32)
    return MoEModel.load(checkpoint, experts, context, device=device, dtype=torch.float32)


def checked_windows(packed: str | Path, reference: str | Path, tokens: Sequence[int], chunk: int,
                    max_tokens: int | None, text_where: str) -> tuple[ModelConfig, ModelConfig, np.ndarray]:
    """(packed config, reference config, the windows [n, chunk]) after refusing a reference of another model,
    a window longer than the model's positions, or token ids outside its vocabulary."""
    pcfg, rcfg = load_config(packed, "--packed"), load_config(reference, "--reference")
    check_same_model(pcfg, rcfg, str(packed), str(Path(reference) / "config.json"))
    data = windows(tokens, chunk, max_tokens, text_where)
    if chunk > pcfg.max_positions:
        raise UserError("--chunk", str(chunk), f"longer than the model's {pcfg.max_positions} positions",
                        f"use --chunk {pcfg.max_positions} or less")
    if int(data.max()) >= pcfg.vocab:
        raise UserError(text_where, "", f"token id {int(data.max())} outside the vocabulary of {pcfg.vocab}",
                        "tokenize the text with the reference checkpoint's tokenizer")
    return pcfg, rcfg, data


def compare(model, ref, data: np.ndarray, chunk: int, model_chunk: int,
            on_chunk: Callable[[int, int], None] | None = None) -> Fidelity:
    """Teacher-forced windows through `model` (prefill chunks of `model_chunk`) and `ref`, tallied."""
    tally = Tally()
    for i, row in enumerate(data):
        ids = torch.from_numpy(row)
        model.reset()
        ref.reset()
        q = model.prefill(ids, chunk=model_chunk, all_logits=True)          # [C, V] float32
        p = ref.prefill(ids, chunk=chunk, all_logits=True)
        tally.add(p[:-1], q[:-1], ids[1:])
        if on_chunk is not None:
            on_chunk(i + 1, len(data))
    return tally.result(len(data), chunk)


def evaluate(packed: str | Path, reference: str | Path, tokens: Sequence[int], chunk: int,
             max_tokens: int | None = None, plan=None, device: str = "", text_where: str = "--text", backend: str = "auto",
             on_chunk: Callable[[int, int], None] | None = None, packed_chunk: int | None = None) -> Fidelity:
    """The fidelity of the packed folder against the checkpoint on `tokens` (see the module doc). plan: a plan
    path or Plan for the packed folder (default: `resident_plan`); backend: the fused MoE's ("torch": its float32
    reference over the dequantized weights also on a GPU, so the kernels' own arithmetic drops out);
    on_chunk(done, total) after each window; packed_chunk: the packed model's prefill chunk (default the plan's;
    1 feeds each window token by token, so on a GPU the fused MoE runs its batch-1 decode kernels, int8
    activations, instead of the grouped prefill path)."""
    from .engine import Engine, EngineOptions
    from .packed import load_index
    from .resident_plan import resident_plan
    _, rcfg, data = checked_windows(packed, reference, tokens, chunk, max_tokens, text_where)
    plan_path = "plan"
    if plan is None:
        plan = resident_plan(load_index(packed), context=chunk, prefill_chunk=chunk)
    elif isinstance(plan, (str, Path)):
        from strata_plan.core.plan import load_plan
        plan_path, plan = str(plan), load_plan(plan)
    if plan.context < chunk:
        raise UserError(plan_path, "context", f"{plan.context} tokens, shorter than --chunk {chunk}",
                        f"use --chunk {plan.context} or less")
    with Engine.open(packed, plan, EngineOptions(mode="lru", device=device, backend=backend), plan_path=plan_path) as eng:
        ref = reference_model(reference, rcfg, chunk, eng.model.device)
        return compare(eng.model, ref, data, chunk, packed_chunk or plan.prefill_chunk, on_chunk)


def dequantized_model(packed: str | Path, cfg: ModelConfig, context: int, device: torch.device):
    """The packed folder in the engine's float32 model, its routed experts dequantized once by the kernels'
    reference dequantizer (`kernels.quantizer.dequantize`) and run as plain torch SwiGLUs (`TorchExperts`):
    the packed weights with none of the kernels' or bf16's arithmetic."""
    from strata_plan.kernels.quantizer import dequantize, unpack_expert

    from .experts import TorchExperts
    from .model import MoEModel
    from .packed import load_index, read_blob, verify_dense
    index = load_index(packed)
    verify_dense(index)                          # every byte checked against index.json, as the engine does
    where = {(e.layer, e.expert): e for e in index.entries}
    layers = []
    for layer in cfg.moe_layers:
        mats = []
        for e in range(cfg.spec.n_routed):
            ent = where[(layer, e)]
            blob = np.frombuffer(read_blob(index, ent, verify=True), dtype=np.uint8).copy()
            m = unpack_expert(torch.from_numpy(blob).to(device), ent.format, index.hidden, index.moe_intermediate)
            mats.append([dequantize(m[k]) for k in ("gate", "up", "down")])
        layers.append(tuple(torch.stack([m[i] for m in mats]) for i in range(3)))
    return MoEModel.load(packed, TorchExperts(layers), context, device=device, dtype=torch.float32)


def evaluate_dequantized(packed: str | Path, reference: str | Path, tokens: Sequence[int], chunk: int,
                         max_tokens: int | None = None, device: str = "", text_where: str = "--text") -> Fidelity:
    """Like `evaluate`, the packed model being `dequantized_model`: weight quantization alone, on any device at
    the reference's speed (the fused MoE's torch reference, one token and expert at a time, is far slower)."""
    pcfg, rcfg, data = checked_windows(packed, reference, tokens, chunk, max_tokens, text_where)
    from .engine import resolve_device
    dev = resolve_device(device)
    with torch.inference_mode():
        model = dequantized_model(packed, pcfg, chunk, dev)
        return compare(model, reference_model(reference, rcfg, chunk, dev), data, chunk, chunk)
