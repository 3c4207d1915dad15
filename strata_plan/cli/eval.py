"""`strata-plan eval --packed DIR --reference CHECKPOINT`: how close a packed model's next-token
distributions are to its reference's on held-out text, computed through the engine (engine/eval.py):
top-1 and top-5 agreement, mean and 99th-percentile KL divergence, perplexity of each.

Default text: the checkpoint's `heldout_tokens.npz` when it has one (the committed fixture does); else
`--text FILE` is required and tokenized with the checkpoint's tokenizer."""
from __future__ import annotations

from pathlib import Path

from strata_plan.cli._common import add_json, console, print_json, table
from strata_plan.errors import UserError

HELDOUT = "heldout_tokens.npz"


def register(sub) -> None:
    p = sub.add_parser("eval", help="fidelity of a packed model against its reference (top-1/5, KL, perplexity)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--packed", required=True, help="packed model folder (strata-plan pack)")
    p.add_argument("--reference", required=True, help="the checkpoint it was packed from (config.json + safetensors)")
    p.add_argument("--text", help=f"held-out text file (default: the checkpoint's {HELDOUT} when it has one)")
    p.add_argument("--tokens", type=int, help="compare at most this many tokens, in whole chunks (default: all)")
    p.add_argument("--chunk", type=int, default=512, help="tokens per window, each run from an empty cache "
                   "(default 512, or the model's positions if fewer)")
    p.add_argument("--plan", help="plan YAML for the packed folder (default: every expert resident; tiers never "
                   "change the logits)")
    p.add_argument("--device", default="", help="cuda or cpu (default: cuda when there is a GPU)")
    p.add_argument("--backend", default="auto", choices=("auto", "torch"), help="the fused MoE: auto (Triton on a GPU) "
                   "or torch (its float32 reference over the dequantized weights: weight quantization alone)")
    add_json(p, "print the figures as JSON")
    p.set_defaults(func=cmd_eval)


def held_out_tokens(reference: str, text: str | None) -> tuple[list[int], str]:
    """(token ids, where they came from): --text tokenized with the checkpoint's tokenizer, else the
    checkpoint's heldout_tokens.npz."""
    ref = Path(reference)
    if text is None:
        if not (ref / HELDOUT).is_file():
            raise UserError("--text", "", f"required: {ref} has no {HELDOUT}", "give a held-out text file with --text FILE")
        import numpy as np
        return np.load(ref / HELDOUT)["tokens"].tolist(), str(ref / HELDOUT)
    p = Path(text)
    if not p.is_file():
        raise UserError(str(p), "--text", "file not found", "give an existing text file")
    from strata_plan.engine.eval import load_config
    from strata_plan.engine.generate import encode_prompt, load_tokenizer
    cfg = load_config(ref, "--reference")
    return encode_prompt(load_tokenizer(ref), p.read_text(encoding="utf-8", errors="replace"), cfg, ref), str(p)


def cmd_eval(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from strata_plan.engine.engine import resolve_device
    from strata_plan.engine.eval import evaluate, load_config
    resolve_device(args.device)                         # before any work: a device this torch lacks is one line
    if not Path(args.packed).is_dir():
        raise UserError(args.packed, "--packed", "folder not found", "give a folder written by strata-plan pack")
    if not Path(args.reference).is_dir():
        raise UserError(args.reference, "--reference", "folder not found", "give the checkpoint folder it was packed from")
    if args.plan and not Path(args.plan).is_file():
        raise UserError(args.plan, "--plan", "file not found", "give a plan YAML, or leave --plan out")
    chunk = min(args.chunk, load_config(args.packed, "--packed").max_positions)
    tokens, source = held_out_tokens(args.reference, args.text)
    with Progress(TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console(stderr=True), transient=True) as bar:
        task = bar.add_task("chunks", total=None)
        f = evaluate(args.packed, args.reference, tokens, chunk, args.tokens, args.plan, args.device, source, args.backend,
                     on_chunk=lambda done, total: bar.update(task, completed=done, total=total))
    data = {"packed": args.packed, "reference": args.reference, "text": source, "backend": args.backend,
            "label": "measured", **f.to_data()}
    if args.json:
        print_json(data)
        return 0
    t = table("metric", "measured", title=f"{args.packed} against {args.reference}: {f.predictions} next tokens "
              f"({f.chunks} x {f.chunk}) of {source}")
    t.add_row("top-1 agreement", f"{100 * f.top1:.2f}%")
    t.add_row("top-5 agreement", f"{100 * f.top5:.2f}%")
    t.add_row("KL divergence, mean (nats/token)", f"{f.kl_mean:.4f}")
    t.add_row("KL divergence, 99th percentile", f"{f.kl_p99:.4f}")
    t.add_row("perplexity, packed", f"{f.ppl_packed:.3f}")
    t.add_row("perplexity, reference", f"{f.ppl_reference:.3f}")
    t.add_row("perplexity change", f"{100 * f.ppl_change:+.2f}%")
    console().print(t)
    return 0
