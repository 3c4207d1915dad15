"""Diagnostic (CPU or GPU, seconds): where the router lookahead takes its hidden state, and what it costs in precision.

    python3 benchmarks/tools/lookahead_point.py [--model DIR] [--sequences 12] [--tokens 512] [--depth 2]

The trace's lookahead (benchmarks/moe/trace.py, core/routing/TRACE.md) applies MoE layer i+d's gate to the output
of MoE layer i's decoder layer, so the engine knows its guesses when layer i ends: the NVMe stager then has until
layer i+1 asks (its attention and router, about 60 us on bench-moe) to read them. Taken instead from the residual
after layer i's attention (the input of its post-attention norm: when layer i's router runs), the guesses would be
known a whole MoE layer earlier (its fused call and its own wait for the stager). This prints, per depth, the share of
the guessed top-k that layer i+d routes to (precision = recall at top-k), both ways, over held-out sequences of a
checkpoint (default: the committed fixture, tests/data/fixture-moe, with its heldout_tokens.npz; a trained bench-moe
folder on the device machine). float32, teacher-forced, as the traces. Not a benchmark: no results file.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from moe.model import GateTap, moe_layer_indices  # noqa: E402


def precision_by_point(model, tokens: np.ndarray, depth: int) -> dict[tuple[str, int], list[float]]:
    """{("output" | "attention", d): per MoE layer i, the share of the gate's top-k on that point's hidden state of
    layer i that MoE layer i+d routes to, over the tokens of one sequence}."""
    layer_ids = moe_layer_indices(model)
    k = model.config.num_experts_per_tok
    points: dict[str, dict[int, torch.Tensor]] = {"output": {}, "attention": {}}
    hooks = []
    for j in layer_ids:
        layer = model.model.layers[j]
        hooks.append(layer.register_forward_hook(
            lambda _m, _i, o, j=j: points["output"].__setitem__(j, o[0] if isinstance(o, tuple) else o)))
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(
            lambda _m, inp, j=j: points["attention"].__setitem__(j, inp[0])))
    tap = GateTap(model)
    try:
        with torch.no_grad():
            model.model(input_ids=torch.as_tensor(tokens, dtype=torch.long, device=model.device)[None], use_cache=False)
        routed = [idx for _, _, idx in tap.out]                  # [T * k] per MoE layer, in layer order
    finally:
        tap.close()
        for h in hooks:
            h.remove()
    n = len(tokens)
    out: dict[tuple[str, int], list[float]] = {}
    for i in range(len(layer_ids)):
        for d in range(1, depth + 1):
            if i + d >= len(layer_ids):
                continue
            target = model.model.layers[layer_ids[i + d]]
            truth = routed[i + d].reshape(n, k).cpu().numpy()
            for name, hidden in points.items():
                with torch.no_grad():
                    _, _, idx = target.mlp.gate(target.post_attention_layernorm(hidden[layer_ids[i]].reshape(n, -1)))
                guess = idx.reshape(n, k).cpu().numpy()
                share = np.mean([len(set(g) & set(t)) / k for g, t in zip(guess, truth)])
                out.setdefault((name, d), []).append(float(share))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "tests" / "data" / "fixture-moe")
    ap.add_argument("--sequences", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=512, help="of each held-out sequence, at most")
    ap.add_argument("--depth", type=int, default=2)
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    if torch.cuda.is_available():
        model = model.to("cuda")
    held = np.load(a.model / "heldout_tokens.npz")
    tokens, seq = held["tokens"], held["sequence"]
    got: dict[tuple[str, int], list[float]] = {}
    used = 0
    for s in np.unique(seq):
        t = tokens[seq == s][:a.tokens]
        if len(t) < 32:
            continue
        for key, v in precision_by_point(model, t, a.depth).items():
            got.setdefault(key, []).extend(v)
        used += 1
        if used == a.sequences:
            break
    print(f"{a.model.name}: {used} held-out sequences of at most {a.tokens} tokens (MEASURED, teacher-forced, float32)")
    for d in range(1, a.depth + 1):
        row = {name: np.mean(got[(name, d)]) for name in ("output", "attention") if (name, d) in got}
        print(f"  depth {d}: precision from layer i's output {row.get('output', float('nan')):.3f}, "
              f"from its residual after attention (the router's moment) {row.get('attention', float('nan')):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
