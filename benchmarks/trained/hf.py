"""The transformers side of the trained-model benchmark: the checkpoint as a transformers user loads it, with
accelerate's offload of the routed experts (the peer we compare against), and greedy decoding timed one
token at a time the way `engine.bench.measure` times the engine.

    tiers = expert_tiers(n_moe=9, gpu_share=0.08, cpu_share=0.24)     # {moe index: "gpu" | "cpu" | "disk"}
    model = load(ckpt, torch.bfloat16, "cuda", tiers, offload_folder)  # the rest of the model on the GPU
    g = greedy(model, prompt_ids, new_tokens=96, timed_from=32)        # tokens, top-2 gaps, seconds per token

transformers 5 keeps a MoE layer's routed experts in one module (`mlp.experts`, all experts' weights in two
3-D tensors), so `device_map` can only place a whole layer's experts: a tier gets the layers whose cumulative
share of routed bytes rounds to its share, and the GPU only whole layers that fit its share (none when one
layer is more than 8% of the routed bytes). accelerate moves an offloaded module's weights to the GPU for
every forward ("cpu": from pageable RAM; "disk": from safetensors files in `offload_folder`, read through the
page cache).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch


def expert_tiers(n_moe: int, gpu_share: float, cpu_share: float | None) -> dict[int, str]:
    """MoE layer index -> "gpu", "cpu" or "disk" for whole layers: the first floor(gpu_share * n) layers on the
    GPU (never over its share), the next up to round((gpu_share + cpu_share) * n) on the CPU, the rest on
    disk; `cpu_share=None`: every layer not on the GPU on the CPU (no disk tier)."""
    n_gpu = math.floor(gpu_share * n_moe + 1e-9)
    n_cpu = n_moe - n_gpu if cpu_share is None else max(0, round((gpu_share + cpu_share) * n_moe) - n_gpu)
    return {i: "gpu" if i < n_gpu else "cpu" if i < n_gpu + n_cpu else "disk" for i in range(n_moe)}


def device_map(config, tiers: dict[int, str], gpu) -> dict:
    """A transformers `device_map` of a DeepSeek-V3-family checkpoint: every MoE layer's `mlp.experts` where
    `tiers` says (gpu, "cpu" or "disk"), everything else on `gpu`."""
    first = getattr(config, "first_k_dense_replace", 0)
    out = {"model.embed_tokens": gpu, "model.norm": gpu, "model.rotary_emb": gpu, "lm_head": gpu}
    for i in range(config.num_hidden_layers):
        if i < first:
            out[f"model.layers.{i}"] = gpu
            continue
        for part in ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp.gate", "mlp.shared_experts"):
            out[f"model.layers.{i}.{part}"] = gpu
        tier = tiers[i - first]
        out[f"model.layers.{i}.mlp.experts"] = gpu if tier == "gpu" else tier
    return out


def load(ckpt, dtype, device: str, tiers: dict[int, str] | None = None, offload_folder=None,
         experts_implementation: str | None = None):
    """The checkpoint in transformers (`tiers=None`: all of it on `device`), eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM
    kw = {} if experts_implementation is None else {"experts_implementation": experts_implementation}
    if tiers is None:
        return AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, **kw).to(device).eval()
    cfg = AutoConfig.from_pretrained(ckpt)
    gpu = 0 if device == "cuda" else device
    dm = device_map(cfg, tiers, gpu)
    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, device_map=dm, offload_folder=offload_folder,
                                                **kw).eval()


def offloaded_bytes(model, tiers: dict[int, str]) -> int:
    """Bytes accelerate copies to the GPU per forward: the weights of every offloaded `mlp.experts` module
    (counted from the modules' parameters, which may sit on the meta device)."""
    first = getattr(model.config, "first_k_dense_replace", 0)
    return sum(p.numel() * p.element_size() for i, t in tiers.items() if t != "gpu"
               for p in model.model.layers[first + i].mlp.experts.parameters())


@dataclass(frozen=True)
class Greedy:
    tokens: list[int]
    gaps: list[float]               # top-1 minus top-2 logit before each token (how close a tie was)
    prefill_s: float
    step_s: list[float]             # seconds of each timed decode step (forward + argmax on the host)

    @property
    def decode_tok_s(self) -> float:
        return 1.0 / statistics.median(self.step_s) if self.step_s else 0.0

    @property
    def decode_tok_s_mean(self) -> float:
        return len(self.step_s) / sum(self.step_s) if self.step_s else 0.0


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def greedy(model, prompt: list[int], new_tokens: int, timed_from: int = 0) -> Greedy:
    """Greedy decoding with transformers' KV cache, no end-of-sequence stop: `new_tokens` tokens; decode
    steps from `timed_from` on are timed one by one (each ends when its token id is on the host)."""
    device = model.get_input_embeddings().weight.device
    ids = torch.tensor([prompt], device=device)
    _sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=ids, use_cache=True)
    logits = out.logits[0, -1].float()
    tok = int(logits.argmax())
    prefill_s = time.perf_counter() - t0
    past = out.past_key_values
    tokens, gaps, steps = [], [], []
    for i in range(new_tokens):
        top = torch.topk(logits, 2).values
        tokens.append(tok)
        gaps.append(float(top[0] - top[1]))
        if i + 1 == new_tokens:
            break
        t1 = time.perf_counter()
        out = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=past, use_cache=True)
        logits = out.logits[0, -1].float()
        tok = int(logits.argmax())
        if i + 1 >= timed_from:
            steps.append(time.perf_counter() - t1)
        past = out.past_key_values
    return Greedy(tokens, gaps, prefill_s, steps)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where the two token lists differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
