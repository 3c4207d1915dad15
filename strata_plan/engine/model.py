"""The model runtime the decode loop drives: dense weights on the device, a static KV cache of the
context, and the routed experts behind `engine.experts.Experts`.

    cfg = ModelConfig.load(folder)
    model = MoEModel.load(folder, experts, context=4096, device="cuda", dtype=torch.bfloat16)
    logits = model.prefill(prompt_ids, chunk=512)       # float32 [vocab], the last prompt token's
    logits = model.decode_step(next_id)                 # float32 [vocab]
    ids, weights = model.route(j, hidden)               # MoE layer j's gate on any hidden state

`folder` is a packed folder (`dense.safetensors` + `config.json`) or a Hugging Face checkpoint folder:
only the non-routed tensors are read. A decoder layer is
    h   = x + attention(input_layernorm(x))
    y   = post_attention_layernorm(h)
    out = h + mlp(y)                                    dense layers
    out = h + (experts(i, y, ids, w) + shared(y))       MoE layer i, (ids, w) = router_i(y)
then `after_moe(i, out)` if set: the hook for router lookahead. The lookahead of depth d at MoE layer i
is `route(i + d, out)` = the router of MoE layer i+d applied to the post_attention_layernorm (of the
decoder layer holding MoE layer i+d) of `out`, exactly as `benchmarks/moe/trace.py` computes the traces'
`lookahead_experts` (core/routing/TRACE.md). `before_moe(i, h)`, if set, runs after MoE layer i's router and before
its experts: the same gates on `h` instead (the engine's `lookahead_point="attention"`).

Dense weights the plan keeps in pinned RAM (`host`: decoder layer indices, "embed", "lm_head") are
built in host memory ("embed", "lm_head") or with shapes only (layers, on the meta device);
`engine.dense.DenseStream` points them at their pinned copies (read in place), or, where it streams them through
buffers, sets `before_layer(i)` at the start of decoder layer i (i = n_layers: before the logits); and
`embed_rows(token_ids)`, which replaces the device gather of the embedding rows.

With `decode_step(token, static=True)` the position lives in the device tensor `model.at` and attention spans
the whole cache, masked: a step's shapes and addresses do not change, so the whole step can be captured in a CUDA
graph once and replayed at every position. `step_runner` (engine.device_loop.DeviceDecode) runs static steps that
way.

Host syncs: none in the model itself (positions are host integers or `model.at`, tensors stay on the
device); the experts call of a prefill chunk copies the router's ids to the host (`StoreExperts.chunk`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from .attention import make_attention
from .config import ModelConfig
from .experts import Experts
from .kv import make_cache
from .layers import SwiGLU, rms_norm
from .picks import GREEDY
from .rope import RotaryTable
from .routing import Router
from .weights import TensorSource


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, src: TensorSource, layer: int, moe_index: int | None, device, dtype):
        p = f"model.layers.{layer}"
        self.layer, self.moe_index = layer, moe_index
        self.attn = make_attention(cfg, src, layer, device, dtype)
        self.in_norm = src.get(f"{p}.input_layernorm.weight", device, dtype)
        self.post_norm = src.get(f"{p}.post_attention_layernorm.weight", device, dtype)
        self.mlp = self.router = self.shared = None
        if moe_index is None:
            self.mlp = SwiGLU.load(src, f"{p}.mlp", ("gate_proj", "up_proj", "down_proj"), device, dtype)
            return
        names = cfg.tensors                   # the family's checkpoint spellings (core.families)
        gate = next((g for g in names.router if f"{p}.{g}.weight" in src), names.router[-1])
        self.router = Router.load(cfg.router, src, f"{p}.{gate}", device, dtype)
        if cfg.spec.shared_intermediate:
            self.shared = SwiGLU.load(src, f"{p}.{names.shared}", ("gate_proj", "up_proj", "down_proj"), device, dtype)


class MoEModel:
    def __init__(self, cfg: ModelConfig, src: TensorSource, experts: Experts, context: int, device="cpu",
                 dtype: torch.dtype = torch.bfloat16, host: frozenset = frozenset()):
        if context < 1:
            raise ValueError(f"context must be at least 1 token, got {context}")
        self.cfg, self.experts, self.context, self.device, self.dtype = cfg, experts, context, torch.device(device), dtype
        def at(unit):       # streamed layers: shapes only (engine.dense reads them into pinned RAM)
            return device if unit not in host else "meta" if isinstance(unit, int) else "cpu"
        self.embed = src.get("model.embed_tokens.weight", at("embed"), dtype)              # [V, H]
        self.norm = src.get("model.norm.weight", device, dtype)
        tied = cfg.spec.tied_embeddings and "lm_head.weight" not in src
        self.lm_head = self.embed if tied else src.get("lm_head.weight", at("lm_head"), dtype)   # [V, H]
        moe_index = {layer: i for i, layer in enumerate(cfg.moe_layers)}
        self.layers = [DecoderLayer(cfg, src, i, moe_index.get(i), at(i), dtype) for i in range(cfg.n_layers)]
        self.moe = [self.layers[layer] for layer in cfg.moe_layers]
        self.rope = RotaryTable(cfg.rope, context, device, dtype)
        self.cache = make_cache(cfg, context, device, dtype)
        self.pos = 0                                  # tokens in the cache
        self.at = torch.zeros(1, dtype=torch.long, device=device)    # the position of a static decode step
        self.after_moe: Callable[[int, torch.Tensor], None] | None = None
        self.before_moe: Callable[[int, torch.Tensor], None] | None = None   # (MoE index, residual after attention)
        self.step_runner: Callable[[torch.Tensor], torch.Tensor] | None = None   # a faster static step (device_loop.py)
        self.before_layer: Callable[[int], None] | None = None                 # engine.dense
        self.embed_rows: Callable[[torch.Tensor], torch.Tensor] | None = None  # engine.dense
        self.fused_router = False      # one token's routing in kernels.gate's two launches (`route_layer`)

    @staticmethod
    def load(folder: str | Path, experts: Experts, context: int, device="cpu",
             dtype: torch.dtype = torch.bfloat16, host: frozenset = frozenset()) -> "MoEModel":
        return MoEModel(ModelConfig.load(folder), TensorSource(folder), experts, context, device, dtype, host)

    # ---- the forward pass ---------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the context (the cache is overwritten from position 0)."""
        self.pos = 0

    def route(self, moe_index: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """MoE layer `moe_index`'s gate on hidden [M, H] (a residual-stream state, normalised here with that
        layer's post_attention_layernorm): ids int64 [M, k] by weight, highest first; weights float32 [M, k]."""
        layer = self.moe[moe_index]
        return layer.router(rms_norm(hidden, layer.post_norm, self.cfg.rms_eps))

    def route_layer(self, layer: DecoderLayer, h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A MoE layer's routing of the residual stream h [M, H] (y: its post-attention norm): ids int64 [M, k],
        weights float32 [M, k]. One token with `fused_router` (the engine's kernels on: a GPU, or Triton's
        interpreter): `Router.fused`, two launches; else the torch router on y."""
        if self.fused_router and h.shape[0] == 1:
            return layer.router.fused(h, layer.post_norm, self.cfg.rms_eps)
        return layer.router(y)

    # the pieces of one decoder layer (a fast loop may run them apart: graphs around the expert call)
    def attention_part(self, layer: DecoderLayer, x: torch.Tensor, start: int,
                       at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, y): the residual stream after attention [T, H] and its post-attention norm, the MLP's input."""
        eps = self.cfg.rms_eps
        h = x + layer.attn(rms_norm(x, layer.in_norm, eps), start, self.cache, self.rope, at=at)
        return h, rms_norm(h, layer.post_norm, eps)

    @staticmethod
    def moe_output(layer: DecoderLayer, h: torch.Tensor, y: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        """The decoder layer's output from the routed experts' sum: h + (routed + shared(y))."""
        return h + (routed + layer.shared(y) if layer.shared is not None else routed)

    def _layer(self, layer: DecoderLayer, x: torch.Tensor, start: int, at: torch.Tensor | None) -> torch.Tensor:
        if self.before_layer is not None:
            self.before_layer(layer.layer)
        h, y = self.attention_part(layer, x, start, at)
        if layer.moe_index is None:
            return h + layer.mlp(y)
        ids, w = self.route_layer(layer, h, y)
        if self.before_moe is not None:
            self.before_moe(layer.moe_index, h)
        out = self.moe_output(layer, h, y, self.experts(layer.moe_index, y, ids, w))
        if self.after_moe is not None:
            self.after_moe(layer.moe_index, out)
        return out

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """float32 logits of residual-stream states x [..., H] (final norm, lm_head)."""
        if self.before_layer is not None:
            self.before_layer(self.cfg.n_layers)
        return F.linear(rms_norm(x, self.norm, self.cfg.rms_eps), self.lm_head).float()

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows [T, H] of token_ids [T] (int64, on the device)."""
        return F.embedding(token_ids, self.embed) if self.embed_rows is None else self.embed_rows(token_ids)

    def forward(self, token_ids: torch.Tensor, all_logits: bool = False, static: bool = False,
                pick=None) -> torch.Tensor:
        """Run tokens [T] (int64, on the device) at positions pos..pos+T-1 and append them to the cache.
        Returns float32 logits [V] of the last token, or [T, V] with all_logits. static (T = 1 only): the
        position is read from the device tensor `self.at` (set here) and attention spans the whole cache
        with later positions masked, so every shape is the same at every step (see attention.py).
        pick (static only; `picks.GREEDY`, `picks.GumbelPick`): the next token picked from the logits instead, int64
        [1] on the device (inside the step's graph when the step runner takes picks: `device_loop.DeviceDecode`)."""
        t = token_ids.shape[0]
        if self.pos + t > self.context:
            raise ValueError(f"{self.pos} cached + {t} new tokens exceed the context of {self.context}")
        if static:
            if t != 1:
                raise ValueError(f"a static step runs one token, got {t}")
            if not getattr(self.step_runner, "owns_at", False):    # the device loop advances `at` in its step
                self.at.fill_(self.pos)
            if pick is not None and getattr(self.step_runner, "picks", False):
                out = self.step_runner(token_ids, pick=pick)
            else:
                out = (self.step_runner or self.step_at)(token_ids)
                out = pick(out) if pick is not None else out
        else:
            x = self.embed_tokens(token_ids)                                               # [T, H]
            for layer in self.layers:
                x = self._layer(layer, x, self.pos, None)
            out = self.logits(x if all_logits else x[-1])
        self.pos += t
        return out

    def step_at(self, token_ids: torch.Tensor) -> torch.Tensor:
        """One token [1] at the position held in `self.at`; reads and changes no host state (the caller sets
        `at` before and advances `pos` after), so the whole step can be captured in a CUDA graph when the
        experts call is graph-safe. Returns float32 logits [V]."""
        x = self.embed_tokens(token_ids)
        for layer in self.layers:
            x = self._layer(layer, x, 0, self.at)
        return self.logits(x[-1])

    @torch.inference_mode()
    def prefill(self, token_ids, chunk: int, all_logits: bool = False) -> torch.Tensor:
        """Feed a prompt in chunks of `chunk` tokens (the last may be shorter). Returns float32 logits of
        the last token [V], or of every token [T, V] with all_logits."""
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1 token, got {chunk}")
        ids = torch.as_tensor(token_ids, dtype=torch.long).to(self.device).reshape(-1)
        if ids.numel() == 0:
            raise ValueError("prefill needs at least one token")
        if self.pos + ids.numel() > self.context:
            raise ValueError(f"{self.pos} cached + {ids.numel()} prompt tokens exceed the context of {self.context}")
        out = [self.forward(ids[s:s + chunk], all_logits) for s in range(0, ids.numel(), chunk)]
        return torch.cat(out) if all_logits else out[-1]

    @torch.inference_mode()
    def decode_step(self, token, static: bool | None = None, greedy: bool = False, pick=None) -> torch.Tensor:
        """One token (an int, or a one-element int64 tensor already on the device: no host copy) at position
        pos. Returns float32 logits [V], or with `greedy` (their argmax) or `pick` (`engine.picks`) the next token,
        int64 [1] on the device. static: shapes independent of the position (`forward`); by default static when a
        `step_runner` is set (it then runs the step)."""
        if greedy:
            pick = GREEDY
        static = self.step_runner is not None if static is None else static
        ids = self._token_ids(token)
        if pick is not None and not static:
            return pick(self.forward(ids))
        return self.forward(ids, static=static, pick=pick)

    def _token_ids(self, token) -> torch.Tensor:
        """A token (an int, or a one-element tensor: kept on the device, no host copy) as int64 [1] on the device."""
        if isinstance(token, torch.Tensor):
            return token.reshape(1).to(device=self.device, dtype=torch.long)
        return torch.tensor([int(token)], dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def decode_block(self, token, n: int, greedy: bool = False, pick=None) -> torch.Tensor:
        """n tokens decoded one after the other from `token` (as `decode_step`), each picked token the next step's
        input: their ids int64 [n] on the device. A step runner that chains steps (`DeviceDecode.blocks`, n at most
        its `k`) runs them in one launch; otherwise n `decode_step`s."""
        pick = GREEDY if greedy else pick
        if pick is None:
            raise ValueError("decode_block picks each token on the device: pass greedy=True or a pick")
        if n == 1:
            return self.decode_step(token, pick=pick)
        r = self.step_runner
        if getattr(r, "blocks", False) and n <= r.k:
            if self.pos + n > self.context:
                raise ValueError(f"{self.pos} cached + {n} new tokens exceed the context of {self.context}")
            out = r(self._token_ids(token), pick=pick, n=n)
            self.pos += n
            return out
        out = []
        for _ in range(n):
            token = self.decode_step(token, pick=pick)
            out.append(token.clone())        # a runner's `tok` is rewritten by the next step
        return torch.cat(out)
