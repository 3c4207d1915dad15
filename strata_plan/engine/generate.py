"""Text in, text out: the checkpoint's tokenizer (`tokenizers`, tokenizer.json), greedy and sampled
decoding (temperature, top-p) and a `generate` loop over `MoEModel.prefill` / `decode_step`.

    tok = load_tokenizer(folder)
    text = generate_text(model, tok, "def main():", max_new_tokens=64, chunk=512, folder=folder,
                         sampling=Sampling(temperature=0.7, top_p=0.9, seed=1),
                         on_text=lambda s: print(s, end="", flush=True))
    # or by ids: generate(model, encode_prompt(tok, "def main():", model.cfg, folder), 64, chunk=512)

Each new token is copied to the host once (to stream it and to stop at an end-of-sequence id); the
sampling itself stays on the device.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from strata_plan.errors import UserError

from .config import ModelConfig
from .device_loop import TokenRing
from .picks import GumbelPick


def load_tokenizer(folder: str | Path):
    from tokenizers import Tokenizer
    p = Path(folder) / "tokenizer.json"
    if not p.exists():
        raise UserError(str(p), "", "file not found", "use a checkpoint folder with its tokenizer.json (copy it "
                        "into a packed folder)")
    return Tokenizer.from_file(str(p))


def encode_prompt(tokenizer, text: str, cfg: ModelConfig, folder: str | Path | None = None) -> list[int]:
    """The prompt's ids, with the BOS id in front when the checkpoint's tokenizer_config.json (in `folder`)
    asks for it (`add_bos_token`) and the tokenizer did not already put it there."""
    ids = tokenizer.encode(text).ids
    tc = Path(folder) / "tokenizer_config.json" if folder is not None else None
    add_bos = tc is not None and tc.exists() and bool(json.loads(tc.read_text(encoding="utf-8")).get("add_bos_token", False))
    if add_bos and cfg.bos_id is not None and (not ids or ids[0] != cfg.bos_id):
        ids = [cfg.bos_id, *ids]
    return ids


class TextStream:
    """Incremental detokenizer for streaming: push(id) returns the text the new token adds, held back
    while the text ends in an incomplete character (a byte-level token can split one)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.sent = tokenizer, [], 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        new, self.sent = text[self.sent:], len(text)
        return new


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0           # 0: greedy (argmax)
    top_p: float = 1.0                 # keep the smallest set of most likely tokens whose mass reaches top_p
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise UserError("--temperature", str(self.temperature), "negative", "use 0 (greedy) or more")
        if not 0 < self.top_p <= 1:
            raise UserError("--top-p", str(self.top_p), "outside (0, 1]", "use a mass in (0, 1]")


def device_pick(s: Sampling) -> GumbelPick | None:
    """The pick that draws `s`'s tokens inside a decode step (None: greedy); without a seed, a random one."""
    if s.temperature == 0:
        return None
    seed = s.seed if s.seed is not None else int(torch.randint(0, 1 << 62, (1,)))
    return GumbelPick(s.temperature, s.top_p, seed)


def next_token(model, token: torch.Tensor, s: Sampling, generator: torch.Generator | None = None,
               pick: GumbelPick | None = None) -> torch.Tensor:
    """One decode step from `token` to the next, int64 [1] on the device: greedy asks the model for the argmax, and a
    step runner that takes the pick (the device loop) draws a sampled token with `pick` inside the step's graph;
    otherwise sampling draws from the logits (`sample`)."""
    if s.temperature == 0:
        return model.decode_step(token, greedy=True)
    if pick is not None and getattr(model.step_runner, "picks", False):
        return model.decode_step(token, pick=pick)
    return sample(model.decode_step(token), s, generator)


def sample(logits: torch.Tensor, s: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits float32 [V] -> the next token, int64 [1] on the logits' device (no host copy)."""
    if s.temperature == 0:
        return logits.argmax().reshape(1)
    probs = torch.softmax(logits.float() / s.temperature, dim=-1)
    if s.top_p < 1:
        p, order = probs.sort(descending=True)
        drop = (p.cumsum(0) - p) >= s.top_p                 # the mass before this token already reaches top_p
        probs = torch.zeros_like(probs).scatter_(0, order, p.masked_fill(drop, 0.0))
    return torch.multinomial(probs, 1, generator=generator)


def check_length(n: int, max_new_tokens: int, context: int, max_positions: int = 0) -> None:
    """Refuse, in one line, `n` prompt tokens and `max_new_tokens` new ones that do not fit: the KV cache holds
    `context` tokens (the plan's) and the model knows `max_positions` (its config's max_position_embeddings;
    0: not given); the last new token is never fed back, so n + max_new_tokens - 1 positions are used."""
    if max_new_tokens < 1:
        raise UserError("--max-tokens", str(max_new_tokens), "must be at least 1", "ask for one token or more")
    if n == 0:
        raise UserError("--prompt", "", "the prompt has no tokens", "give a non-empty prompt")
    limit = min(context, max_positions) if max_positions > 0 else context
    if n + max_new_tokens - 1 <= limit:
        return
    if limit < context:
        why = f"the model's max_position_embeddings; the plan's context is {context}"
    elif max_positions > context:
        why = f"the plan's context; the model has {max_positions} positions"
    else:
        why = "the plan's context" + (" and the model's max_position_embeddings" if max_positions == context else "")
    more = f", or plan again with a larger --context (at most {max_positions})" if max_positions > context else ""
    if n > limit:
        keep = limit - max_new_tokens + 1
        fix = (f"shorten the prompt to at most {keep} tokens" if keep >= 1 else
               f"shorten the prompt and lower --max-tokens: together at most {limit + 1}")
        raise UserError("--prompt", f"{n} tokens", f"exceed the context of {limit} tokens ({why})", fix + more)
    raise UserError("--max-tokens", str(max_new_tokens), f"{n} prompt tokens + {max_new_tokens} new ones exceed the "
                    f"context of {limit} tokens ({why})",
                    f"pass --max-tokens {limit - n + 1} or fewer, or shorten the prompt" + more)


def generate(model, prompt_ids: Sequence[int], max_new_tokens: int, chunk: int, sampling: Sampling = Sampling(),
             eos_ids: Sequence[int] | None = None, on_token: Callable[[int], None] | None = None) -> list[int]:
    """Prefill the prompt (in chunks of `chunk`) from an empty cache and decode up to `max_new_tokens`
    tokens, stopping after an end-of-sequence id (default: the config's `eos_token_id`). Returns the
    new ids. With a step runner that chains steps (`device_loop.DeviceDecode.blocks`) a launch runs its `k` tokens
    (`EngineOptions.tokens_per_graph`), which reach the host together; with graphs (`ahead`) the next launch is queued
    before the host reads this one's tokens, so the GPU never waits for the host between tokens."""
    check_length(len(prompt_ids), max_new_tokens, model.context, getattr(model.cfg, "max_positions", 0))
    eos = set(model.cfg.eos_ids if eos_ids is None else eos_ids)
    gen = None
    if sampling.seed is not None:
        gen = torch.Generator(device=model.device)
        gen.manual_seed(sampling.seed)
    pick = device_pick(sampling)                            # drawn inside the step's graph on the device loop
    model.reset()
    logits = model.prefill(list(prompt_ids), chunk)
    token = sample(logits, sampling, gen)
    check = getattr(model.experts, "check", lambda: None)
    out: list[int] = []

    def emit(ids) -> bool:
        """Hand tokens out; True when the run is over (an end-of-sequence id, or max_new_tokens)."""
        check()                                             # a stager error stops the run before the token shows
        for t in ids:
            out.append(t)
            if on_token is not None:
                on_token(t)
            if t in eos or len(out) == max_new_tokens:
                return True
        return False

    runner = model.step_runner
    if getattr(runner, "blocks", False) and getattr(runner, "picks", False):   # k steps a launch (with graphs queued
        ring = TokenRing(width=runner.k, cuda=runner.ahead)                    # before the host reads their tokens)
        ring.push(token)
        left = max_new_tokens - 1                           # tokens still to launch
        while True:
            if left:                                        # queued behind the tokens not read yet (past an EOS: unused)
                n = min(runner.k, left)
                left -= n
                token = model.decode_block(token[-1:], n, pick=pick, greedy=pick is None)
                ring.push(token)
            if emit(ring.pop()):                            # waits for the oldest launch's tokens alone
                return out
    while not emit([int(token)]):                           # the host copy: stream it, check for EOS
        token = next_token(model, token, sampling, gen, pick)
    return out


def generate_text(model, tokenizer, prompt: str, max_new_tokens: int, chunk: int, sampling: Sampling = Sampling(),
                  folder: str | Path | None = None, on_text: Callable[[str], None] | None = None) -> str:
    """`generate` from text to text: encode (`encode_prompt`), decode, and stream the new text piece by
    piece to `on_text` (`TextStream`). Returns the new text (special tokens skipped)."""
    stream = TextStream(tokenizer)

    def token(t: int) -> None:
        piece = stream.push(t)
        if on_text is not None and piece:
            on_text(piece)

    new = generate(model, encode_prompt(tokenizer, prompt, model.cfg, folder), max_new_tokens, chunk, sampling,
                   on_token=token)
    return tokenizer.decode(new)
