"""Train a real MoE language model (DeepSeek-V3 / Kimi-K2 family) on the Python sources of this machine,
report its held-out perplexity, save a Hugging Face checkpoint and write its routing trace.

    python benchmarks/train_moe.py --size fixture --out OUT/fixture-moe --seconds 150
    python benchmarks/train_moe.py --size bench --out OUT/bench-moe --seconds 300
    python benchmarks/train_moe.py --size fixture --out /tmp/f --steps 400      # a fixed step count

The output folder gets config.json, model.safetensors (bf16), tokenizer.json, tokenizer_config.json,
train_log.json, heldout_tokens.npz (the token ids the trace was taken on), heldout.txt (the first held-out files'
text, about 1 MB: what tools that tokenize for themselves, such as llama.cpp, read) and <name>.trace.npz. With
`--seconds`, a short probe on a copy of the model times one step and the step count is set to fit; the log
records it, and `--steps` with that count repeats the run. benchmarks/TRAINING.md reports what was run.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch


from strata_plan.errors import UserError  # noqa: E402

from moe import corpus as C  # noqa: E402
from moe.model import SHAPES, MoEShape, build_model, keep_router_bias_fp32  # noqa: E402
from moe.trace import heldout_sequences, routing_trace, write_trace  # noqa: E402
from moe.train import TrainSettings, evaluate, fit, steps_for, windows  # noqa: E402

DEFAULTS = {"fixture-moe": TrainSettings(lr=3e-3), "bench-moe": TrainSettings(lr=1e-3), "peer-moe": TrainSettings(lr=1e-3)}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prepare(shape: MoEShape, corpus: C.Corpus, tokenizer_bytes: int, eval_windows: int, seq_len: int):
    """Tokenizer trained on the first `tokenizer_bytes` of the train split; train windows and the first
    `eval_windows` held-out windows."""
    held_out_bytes = 8 * eval_windows * seq_len   # code runs 3-4 bytes a token: twice what is needed
    sample, n = [], 0
    for f in corpus.train:
        if n >= tokenizer_bytes:
            break
        sample.append(f.text)
        n += f.n_bytes
    t0 = time.perf_counter()
    tok = C.train_tokenizer(sample, shape.vocab)
    t1 = time.perf_counter()
    train = C.stream(C.encode_files(tok, corpus.train))
    held = C.stream(C.encode_files(tok, corpus.held_out_prefix(held_out_bytes)))
    t2 = time.perf_counter()
    info = {"vocab": tok.get_vocab_size(), "tokenizer_train_bytes": n, "tokenizer_seconds": round(t1 - t0, 1),
            "encode_seconds": round(t2 - t1, 1), "train_tokens": int(len(train)), "held_out_tokens": int(len(held)),
            "train_bytes_per_token": round(corpus.train_bytes / len(train), 3)}
    log(f"{shape.name}: tokenizer {info['vocab']} ids on {n / 1e6:.1f} MB in {t1 - t0:.1f} s; "
        f"{len(train) / 1e6:.1f} M train / {len(held) / 1e6:.2f} M held-out tokens in {t2 - t1:.1f} s")
    return tok, windows(train, seq_len), windows(held, seq_len)[:eval_windows], info


def write_checkpoint(model, tok, out: Path) -> None:
    """config.json, model.safetensors in bf16 (router biases float32), tokenizer.json, tokenizer_config.json."""
    model.to(torch.bfloat16)
    keep_router_bias_fp32(model)
    model.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": C.EOT, "eos_token": C.EOT,
        "unk_token": None, "model_max_length": model.config.max_position_embeddings}, indent=2) + "\n")


def load_reference(out: Path, device: str):
    """The saved checkpoint in float32 with the reference experts: what evaluation and traces run on."""
    from transformers import DeepseekV3ForCausalLM
    model = DeepseekV3ForCausalLM.from_pretrained(out, dtype=torch.float32, experts_implementation="eager")
    return model.to(device).eval()


def run(shape: MoEShape, corpus: C.Corpus, out: Path, args, device: str) -> dict:
    settings = replace(DEFAULTS[shape.name], seed=args.seed, seq_len=args.seq_len, batch=args.batch)
    tok, train_w, held_w, data_info = prepare(shape, corpus, args.tokenizer_mb * 10**6, args.eval_windows,
                                              settings.seq_len)
    cuda = device == "cuda"
    bf16 = (args.precision or ("bf16" if cuda else "fp32")) == "bf16"
    model = build_model(shape, args.seed, experts_impl=args.experts or ("grouped_mm" if cuda else "eager")).to(device)
    if bf16:
        model.to(torch.bfloat16)
        keep_router_bias_fp32(model)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{shape.name}: {n_params / 1e6:.1f} M parameters, {len(train_w)} train windows of {settings.seq_len}")
    if len(train_w) < settings.batch or len(held_w) == 0:
        raise UserError("--corpus-mb", str(args.corpus_mb), f"{len(train_w)} train / {len(held_w)} held-out windows of "
                        f"{settings.seq_len} tokens for a batch of {settings.batch}", "give the corpus more text")
    steps, probe = (args.steps, None) if args.steps else steps_for(model, shape, train_w, settings, args.seconds, log=log)
    log(f"{shape.name}: training {steps} steps of {settings.batch} x {settings.seq_len} tokens")
    tlog = fit(model, shape, train_w, settings, steps, seconds_limit=args.seconds * 1.15 if args.seconds else None,
               log=log)
    log(f"{shape.name}: trained in {tlog.seconds:.0f} s ({tlog.tokens / 1e6:.1f} M tokens, "
        f"{tlog.tokens_per_second / 1e3:.0f} k tok/s), last loss {tlog.loss[-1]:.3f}")
    out.mkdir(parents=True, exist_ok=True)
    write_checkpoint(model, tok, out)
    del model
    if cuda:
        torch.cuda.empty_cache()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    ref = load_reference(out, device)
    t0 = time.perf_counter()
    ev = evaluate(ref, held_w, C.token_byte_lengths(tok))
    log(f"{shape.name}: held-out loss {ev['loss']:.4f}, perplexity {ev['perplexity']:.2f}, "
        f"{ev['bits_per_byte']:.3f} bits/byte over {ev['tokens']} tokens ({time.perf_counter() - t0:.1f} s)")
    seqs, keys = heldout_sequences(tok, corpus.held_out, settings.seq_len, args.trace_tokens)
    t0 = time.perf_counter()
    arrays = routing_trace(ref, seqs, depth=4)
    source = (f"{shape.name} trained by benchmarks/train_moe.py (seed {args.seed}, {tlog.steps} steps) on Python "
              f"sources; teacher-forced on {len(seqs)} held-out files, float32 forward of the bf16 checkpoint")
    write_trace(out / f"{shape.name}.trace.npz", ref, shape.name, arrays, source)
    np.savez_compressed(out / "heldout_tokens.npz", tokens=np.concatenate(seqs), sequence=arrays["sequence"],
                        files=np.array(json.dumps(keys)))
    (out / "heldout.txt").write_text("\n".join(f.text for f in corpus.held_out_prefix(1 << 20)))   # 1 MB: peers' text
    log(f"{shape.name}: trace of {len(arrays['sequence'])} tokens in {len(seqs)} sequences "
        f"({time.perf_counter() - t0:.1f} s)")
    record = {"model": shape.name, "shape": shape.to_dict(), "parameters": n_params, "device": _device_name(device),
              "torch": torch.__version__, "transformers": _version("transformers"),
              "tokenizers": _version("tokenizers"), "python": platform.python_version(),
              "corpus": corpus.summary(), "data": data_info, "train": tlog.to_dict(), "held_out": ev,
              "repeat": _repeat(probe, tlog),
              "trace": {"tokens": int(len(arrays["sequence"])), "sequences": len(seqs), "files": keys},
              "balancing": "aux-loss-free bias (DeepSeek-V3): bias -/+ gamma per step for over/under-loaded "
                           "experts, plus the sequence-wise balance loss with alpha = seq_aux_alpha",
              "command": " ".join([Path(sys.executable).name, *sys.argv])}
    (out / "train_log.json").write_text(json.dumps(record, indent=1) + "\n")
    if args.result_dir:
        from _result import write_result
        metrics = {"parameters_M": round(n_params / 1e6, 2), "train_steps": tlog.steps, "train_tokens_M":
                   round(tlog.tokens / 1e6, 2), "train_seconds": round(tlog.seconds, 1),
                   "train_tokens_per_s": round(tlog.tokens_per_second), "final_train_loss": round(tlog.loss[-1], 4),
                   "held_out_loss": round(ev["loss"], 4), "held_out_perplexity": round(ev["perplexity"], 3),
                   "held_out_bits_per_byte": round(ev["bits_per_byte"], 4), "held_out_tokens": ev["tokens"],
                   "trace_tokens": int(len(arrays["sequence"]))}
        write_result(f"train-{shape.name}", metrics, command=record["command"], out_dir=args.result_dir,
                     notes=f"{shape.name} trained on {_device_name(device)}; held-out = 2% of .py files by content "
                           "hash; perplexity per token of this model's own tokenizer, bits/byte comparable")
    return record


def _repeat(probe, tlog) -> dict | None:
    """The probe's losses against the run's first steps (same seed, weights and batches)."""
    if probe is None:
        return None
    n = min(probe.steps, tlog.steps)
    diff = [abs(a - b) for a, b in zip(probe.loss[:n], tlog.loss[:n])]
    return {"steps": n, "probe_loss": [round(x, 5) for x in probe.loss[:n]], "max_abs_diff": max(diff)}


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine()


def _version(mod: str) -> str:
    try:
        return __import__(mod).__version__
    except ImportError:
        return "missing"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=["fixture", "bench", "peer"], required=True, help="which model (see moe/model.py)")
    p.add_argument("--out", type=Path, required=True, help="checkpoint and trace folder")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--seconds", type=float, help="training time budget (a probe sets the step count)")
    g.add_argument("--steps", type=int, help="fixed number of optimizer steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--corpus-mb", type=float, default=None, help="cap on train text (MB), default all")
    p.add_argument("--tokenizer-mb", type=int, default=24, help="train text the tokenizer learns from (MB)")
    p.add_argument("--eval-windows", type=int, default=256, help="held-out windows for perplexity")
    p.add_argument("--trace-tokens", type=int, default=4096, help="tokens in the routing trace")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", choices=["bf16", "fp32"], default=None,
                   help="training weights (float32 master copies either way); default bf16 on a GPU")
    p.add_argument("--experts", choices=["eager", "grouped_mm", "batched_mm"], default=None,
                   help="transformers' experts implementation for training; default grouped_mm on a GPU")
    p.add_argument("--result-dir", type=Path, default=None, help="also write a benchmark result JSON here")
    p.add_argument("--source-root", type=Path, action="append", default=None,
                   help="read .py files from here instead of the interpreter's library (repeatable)")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1 or args.seconds is not None and args.seconds <= 0:
        p.error("--steps / --seconds must be positive")
    try:
        corpus = read_corpus(args)
        run(SHAPES[f"{args.size}-moe"], corpus, args.out, args, args.device)
    except UserError as e:
        print(e.line(), file=sys.stderr)
        return 2
    return 0


def read_corpus(args) -> C.Corpus:
    roots = [(r.name, r.resolve()) for r in args.source_root] if args.source_root else C.python_source_roots()
    t0 = time.perf_counter()
    files = C.read_sources(roots)
    where = "--source-root" if args.source_root else "the interpreter's library"
    cap = int(args.corpus_mb * 1e6) if args.corpus_mb else None
    corpus = C.split(files, cap)
    if not corpus.train or not corpus.held_out:
        raise UserError(where, ", ".join(str(r) for _, r in roots),
                        f"{len(files)} readable .py files: too few for a train and a held-out split",
                        "point --source-root at folders holding many Python sources")
    log(f"corpus: {len(files)} distinct .py files from {', '.join(str(r) for _, r in roots)} in "
        f"{time.perf_counter() - t0:.1f} s; {corpus.summary()}")
    return corpus


if __name__ == "__main__":
    raise SystemExit(main())
