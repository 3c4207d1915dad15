"""Training loop and held-out evaluation for the MoE models of `moe.model`.

Deterministic by construction: weights come from `torch.manual_seed(seed)`, batches are windows of the token
stream in an order drawn from `numpy.random.default_rng(seed)`, and nothing else draws random numbers. On
the GPU the model runs in bf16 with float32 master weights in the optimizer; the router biases stay float32.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .model import GateTap, MoEShape, expert_loads, sequence_balance_loss, update_balance_bias


@dataclass(frozen=True)
class TrainSettings:
    seq_len: int = 512
    batch: int = 64
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_frac: float = 0.05
    weight_decay: float = 0.1
    beta2: float = 0.95
    clip: float = 1.0
    gamma: float = 1e-3          # balance-bias step per optimizer step (DeepSeek-V3's value)
    seq_aux_alpha: float = 1e-4  # sequence-wise balance loss weight (DeepSeek-V3's value)
    seed: int = 0

    def lr_at(self, step: int, steps: int) -> float:
        """Linear warm-up, then cosine decay to `min_lr_ratio * lr` at the last step."""
        warm = max(1, int(self.warmup_frac * steps))
        if step < warm:
            return self.lr * (step + 1) / warm
        t = (step - warm) / max(1, steps - warm - 1)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


@dataclass(frozen=True)
class TrainLog:
    settings: TrainSettings
    steps: int
    tokens_per_step: int
    loss: tuple[float, ...]          # cross-entropy of every step (nats/token)
    seconds: float
    step_seconds_median: float
    stopped_by_time: bool
    final_bias_abs_max: tuple[float, ...]    # per MoE layer
    load_max_share: tuple[tuple[int, tuple[float, ...]], ...]  # (step, per MoE layer: busiest expert's share
                                                                #  of that step's token slots), every 50 steps

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["loss"] = [round(x, 4) for x in self.loss]
        d.update(tokens=self.tokens, tokens_per_second=round(self.tokens_per_second, 1))
        return d


def windows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """[n, seq_len + 1] windows (inputs and their next tokens) starting every `seq_len` tokens: a view."""
    return np.lib.stride_tricks.sliding_window_view(stream, seq_len + 1)[::seq_len]


def batch_order(n_windows: int, batch: int, steps: int, seed: int) -> list[np.ndarray]:
    """Window indices of every step: epochs of a seeded permutation (a batch never spans two epochs)."""
    if n_windows < batch:
        raise ValueError(f"{n_windows} training windows for a batch of {batch}: give the corpus more text")
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    while len(out) < steps:
        perm = rng.permutation(n_windows)
        out += [perm[i:i + batch] for i in range(0, n_windows - batch + 1, batch)]
    return out[:steps]


@dataclass
class _Optimizer:
    """AdamW over float32 master copies of the model's parameters (the model may hold bf16)."""
    params: list
    masters: list
    opt: torch.optim.Optimizer = field(repr=False)

    @classmethod
    def create(cls, model, s: TrainSettings) -> "_Optimizer":
        params = [p for p in model.parameters() if p.requires_grad]
        masters = [p.detach().float().clone().requires_grad_(True) for p in params]
        decay = [m for p, m in zip(params, masters) if p.dim() >= 2]
        no_decay = [m for p, m in zip(params, masters) if p.dim() < 2]
        fused = bool(params) and params[0].is_cuda
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=s.lr, betas=(0.9, s.beta2), eps=1e-8, fused=fused)
        return cls(params, masters, opt)

    def step(self, lr: float, clip: float) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else p.grad.float()
        torch.nn.utils.clip_grad_norm_(self.masters, clip)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                p.copy_(m)
                p.grad = None


def fit(model, shape: MoEShape, train_windows: np.ndarray, s: TrainSettings, steps: int,
        seconds_limit: float | None = None, log=print) -> TrainLog:
    """Train `steps` steps (stopping early only if `seconds_limit` runs out; the log says so)."""
    device = next(model.parameters()).device
    model.train()
    model.config.use_cache = False
    opt = _Optimizer.create(model, s)
    tap = GateTap(model)
    order = batch_order(len(train_windows), s.batch, steps, s.seed)
    losses: list[float] = []
    times: list[float] = []
    shares: list[tuple[int, tuple[float, ...]]] = []
    t0 = time.perf_counter()
    stopped = False
    try:
        for step, idx in enumerate(order):
            ts = time.perf_counter()
            x = torch.from_numpy(np.ascontiguousarray(train_windows[idx])).to(device=device, dtype=torch.long, non_blocking=True)
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
            loss = ce + s.seq_aux_alpha * sequence_balance_loss(tap, x.shape[0], shape.top_k) if s.seq_aux_alpha else ce
            loss.backward()
            opt.step(s.lr_at(step, steps), s.clip)
            loads = expert_loads(tap, shape.n_routed)
            update_balance_bias(model, loads, s.gamma)
            losses.append(float(ce.detach()))  # one sync per step
            times.append(time.perf_counter() - ts)
            if step % 50 == 0 or step == steps - 1:
                shares.append((step, tuple(round(float(l.max() / l.sum()), 4) for l in loads.float())))
            if step % 100 == 0 or step == steps - 1:
                log(f"  step {step:5d}/{steps}  loss {losses[-1]:.4f}  lr {s.lr_at(step, steps):.2e}  "
                    f"{times[-1] * 1e3:.0f} ms/step  busiest expert {max(shares[-1][1]):.3f} of slots")
            if seconds_limit is not None and time.perf_counter() - t0 > seconds_limit and step < steps - 1:
                stopped = True
                log(f"  stopped by the time limit at step {step + 1} of {steps}")
                break
    finally:
        tap.close()
    elapsed = time.perf_counter() - t0
    bias = tuple(float(b.gate.e_score_correction_bias.abs().max()) for b in _blocks(model))
    return TrainLog(s, len(losses), s.batch * s.seq_len, tuple(losses), elapsed,
                    float(np.median(times)) if times else 0.0, stopped, bias, tuple(shares))


def _blocks(model):
    from .model import moe_blocks
    return moe_blocks(model)


def steps_for(model, shape: MoEShape, train_windows: np.ndarray, s: TrainSettings, seconds: float,
              probe_steps: int = 8, log=print) -> tuple[int, TrainLog]:
    """How many steps fit in `seconds`: time `probe_steps` steps on a throw-away copy of the model. The
    probe starts from the same weights on the same batches, so its losses are also a repeat of the run's
    first steps (the log compares them: the run-to-run noise of the GPU)."""
    probe = copy.deepcopy(model)
    plog = fit(probe, shape, train_windows, s, probe_steps, log=lambda *_: None)
    del probe
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    steps = max(1, int(seconds / plog.step_seconds_median))
    log(f"  probe: {plog.step_seconds_median * 1e3:.1f} ms/step -> {steps} steps in {seconds:.0f} s")
    return steps, plog


@torch.no_grad()
def evaluate(model, held_windows: np.ndarray, byte_lengths: np.ndarray, batch: int = 16) -> dict:
    """Held-out cross-entropy, perplexity and bits per byte over the given windows."""
    device = next(model.parameters()).device
    model.eval()
    nll, n_tok, n_bytes = 0.0, 0, 0
    for i in range(0, len(held_windows), batch):
        x = torch.from_numpy(np.ascontiguousarray(held_windows[i:i + batch])).to(device=device, dtype=torch.long)
        logits = model(input_ids=x[:, :-1], use_cache=False).logits.float()
        nll += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"))
        n_tok += x[:, 1:].numel()
        n_bytes += int(byte_lengths[held_windows[i:i + batch, 1:]].sum())
    loss = nll / n_tok
    return {"loss": loss, "perplexity": math.exp(loss), "bits_per_byte": nll / math.log(2) / n_bytes,
            "tokens": n_tok, "bytes": n_bytes, "windows": len(held_windows)}
