"""The two MoE sizes we train (DeepSeek-V3 / Kimi-K2 family, transformers' DeepseekV3ForCausalLM) and the
pieces of routing the training loop needs: a tap on every router and aux-loss-free load balancing.

Load balancing, as in DeepSeek-V3 (arXiv 2412.19437, section 2.1.2): each router adds a per-expert bias
`e_score_correction_bias` to its sigmoid scores when it *chooses* experts (the gate weights stay the
unbiased scores). The bias gets no gradient; after every optimizer step it moves by `gamma` toward
balance: down for an expert that took more than the mean number of token slots in that step, up for one
that took fewer. transformers only reads the bias, so `update_balance_bias` implements the rule. The
complementary sequence-wise balance loss of DeepSeek-V3 (alpha = 1e-4) is `sequence_balance_loss`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class MoEShape:
    name: str
    vocab: int
    hidden: int
    layers: int
    first_dense: int          # leading dense layers (DeepSeek-V3: 3, Kimi-K2: 1)
    dense_intermediate: int
    moe_intermediate: int
    n_routed: int
    top_k: int
    n_shared: int
    heads: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_dim: int
    n_group: int = 1          # group-limited routing (DeepSeek-V3: 8 groups, 4 kept); 1 = none (Kimi-K2)
    topk_group: int = 1
    routed_scaling: float = 2.5
    max_positions: int = 1024
    q_lora_rank: int | None = None   # queries through a low-rank projection (DeepSeek-V3: 1536); None = direct

    @property
    def n_moe_layers(self) -> int:
        return self.layers - self.first_dense

    def hf_config(self):
        from transformers import DeepseekV3Config
        return DeepseekV3Config(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.dense_intermediate,
            moe_intermediate_size=self.moe_intermediate, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.heads, n_shared_experts=self.n_shared,
            n_routed_experts=self.n_routed, num_experts_per_tok=self.top_k, first_k_dense_replace=self.first_dense,
            kv_lora_rank=self.kv_lora_rank, q_lora_rank=self.q_lora_rank, qk_nope_head_dim=self.qk_nope_dim,
            qk_rope_head_dim=self.qk_rope_dim, v_head_dim=self.v_dim, n_group=self.n_group,
            topk_group=self.topk_group, routed_scaling_factor=self.routed_scaling, norm_topk_prob=True,
            topk_method="noaux_tc", max_position_embeddings=self.max_positions, bos_token_id=0, eos_token_id=0,
            tie_word_embeddings=False)

    def to_dict(self) -> dict:
        return asdict(self)


# 6 layers (the first dense, as Kimi-K2), 32 routed experts top-4 + 1 shared, hidden 256: 7.4 M parameters,
# 14.9 MB in bf16. Experts are narrow (32) so that the weights fit the 16 MB a committed fixture may take.
FIXTURE = MoEShape("fixture-moe", vocab=4096, hidden=256, layers=6, first_dense=1, dense_intermediate=512,
                   moe_intermediate=32, n_routed=32, top_k=4, n_shared=1, heads=4, kv_lora_rank=64,
                   qk_nope_dim=32, qk_rope_dim=16, v_dim=48)
# 10 layers (first dense), 64 routed experts top-6 + 1 shared in 8 groups of which 4 are kept (DeepSeek-V3's
# group-limited routing), hidden 512: 260 M parameters, about 45 M active per token.
BENCH = MoEShape("bench-moe", vocab=16384, hidden=512, layers=10, first_dense=1, dense_intermediate=1536,
                 moe_intermediate=256, n_routed=64, top_k=6, n_shared=1, heads=8, kv_lora_rank=128,
                 qk_nope_dim=64, qk_rope_dim=32, v_dim=96, n_group=8, topk_group=4)
# The peer model (benchmarks/peers/): BENCH with a query LoRA of rank 256, the DeepSeek-V3 geometry llama.cpp's
# loader requires (it has no path for direct queries), trained from the same corpus as a model of its own.
PEER = MoEShape("peer-moe", vocab=16384, hidden=512, layers=10, first_dense=1, dense_intermediate=1536,
                moe_intermediate=256, n_routed=64, top_k=6, n_shared=1, heads=8, kv_lora_rank=128,
                qk_nope_dim=64, qk_rope_dim=32, v_dim=96, n_group=8, topk_group=4, q_lora_rank=256)
SHAPES = {s.name: s for s in (FIXTURE, BENCH, PEER)}


def build_model(shape: MoEShape, seed: int, experts_impl: str = "eager"):
    """A freshly initialised model (same seed, same weights), router biases in float32."""
    from transformers import DeepseekV3ForCausalLM
    torch.manual_seed(seed)
    cfg = shape.hf_config()
    cfg._experts_implementation = experts_impl
    return DeepseekV3ForCausalLM(cfg)


def moe_blocks(model) -> list:
    """The MoE blocks (`.gate`, `.experts`, `.shared_experts`) in layer order."""
    return [layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "gate")]


def moe_layer_indices(model) -> list[int]:
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]


def keep_router_bias_fp32(model) -> None:
    """Casting a model to bf16 also casts buffers: put the balance biases back to float32 (steps of 1e-3
    would vanish in bf16)."""
    for block in moe_blocks(model):
        block.gate.e_score_correction_bias = block.gate.e_score_correction_bias.float()


class GateTap:
    """Records what every router returned in the last forward: (router_logits [N, E], weights [N, k],
    indices [N, k]) per MoE layer, N = batch * sequence tokens."""

    def __init__(self, model):
        self.out: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None] = []
        self._handles = []
        for i, block in enumerate(moe_blocks(model)):
            self.out.append(None)
            self._handles.append(block.gate.register_forward_hook(self._hook(i)))

    def _hook(self, i: int):
        def hook(_module, _inputs, output):
            self.out[i] = output
        return hook

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def expert_loads(tap: GateTap, n_experts: int) -> torch.Tensor:
    """Token slots each expert took in the last forward, [L, E]."""
    return torch.stack([torch.bincount(idx.reshape(-1), minlength=n_experts) for _, _, idx in tap.out])


@torch.no_grad()
def update_balance_bias(model, loads: torch.Tensor, gamma: float) -> None:
    """DeepSeek-V3's aux-loss-free rule: bias -= gamma where load > mean, += gamma where load < mean."""
    for block, load in zip(moe_blocks(model), loads):
        load = load.float()
        bias = block.gate.e_score_correction_bias
        bias += gamma * torch.sign(load.mean() - load).to(bias.device, bias.dtype)


def sequence_balance_loss(tap: GateTap, batch: int, top_k: int) -> torch.Tensor:
    """DeepSeek-V3's complementary sequence-wise balance loss, summed over MoE layers (multiply by alpha):
    per sequence, sum_i f_i * P_i with f_i = E / (k T) * (tokens choosing i) and P_i the mean over tokens of
    the expert's normalised affinity s_i / sum_j s_j; averaged over the sequences of the batch."""
    total = 0.0
    for logits, _, idx in tap.out:
        n_experts = logits.shape[-1]
        scores = torch.sigmoid(logits.float()).view(batch, -1, n_experts)
        tokens = scores.shape[1]
        p = (scores / scores.sum(-1, keepdim=True)).mean(1)                                    # [B, E]
        counts = torch.zeros(batch, n_experts, device=logits.device)
        counts.scatter_add_(1, idx.view(batch, -1), torch.ones_like(idx.view(batch, -1), dtype=counts.dtype))
        f = counts * n_experts / (top_k * tokens)
        total = total + (f * p).sum(-1).mean()
    return total
