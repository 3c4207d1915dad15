"""llama.cpp beside the engine on one checkpoint, at the same share of routed-expert bytes on the GPU.

    python benchmarks/peers/bench_peer.py --checkpoint CKPT --llama-bin build/bin --work DIR --text FILE \
        [--calib-text FILE2] --out-dir $OUT [--types q2_k,iq2_xxs,iq1_s] [--ours q2_g16_s8m4,q2_g32_s8m8,q1_g32_s8m4] \
        [--cpu-moe-layers N] [--threads 16]

Per llama.cpp type (`--types`, with `--ours` the engine's format of the nearest bits per weight, pairwise):
1. GGUF: F32 (the KL base) and BF16 (`to_gguf.py`); an importance matrix from `--calib-text` (`llama-imatrix`, on
   held-out text past the scored part); the routed experts quantized to the type, every other tensor kept BF16
   (`llama-quantize`, README.md).
2. llama.cpp, `llama-bench` (median of `--repeats`, prefill `--prompt` tokens, decode `--gen` tokens): every
   tensor on the GPU (`-ngl 99`, the ceiling); the probe, the experts of the first `--probe-cpu-layers` MoE layers
   on the CPU (llama.cpp's hand-off a CPU layer, measured: `one_type`); at the budget, the experts of the first
   `--cpu-moe-layers` MoE layers in RAM, computed by the CPU (`-ncmoe` counts decoder blocks, the leading dense one
   included, `--threads`); and the placement `strata-plan export --format llama.cpp` makes of the engine's plan
   below (`-ot`), made with the measured hand-off; the export's predictions of both beside them.
3. llama.cpp's KL divergence and top-1 agreement against the F32 GGUF on `--text` (`llama-perplexity`), after
   checking that its tokenizer gives the checkpoint's own ids on the text (`llama-tokenize`).
4. The engine on the same checkpoint: packed in the paired format, planned with the same share of each layer's
   experts in VRAM (the most used, by its routing trace) and the rest in pinned RAM; `strata-plan bench` in modes
   lru and on-demand, and `strata-plan eval` (KL and top-1 against the float checkpoint, the same text); once per
   format (a format paired with two types is measured once).
Rows are MEASURED; the budget is the share of routed-expert bytes on the GPU, the same on both sides (each side's
bytes at its own bits per weight are in the file). Writes peer-llama-cpp-<time>.json.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _plans import own_vram_budget, tiers_by_hand  # noqa: E402
from _result import record_failure, result_path, write_result  # noqa: E402

EXPERTS = "_exps"             # llama.cpp's routed-expert tensors: blk.N.ffn_{gate,up,down}_exps.weight
KEEP_BF16 = ("attn_=bf16", "_shexp=bf16", r"ffn_(gate|up|down)\.weight=bf16")
RAW = "--no-escape"           # llama.cpp's tools turn a text's "\n" into a newline by default: not on source code


def sh(cmd: list[str], log: Path) -> str:
    """Run a llama.cpp tool with its output in `log` (a file, not a pipe: through a pipe llama-perplexity's
    asynchronous logger lost its closing statistics) and return that output; a failure stops the benchmark."""
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    out = log.read_text(errors="replace")
    if r.returncode:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({r.returncode}); see {log}")
    return out


def quantize(bin_: Path, src: Path, out: Path, qtype: str, imatrix: Path | None, log: Path) -> None:
    """Routed experts to `qtype`, every other tensor BF16 (a Q8_0 base: with a BF16 base the tool copies)."""
    cmd = [str(bin_ / "llama-quantize")] + (["--imatrix", str(imatrix)] if imatrix else [])
    cmd += ["--tensor-type", f"{EXPERTS}={qtype}"]
    for t in KEEP_BF16:
        cmd += ["--tensor-type", t]
    sh(cmd + ["--token-embedding-type", "bf16", "--output-tensor-type", "bf16", str(src), str(out), "Q8_0"], log)


def llama_bench(bin_: Path, model: Path, args, extra: list[str], log: Path) -> dict:
    """Prefill and decode tok/s (medians of the repeats) of `llama-bench -o json`."""
    out = sh([str(bin_ / "llama-bench"), "-m", str(model), "-p", str(args.prompt), "-n", str(args.gen),
              "-r", str(args.repeats), "-t", str(args.threads), "-o", "json", *extra], log)
    rows = json.loads(out[out.index("["):out.rindex("]") + 1])
    got = {}
    for r in rows:
        key = "prefill_tok_s" if r["n_prompt"] else "decode_tok_s"
        got[key] = statistics.median(r["samples_ts"])
    return got


def llama_kl(bin_: Path, base: Path, model: Path, args, work: Path) -> dict:
    """Mean KL divergence and top-1 agreement of `model` against `base` on --text (`llama-perplexity`)."""
    kld = work / "base.kld"
    ctx = ["-f", args.text, RAW, "-c", str(args.chunk), "-t", str(args.threads), "-ngl", "99"]
    if not kld.exists():
        sh([str(args.llama_bin / "llama-perplexity"), "-m", str(base), *ctx, "--kl-divergence-base", str(kld)],
           work / "kl-base.log")
    out = sh([str(args.llama_bin / "llama-perplexity"), "-m", str(model), *ctx, "--kl-divergence-base", str(kld),
              "--kl-divergence"], work / f"kl-{model.stem}.log")
    mean = re.search(r"Mean\s+KLD:\s+([-\d.eE+]+)", out)
    top1 = re.search(r"Same top p:\s+([\d.]+)", out)
    return {"kl_mean": float(mean.group(1)) if mean else None, "top1": float(top1.group(1)) / 100 if top1 else None}


def same_ids(bin_: Path, gguf: Path, checkpoint: Path, text: str, log: Path) -> tuple[bool, int]:
    """Whether llama.cpp's tokenizer (`llama-tokenize`) gives the checkpoint's own ids on `text` (so both sides'
    KL is taken on the same token ids), and how many tokens."""
    import ast
    from tokenizers import Tokenizer
    out = sh([str(bin_ / "llama-tokenize"), "-m", str(gguf), "-f", text, "--ids", "--log-disable", "--no-bos", RAW], log)
    theirs = ast.literal_eval(out[out.index("["):out.rindex("]") + 1])
    ours = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(Path(text).read_text(),
                                                                          add_special_tokens=False).ids
    return ours == theirs, len(ours)


def cli_json(argv: list[str]) -> dict:
    """`strata-plan ARGV --json` in process: its JSON."""
    from strata_plan.cli import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv + ["--json"])
    if rc:
        raise RuntimeError(f"strata-plan {' '.join(argv)} failed ({rc})")
    text = buf.getvalue()
    return json.loads(text[text.index("{"):])


def our_plan(checkpoint: Path, fmt: str, vram_share: float, profile: str, work: Path) -> Path:
    """The planner's plan of the checkpoint, then per layer the `vram_share` most used experts static in VRAM
    and the rest in pinned RAM, every expert in `fmt`, no cache, no lookahead: the budget llama.cpp gets. Its VRAM
    budget is what it places there, so the export of it keeps to that budget (with the machine's, it put every
    layer on the GPU: the H100 run of 2026-12-05 16:33)."""
    from strata_plan.cli import main
    from strata_plan.core.plan import load_plan, save_plan
    path = work / f"plan-{fmt}.yaml"
    traces = sorted(checkpoint.glob("*.trace.npz"))
    stats = ["--stats", str(traces[0])] if traces else ["--prior", "olmoe-like"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["plan", "--model", str(checkpoint / "config.json"), *stats, "--profile", profile, "--trials", "8",
                     "--out", str(path), "--force"]) == 0
    save_plan(own_vram_budget(tiers_by_hand(load_plan(path), vram_share, 0, fmt), profile, str(path)), path)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--llama-bin", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--text", required=True, help="evaluation text (the held-out part of the corpus): KL and top-1")
    ap.add_argument("--calib-text", default=None, help="llama-imatrix's text, disjoint from --text (an importance "
                    "matrix from the scored text favours llama.cpp's rows); default --text, recorded as such")
    ap.add_argument("--types", default="q2_k,iq2_xxs,iq1_s", help="llama.cpp's types of the routed experts")
    ap.add_argument("--ours", default="q2_g16_s8m4,q2_g32_s8m8,q1_g32_s8m4", help="the engine's format paired with "
                    "each type, in order of bits per weight (2.625 / 2.06 / 1.56 against 2.81 / 2.56 / 1.44)")
    ap.add_argument("--cpu-moe-layers", type=int, default=6, help="llama.cpp's -ncmoe: MoE layers whose experts stay "
                    "in RAM; the engine keeps the same share of each layer's expert bytes in RAM")
    ap.add_argument("--probe-cpu-layers", type=int, default=2, help="MoE layers whose experts the probe puts on the "
                    "CPU, to measure llama.cpp's hand-off a CPU layer")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--device", default="")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    metrics, runs, errors = {}, {}, []
    path = result_path("peer-llama-cpp", a.out_dir)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))      # `timeout`: still write what was measured

    t0, keys = time.monotonic(), set()

    def save() -> None:                                 # after every row: a failure or a kill keeps the rows done
        write_result("peer-llama-cpp", metrics, out_dir=a.out_dir, path=path, extra={"runs": runs, "errors": errors})
        new = sorted(set(metrics) - keys)
        keys.update(new)
        if new:                                         # the log says where the call's time went
            print(f"[{time.monotonic() - t0:6.0f} s] {', '.join(new)}", flush=True)

    try:
        rows(a, metrics, runs, errors, save)
    finally:
        save()
    print(json.dumps(metrics, indent=1))
    print(path, f"({len(errors)} failed)" if errors else "")
    return 1 if errors else 0


def rows(a, metrics: dict, runs: dict, errors: list, save) -> None:
    """Every row of `main`, saved as they come; a type whose rows fail is recorded in `errors`, the next goes on."""
    from strata_plan.engine.config import ModelConfig
    a.moe_layers = tuple(ModelConfig.load(a.checkpoint).moe_layers)     # decoder layer = llama.cpp block index
    n_moe = len(a.moe_layers)
    vram_share = (n_moe - a.cpu_moe_layers) / n_moe
    f32, bf16 = a.work / "model-f32.gguf", a.work / "model-bf16.gguf"
    for path, kind in ((f32, "f32"), (bf16, "bf16")):
        if not path.exists():
            subprocess.run([sys.executable, str(HERE / "to_gguf.py"), str(a.checkpoint), str(path), "--outtype", kind],
                           check=True, capture_output=True)
    same, n_tokens = same_ids(a.llama_bin, bf16, a.checkpoint, a.text, a.work / "tokenize.log")
    if not same:
        raise SystemExit(f"llama.cpp's tokenizer gives other ids than the checkpoint's on {a.text}: the KLs would not "
                         "compare; see to_gguf.py's pre-tokenizer")
    imatrix = a.work / "imatrix.dat"
    calib = a.calib_text or a.text
    metrics["text.imatrix_on_scored_text"] = float(Path(calib).resolve() == Path(a.text).resolve())
    sh([str(a.llama_bin / "llama-imatrix"), "-m", str(bf16), "-f", calib, RAW, "-o", str(imatrix), "-c", str(a.chunk),
        "-t", str(a.threads), "-ngl", "99"], a.work / "imatrix.log")
    metrics.update({"budget.vram_share_of_expert_bytes": vram_share, "budget.llama_cpu_moe_layers": a.cpu_moe_layers,
                    "budget.llama_ncmoe": a.moe_layers[a.cpu_moe_layers - 1] + 1,
                    "text.tokens": n_tokens, "text.llama_ids_equal": 1.0})
    for qtype, fmt in zip(a.types.split(","), a.ours.split(",")):
        try:
            one_type(a, qtype, fmt, f32, bf16, imatrix, vram_share, metrics, runs, save)
        except Exception as err:                        # noqa: BLE001 (recorded; the next type goes on)
            record_failure(errors, f"{qtype}/{fmt}", err)
        save()


def cpu_layer_model(plan: Path, profile: str, us: float = 0.0, cost=None):
    """The export's llama.cpp model of `plan` (`LlamaCppCost`) with a hand-off of `us` a CPU layer (0: what the CPU
    layers' bytes alone add to a token); `cost`: a cost model of the same problem to reuse."""
    import dataclasses
    from strata_plan.planner.export import DEFAULT_CPU_LAYER_US, LlamaCppCost
    from strata_plan.planner.make import load_plan_problem
    _, problem = load_plan_problem(str(plan), profile, None)
    return LlamaCppCost(problem, cost, cpu_layer=dataclasses.replace(DEFAULT_CPU_LAYER_US, value=us))


def cpu_seconds(model, cpu_layers) -> float:
    """Seconds a token the model's CPU layers (MoE-layer positions) add to every layer on the GPU: their bytes at the
    RAM rate and their hand-offs, less their fused expert calls on the GPU."""
    gpu = [j not in set(cpu_layers) for j in range(len(model.t_exp))]
    return 1 / model.predict(gpu)[1].decode_tok_s - 1 / model.gpu_pred.decode_tok_s


def one_type(a, qtype: str, fmt: str, f32: Path, bf16: Path, imatrix: Path, vram_share: float, metrics: dict,
             runs: dict, save) -> None:
    """llama.cpp at `qtype` and the engine at `fmt`: speed rows, then quality rows (each saved as it lands).

    The hand-off a CPU layer costs llama.cpp is measured on the probe (`--probe-cpu-layers`, the first MoE layers'
    experts on the CPU): its extra seconds a token over every layer on the GPU, less what the export's model counts
    for those layers' bytes, per layer. The export is then made with that figure (`--cpu-layer-us`), and the budget
    and export placements, which put other numbers of layers on the CPU, are predicted with it: the extra time a
    token of their CPU layers, predicted beside measured, checks the model; the absolute tok/s adds the cost model's
    GPU time, which is strata-plan's kernels', not llama.cpp's."""
    model = a.work / f"model-{qtype}.gguf"
    quantize(a.llama_bin, bf16, model, qtype, imatrix, a.work / f"quantize-{qtype}.log")
    plan = our_plan(a.checkpoint, fmt, vram_share, a.profile, a.work)
    moe = list(a.moe_layers)
    measured = {}

    def bench(where: str, extra: list[str]) -> None:
        for k, v in llama_bench(a.llama_bin, model, a, extra, a.work / f"bench-{qtype}-{where}.log").items():
            metrics[f"llama.{qtype}.{where}.{k}"] = v
        measured[where] = 1 / metrics[f"llama.{qtype}.{where}.decode_tok_s"]
        save()

    # -ncmoe N: the expert tensors of blocks 0..N-1 on the CPU (dense leading blocks have none)
    bench("gpu", ["-ngl", "99"])
    bench("probe", ["-ngl", "99", "-ncmoe", str(moe[a.probe_cpu_layers - 1] + 1)])
    bare = cpu_layer_model(plan, a.profile)
    h_us = 1e6 * ((measured["probe"] - measured["gpu"]) - cpu_seconds(bare, range(a.probe_cpu_layers))) \
        / a.probe_cpu_layers
    metrics[f"llama.{qtype}.cpu_layer_us"] = h_us
    m = cpu_layer_model(plan, a.profile, max(h_us, 0.0), bare.cost)
    export = cli_json(["export", str(plan), "--format", "llama.cpp", "--cpu-layer-us", f"{m.cpu_layer.value:.3f}",
                       *(["--gpu-buffer", "CPU"] if a.device == "cpu" else [])])     # a CPU build has no CUDA0
    runs[f"export/{fmt}"] = export
    placements = {"budget": (range(a.cpu_moe_layers), ["-ncmoe", str(moe[a.cpu_moe_layers - 1] + 1)]),
                  "export": ([moe.index(layer) for layer in export["cpu_layers"]], export["override_args"])}
    for where, (cpu, args) in placements.items():
        bench(where, ["-ngl", "99", *args])
        dt = cpu_seconds(m, cpu)
        metrics[f"llama.{qtype}.{where}.cpu_layers"] = len(cpu)
        metrics[f"llama.{qtype}.{where}.cpu_layers_ms_a_token"] = (measured[where] - measured["gpu"]) * 1e3
        metrics[f"llama.{qtype}.{where}.predicted_cpu_layers_ms_a_token"] = dt * 1e3
        metrics[f"llama.{qtype}.{where}.predicted_decode_tok_s"] = 1 / (1 / m.gpu_pred.decode_tok_s + dt)
    metrics[f"llama.{qtype}.gpu.predicted_decode_tok_s"] = m.gpu_pred.decode_tok_s
    save()
    for k, v in llama_kl(a.llama_bin, f32, model, a, a.work).items():
        metrics[f"llama.{qtype}.{k}"] = v
    metrics[f"llama.{qtype}.file_bytes"] = model.stat().st_size
    if f"ours.{fmt}.kl_mean" in metrics:              # the engine's rows at fmt are in: one format, one set of rows
        return
    packed = a.work / f"packed-{fmt}"
    cli_json(["pack", str(a.checkpoint), "--plan", str(plan), "--out", str(packed), "--force"])
    for mode in ("lru", "on-demand"):
        r = cli_json(["bench", "--packed", str(packed), "--plan", str(plan), "--mode", mode, "--tokens", str(a.gen),
                      "--warmup", "16", *(["--device", a.device] if a.device else [])])
        runs[f"ours/{fmt}/{mode}"] = r
        metrics[f"ours.{fmt}.budget.{mode}.decode_tok_s"] = r["measured"]["decode_tok_s"]
        metrics[f"ours.{fmt}.budget.{mode}.prefill_tok_s"] = r["measured"]["prefill_tok_s"]
        save()
    ev = cli_json(["eval", "--packed", str(packed), "--reference", str(a.checkpoint), "--text", a.text,
                   "--chunk", str(a.chunk), *(["--device", a.device] if a.device else [])])
    runs[f"ours/{fmt}/eval"] = ev
    metrics[f"ours.{fmt}.kl_mean"] = ev.get("kl_mean")
    metrics[f"ours.{fmt}.top1"] = ev.get("top1")


if __name__ == "__main__":
    raise SystemExit(main())
