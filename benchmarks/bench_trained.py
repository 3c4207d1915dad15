"""The engine on a trained MoE with its own router (real lookahead, no replay), in one run: retrain the
benchmark model of benchmarks/moe, plan it from this run's own routing trace under two budgets, pack it,
measure every plan in the engine's three modes, and set it beside transformers + accelerate offload of the
same checkpoint; check that the engine reproduces transformers' greedy tokens.

    python3 benchmarks/bench_trained.py --work /root/trained --out-dir $OUT --train-seconds 200   # an H200
    python3 benchmarks/bench_trained.py --smoke --work /tmp/trained-smoke                          # CPU, ~1.5 min

Stages (each one's failure is recorded and the later ones still run where they can):
1. train: `benchmarks/train_moe.py --size bench` (moe/: corpus, model, training, held-out trace with
   router lookahead), `--train-seconds` of training; or `--checkpoint DIR --trace NPZ` to skip it.
2. plan: budgets from `trained/budgets.py` (RAM-rich: no NVMe tier, 8% of routed bytes for experts in VRAM;
   seed proportions: 8% VRAM, 24% pinned RAM, the rest NVMe), each planned by `strata-plan plan --model
   <checkpoint> --stats <trace> --profile P --vram-gb/--ram-gb/--nvme-gb`; `strata-plan pack` in the plans'
   formats and as `bf16`.
3. engine: `engine.bench.measure` for each plan in modes plan / lru / on-demand (routing from the model's own
   router), decode tok/s = 1 / median seconds per token after `--warmup` tokens; beside it the cost model's
   prediction for the executed placement (trained/predict.py; the rows draw their tokens, `--sample`, and the
   prediction counts the draw's measured GPU time), bytes per tier per token, the seeds' hit rate, lookahead
   precision and recall by depth, wasted prefetch bytes, the bound of the bytes moved; for a plan without NVMe
   LRU-only once more with the argmax (`lru_greedy`: `draw_us_measured`, its step without the MoE calls against
   LRU-only's, beside the profile's `pick_us`); for the NVMe plan a plain O_DIRECT read of the same files, and at
   depth >= 2 the plan once more with the stager reading the deepest guesses alone (`plan_deepest`,
   EngineOptions.stage_depths: the cost model's count; A/B), and with the stager's reads the other way
   (EngineOptions.stager_io: `plan_threads`, reader threads, where the default is Linux native AIO; with
   `--io-repeats N`, N such runs interleaved with N - 1 more of the default, `plan` and `plan_again` among the
   default's; medians: `plan_aio_over_threads_measured`; A/B); with `--lookahead-repeats N`, the lookahead (the
   plan's depth, else `--lookahead-depth` forced) and on-demand N runs each, interleaved: medians
   `lookahead_over_ondemand_measured` beside the cost model's `_predicted` (`--lookahead-point-ab`: a third row with
   the guesses taken at each layer's router, the `lookahead` row at its end, `lookahead_router_over_lookahead_measured`
   and `_predicted`; A/B). `--lookahead-point` (default attention: at each layer's router; output: at its end) is
   where the budgets' plans take the NVMe guesses (`strata-plan plan --lookahead-point`), which their rows then follow
   (`<budget>.plan.lookahead_point`).
4. transformers: the checkpoint all on the device, and with accelerate offloading the routed experts
   (`device_map`: experts to "cpu", and for the seed budget the NVMe share to "disk" in an `offload_folder`),
   greedy decode of the same prompt, tok/s timed the same way.
5. equivalence: the model packed as bf16, run by the engine greedily (`engine.generate`, what `strata-plan
   run` calls), against transformers' greedy tokens from the BF16 checkpoint: float32 on the CPU (the exact
   check) and bf16 on the GPU (first divergence and how close the tie was).
6. hit rate by lookahead depth: each plan run in mode plan at every depth of `--depths`.
   After the engine rows (and again after the depth sweep, for its rows): stager, an NVMe plan's rows predicted
   again with the stager's host time its engine rows measured; run routing, every row predicted again on the
   routing of its own text (the prompt and the tokens its decode steps were given, teacher-forced as the held-out
   trace was: `trained/run_routing.py`), its experts ranked as the plan ranks them: the workload sample's share
   of a row's error told from the cost model's.
Writes engine-trained-<time>.json (benchmarks/_result.py) and prints a table. Every figure is labelled
measured, predicted or bound.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import io
import json
import shutil
import signal
import time
import traceback
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent

from _plans import forced_depth  # noqa: E402
from _result import on_timeout, result_path, stager_latency, write_result  # noqa: E402
from _watch import StagerWatch  # noqa: E402

from trained import hf  # noqa: E402
from trained.budgets import SEED_RAM_SHARE, VRAM_SHARE, achieved, budgets  # noqa: E402
from trained.predict import Predictor  # noqa: E402
from strata_plan.core.plan import LOOKAHEAD_POINTS  # noqa: E402
from strata_plan.planner.problem import DEFAULT_LOOKAHEAD_POINT  # noqa: E402
from strata_plan.errors import UserError  # noqa: E402

MODES = ("plan", "lru", "on-demand")
WATCH: StagerWatch | None = None      # opened with the first engine row
PROMPT = '''import os
import sys
from pathlib import Path


def read_config(path):
    """Read a configuration file and return its settings as a dictionary."""
    settings = {}
    with open(path) as f:
        for line in f:
'''
SMOKE = {"train_seconds": None, "train_steps": 2, "trials": 24, "context": 256, "chunk": 32, "tokens": 4, "warmup": 4,
         "equiv_tokens": 6, "depths": "1,2"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cli(argv: list[str]) -> str:
    """Run a `strata-plan` command in-process; its stdout, or RuntimeError with its one-line error."""
    from strata_plan.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    if rc != 0:
        raise RuntimeError(f"strata-plan {' '.join(argv)}: exit {rc}: {err.getvalue().strip()}")
    return out.getvalue()


class Run:
    """The results so far: stages, errors, metrics (flat, every name says measured / predicted / bound)."""

    def __init__(self, args):
        self.args, self.t0 = args, time.perf_counter()
        self.metrics: dict = {}
        self.extra: dict = {"stages": {}, "errors": {}, "runs": {}, "plans": {}, "budgets": {}, "commands": [],
                            "transformers": {}, "equivalence": {}, "depth_sweep": {}}
        self.executed: dict = {}        # engine row -> (the plan as executed, its mode, its Predictor)
        self.stager_predictors: dict = {}   # plan -> its Predictor with the stager's host time its rows measured
        self.path = result_path("engine-trained", args.out_dir)   # rewritten after each stage and engine row

    def save(self, complete: bool = False) -> Path:
        """The results so far, atomically into one file (`complete`: False until the end), so a call cut short by
        `timeout` or a hang still brings back every stage and row that finished."""
        if complete:
            self.metrics["total_seconds"] = round(self.elapsed(), 1)
        return write_result("engine-trained", self.metrics, out_dir=self.args.out_dir, notes=NOTES, path=self.path,
                            extra={**self.extra, "complete": complete, "elapsed_s": round(self.elapsed(), 1),
                                   "settings": {k: v for k, v in vars(self.args).items()}})

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.args.deadline_s - self.elapsed()

    def do(self, name: str, fn, need_s: float = 0.0):
        """Run stage `name` (`fn()`), timed; its failure is recorded, not raised, and gives None. Skipped when
        less than `need_s` seconds of --deadline-s are left."""
        if need_s and self.left() < need_s:
            log(f"stage {name}: skipped ({self.left():.0f} s left of --deadline-s, it needs about {need_s:.0f})")
            self.extra["stages"][name] = {"skipped": f"{self.left():.0f} s left"}
            return None
        log(f"stage {name}")
        t = time.perf_counter()
        try:
            out = fn()
            self.extra["stages"][name] = {"seconds": round(time.perf_counter() - t, 1)}
            return out
        except Exception as e:      # noqa: BLE001 - a benchmark records what broke and carries on
            traceback.print_exc()
            self.extra["errors"][name] = f"{type(e).__name__}: {e}"
            self.extra["stages"][name] = {"seconds": round(time.perf_counter() - t, 1), "failed": True}
            log(f"stage {name} FAILED: {type(e).__name__}: {e}")
            return None
        finally:
            self.save()

    def ok(self, name: str) -> bool:
        s = self.extra["stages"].get(name, {})
        return bool(s) and not s.get("failed") and not s.get("skipped")


# ---- 1. train ------------------------------------------------------------------------------------------
def train(run: Run, a) -> tuple[Path, Path]:
    if a.checkpoint:
        return Path(a.checkpoint), Path(a.trace)
    import train_moe
    size = "fixture" if a.smoke else "bench"
    ckpt = Path(a.work) / f"{size}-moe"
    argv = ["--size", size, "--out", str(ckpt), "--corpus-mb", str(a.corpus_mb), "--trace-tokens", str(a.trace_tokens),
            "--seed", str(a.seed)]
    argv += ["--steps", str(a.train_steps)] if a.train_steps else ["--seconds", str(a.train_seconds)]
    if a.out_dir:
        argv += ["--result-dir", str(a.out_dir)]
    if a.smoke:
        argv += ["--batch", "2", "--seq-len", "128", "--eval-windows", "2", "--tokenizer-mb", "1", "--device", "cpu",
                 "--precision", "fp32", "--experts", "eager"]
    for root in a.source_root or []:
        argv += ["--source-root", root]
    run.extra["commands"].append("python3 benchmarks/train_moe.py " + " ".join(argv))
    if train_moe.main(argv) != 0:
        raise RuntimeError("train_moe.py failed (see its line above)")
    tl = json.loads((ckpt / "train_log.json").read_text())
    t, h = tl["train"], tl["held_out"]
    run.metrics.update({"train.steps": t["steps"], "train.seconds_measured": round(t["seconds"], 1),
                        "train.tokens_M": round(t["tokens"] / 1e6, 2),
                        "train.held_out_perplexity_measured": round(h["perplexity"], 3),
                        "train.held_out_bits_per_byte_measured": round(h["bits_per_byte"], 4),
                        "train.parameters_M": round(tl["parameters"] / 1e6, 2)})
    return ckpt, ckpt / f"{size}-moe.trace.npz"


def trace_statistics(run: Run, a, ckpt: Path, trace: Path) -> None:
    """What `plan --stats TRACE` reads from the trace: its warm-up (tokens not counted; the engine's warm-up
    must be at least that) and the lookahead precision / recall by depth (measured teacher-forced on
    held-out text: the inputs the engine's own lookahead figures compare with)."""
    from strata_plan.core.routing.sources import load_routing
    from strata_plan.core.routing import load_trace
    from strata_plan.core.spec import load_spec
    spec = load_spec(str(ckpt))
    st = load_routing(spec, stats=str(trace))
    warm = load_trace(str(trace), spec).n_tokens - st.tokens
    if a.warmup < warm:
        log(f"--warmup {a.warmup} raised to the statistics' warm-up, {warm} tokens")
        a.warmup = warm
    run.metrics["statistics_warmup_tokens"] = warm
    run.metrics["trace_tokens"] = st.tokens + warm
    for la in st.lookahead:
        run.metrics[f"trace.lookahead_d{la.depth}.precision_measured_offline"] = la.precision
        run.metrics[f"trace.lookahead_d{la.depth}.recall_measured_offline"] = la.recall


# ---- 2. plan and pack ------------------------------------------------------------------------------------
def plan_budget(run: Run, a, name: str, ckpt: Path, trace: Path) -> Path:
    """`strata-plan plan` under budget `name` (trained/budgets.py)."""
    path = Path(a.work) / f"plan-{name}.yaml"
    b = budgets(str(ckpt), str(trace), a.profile, a.context, a.chunk)[name]
    argv = ["plan", "--model", str(ckpt), "--stats", str(trace), "--profile", a.profile, "--context", str(a.context),
            "--chunk", str(a.chunk), "--trials", str(a.trials), *b.flags(), "--out", str(path), "--force", "--json"]
    point = getattr(a, "lookahead_point", DEFAULT_LOOKAHEAD_POINT)   # where the NVMe guesses are taken, priced
    argv[-4:-4] = ["--lookahead-point", point]
    summary = json.loads(cli(argv))
    run.extra["commands"].append("strata-plan " + " ".join(argv))
    from strata_plan.core.plan import load_plan
    plan = load_plan(path)
    got = achieved(plan)
    run.extra["budgets"][name] = {"budget": b.to_data(), "achieved": got}
    run.extra["plans"][name] = {"summary": summary, "yaml": path.read_text()}
    run.metrics.update({f"{name}.budget.vram_gb": b.vram / 1e9, f"{name}.budget.ram_gb": b.ram / 1e9,
                        f"{name}.budget.nvme_gb": b.nvme / 1e9, f"{name}.routed_gb": b.routed / 1e9,
                        f"{name}.plan.vram_experts_share": got["vram_experts_share"],
                        f"{name}.plan.static_share": got["static_share"],
                        f"{name}.plan.ram_share": got["ram_share"], f"{name}.plan.nvme_share": got["nvme_share"],
                        f"{name}.plan.prefetch_depth": plan.prefetch_depth, f"{name}.plan.cache_slots": plan.cache.total_slots,
                        f"{name}.plan.lookahead_point": plan.staging.point,
                        f"{name}.plan.decode_tok_s_predicted": plan.predicted.decode_tok_s})
    log(f"{name}: VRAM {b.vram / 1e9:.4f} GB (experts {got['vram_experts_share']:.1%} of {b.routed / 1e6:.1f} MB routed), "
        f"RAM {got['ram_share']:.1%}, NVMe {got['nvme_share']:.1%}; depth {plan.prefetch_depth}, "
        f"{plan.cache.total_slots} cache slots; PREDICTED {plan.predicted.decode_tok_s:.1f} tok/s")
    if plan.dense.streamed_layers:
        raise RuntimeError(f"the {name} plan streams dense layers, which the engine does not run yet")
    return path


def bf16_plan(plan_path: Path, out: Path) -> Path:
    """The plan with every expert in bf16 (the placement unchanged): what the bf16-packed folder runs."""
    from strata_plan.core.plan import load_plan, save_plan
    plan = load_plan(plan_path)
    every = tuple(range(plan.n_experts))
    layers = tuple(dataclasses.replace(l, formats={"bf16": every}) for l in plan.layers)
    return save_plan(dataclasses.replace(plan, layers=layers), out)


def pack(run: Run, a, ckpt: Path, plans: dict[str, Path]) -> dict[str, Path]:
    from strata_plan.core.plan import load_plan
    formats = {k: [l.formats for l in load_plan(p).layers] for k, p in plans.items()}
    packed = {}
    for name, path in plans.items():
        same = next((k for k in packed if formats[k] == formats[name]), None)
        if same:                     # same statistics, same tier mix: the same formats, one folder
            packed[name] = packed[same]
            continue
        out = Path(a.work) / f"packed-{name}"
        shutil.rmtree(out, ignore_errors=True)
        argv = ["pack", str(ckpt), "--plan", str(path), "--out", str(out), "--json"]
        s = json.loads(cli(argv))
        run.extra["commands"].append("strata-plan " + " ".join(argv))
        run.metrics[f"pack.{name}.seconds_measured"] = s["seconds"]
        run.metrics[f"pack.{name}.expert_gb"] = s["expert_bytes"] / 1e9
        packed[name] = out
    out = Path(a.work) / "packed-bf16"
    shutil.rmtree(out, ignore_errors=True)
    argv = ["pack", str(ckpt), "--format", "bf16", "--out", str(out), "--json"]
    s = json.loads(cli(argv))
    run.extra["commands"].append("strata-plan " + " ".join(argv))
    run.metrics["pack.bf16.expert_gb"] = s["expert_bytes"] / 1e9
    packed["bf16"] = out
    return packed


# ---- 3. the engine ---------------------------------------------------------------------------------------
def _peak_reset() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_gb() -> float | None:
    return torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None


def decode_pick(a):
    """How the rows pick each decode token (`--sample`): a GumbelPick (measure draws from its seed afresh), or None
    (greedy). ValueError: not TEMPERATURE,TOP_P; UserError: a value out of range (`Sampling`)."""
    from strata_plan.engine.generate import Sampling, device_pick
    if a.sample == "greedy":
        return None
    t, top_p = (float(x) for x in a.sample.split(","))
    return device_pick(Sampling(t, top_p, a.seed))


def measure_one(run: Run, a, key: str, packed: Path, executed, mode: str, pred: Predictor, prompt: list[int],
                options=None, greedy: bool = False) -> dict:
    from strata_plan.engine.bench import measure
    global WATCH
    WATCH = WATCH or StagerWatch(log=log)       # a row past 30 s: what the stager knows, every 10 s
    _peak_reset()
    with WATCH.row(key):
        r = measure(packed, executed, mode=mode, tokens=a.tokens, warmup=a.warmup, prompt=prompt, device=a.device,
                    pick=None if greedy else decode_pick(a), options=options)
    r["vram_peak_gb_measured"] = _peak_gb()
    point = (options.lookahead_point if options is not None else None) or executed.staging.point
    p = pred.for_plan(executed, mode, point=point)
    c = r["counters"]
    bt = r["bytes_per_token"]
    bound = pred.bound_from_bytes(executed, bt["pcie"], bt["nvme"])   # the bytes that crossed PCIe and left the drive
    m = r["measured"]
    r.update(predicted=p, bound_from_moved_bytes=bound)
    run.extra["runs"][key] = r
    run.save()
    if point == executed.staging.point:    # (rows predicted again later, at their plan's point: on the
        # stager's measured host, on their own routing)
        run.executed[key] = (executed, mode, pred)
    out = {"decode_tok_s_measured": m["decode_tok_s"], "decode_tok_s_mean_measured": m["decode_tok_s_mean"],
           "decode_tok_s_predicted": p["decode_tok_s"], "measured_over_predicted": m["decode_tok_s"] / p["decode_tok_s"],
           "hit_rate_measured": r["hit_rate"], "resident_hit_rate_measured": r["resident_hit_rate"],
           "vram_hit_rate_predicted": p["vram_hit_rate"],
           "ram_gb_per_token_measured": bt["ram"] / 1e9, "nvme_gb_per_token_measured": bt["nvme"] / 1e9,
           "pcie_gb_per_token_measured": bt["pcie"] / 1e9, "wasted_gb_per_token_measured": bt["wasted"] / 1e9,
           "pcie_gb_per_token_predicted": p["bytes_per_token"].get("pcie", 0.0) / 1e9,
           "nvme_gb_per_token_predicted": p["bytes_per_token"].get("nvme", 0.0) / 1e9,
           "bound_from_moved_bytes_tok_s": bound["decode_tok_s"],
           "share_of_bound_measured": m["decode_tok_s"] / bound["decode_tok_s"],
           "bound_decode_tok_s_predicted_bytes": p["bound_decode_tok_s"],
           # the decode thread's CPU time a token (time.thread_time: waits sleep, so this is host work)
           "host_ms_per_token_measured": r["time_per_token"]["host_cpu_s"] * 1e3,
           # the RAM tier's share on huge pages (the GPU's reads of 4 KiB pages take 512x the IOMMU translations)
           "ram_huge_page_share": r["pinned"]["huge_page_share"]}
    if r["stager"] is not None:             # an NVMe tier: the stager beside the cost model
        out["stage_wait_ms_per_token_measured"] = r["time_per_token"]["stage_wait_s"] * 1e3
        out["nvme_wait_ms_per_token_predicted"] = p["decode_seconds"].get("nvme", 0.0) * 1e3
        out["staging_hit_rate_measured"] = r["stager"]["staging_hit_rate"]
        out.update(stager_latency(r["stager"]))
        out["nvme_read_gb_per_token_predicted"] = p["bytes_per_token"].get("nvme_read", 0.0) / 1e9
        out["page_cache_before"], out["page_cache_after"] = r["page_cache"]["before"], r["page_cache"]["after"]
        out["staging_huge_page_share"] = r["pinned"]["staging_huge_page_share"]     # the GPU reads staged blobs there
    if r["device_step"]:                    # graphs: the step's GPU time alone, its ceiling 1 / step_s
        out["gpu_ms_per_token_measured"] = r["device_step"]["step_s"] * 1e3
        out["gpu_ceiling_tok_s_measured"] = 1.0 / r["device_step"]["step_s"]
    for d, la in c["lookahead"].items():
        out[f"lookahead_d{d}.precision_measured"] = la["precision"]
        out[f"lookahead_d{d}.recall_measured"] = la["recall"]
    if point != "output":           # the statistics' precision is the layer's end's: an estimate for this point
        out["prediction_note"] = f"lookahead_point={point}, predicted with the layer's end's precision and recall"
    run.metrics.update({f"{key}.{k}": v for k, v in out.items()})
    log(f"{key:22s} MEASURED {m['decode_tok_s']:8.2f} tok/s  PREDICTED {p['decode_tok_s']:8.2f}  hit {r['hit_rate']:.3f} "
        f"(resident {r['resident_hit_rate']:.3f})  PCIe {bt['pcie'] / 1e6:.3f} MB/tok  NVMe {bt['nvme'] / 1e6:.3f} MB/tok  "
        f"wasted {bt['wasted'] / 1e6:.3f} MB/tok  bound {bound['decode_tok_s']:.1f} ({bound['binding']})"
        + (f", GPU ceiling {out['gpu_ceiling_tok_s_measured']:.1f} tok/s" if "gpu_ceiling_tok_s_measured" in out else "")
        + (f"; GPU waited {out['stage_wait_ms_per_token_measured']:.2f} ms/tok for {out['demand_reads_per_token_measured']:.1f}"
           f" demand reads/tok (stager: queue {out['stager_queue_ms_measured']:.3f} ms, read "
           f"{out['stager_read_ms_measured']:.3f} ms (landed {out['stager_land_ms_measured']:.3f}), poll gap mean {out['stager_poll_gap_ms_mean_measured']:.3f} max "
           f"{out['stager_poll_gap_ms_max_measured']:.2f} ms)" if r["stager"] is not None else ""))
    return out


def layer_times(run: Run, a, ckpt: Path) -> None:
    """The trained model's decode layers timed on this GPU (`engine.layer_times`), added to the profile the predictions
    use (written to <work>/profile-predict.yaml, which --profile-predict then names): the cost model charges
    measured layer times, no fitted per-layer constant."""
    from strata_plan.engine.layer_times import measure_layer_times, with_layer_times
    from strata_plan.planner.repredict import with_calibration_of
    from strata_plan.profiles.schema import save_profile
    t = measure_layer_times(str(ckpt), context=a.context)
    run.metrics.update({"layer_times.head_us": t.head_us, "layer_times.dense_layer_us": t.dense_layer_us,
                        "layer_times.moe_layer_us": t.moe_layer_us})
    prof = with_calibration_of(a.profile_predict, a.calibration)
    a.profile_predict = str(save_profile(with_layer_times(prof, [t]), Path(a.work) / "profile-predict.yaml"))
    a.calibration = None
    log(f"layer times (MEASURED, {ckpt.name}, context {a.context}): head {t.head_us:.1f} us, dense layer "
        f"{t.dense_layer_us:.1f} us, MoE layer without routed experts {t.moe_layer_us:.1f} us, "
        f"the sampled draw beyond the argmax {t.pick_us:.1f} us")


def engine_stage(run: Run, a, plans: dict[str, Path], packed: dict[str, Path], prompt: list[int]) -> None:
    from strata_plan.engine.aio import available as aio_available
    from strata_plan.engine.directio import page_cache_residency, plain_read_gbps
    from strata_plan.engine.engine import EngineOptions, baseline
    from strata_plan.engine.store import default_stager_io
    from strata_plan.core.plan import load_plan
    from strata_plan.planner.repredict import with_calibration_of
    for name, path in plans.items():
        pred = Predictor(path, with_calibration_of(a.profile_predict, a.calibration), sampled=a.sample != "greedy")
        plan = load_plan(path)
        got = {mode: measure_one(run, a, f"{name}.{mode}", packed[name], baseline(plan, mode), mode, pred, prompt)
               for mode in MODES}
        # the first mode once more, last: the same configuration measured apart by 17-24% (plan before on-demand,
        # the same plan) is an order effect if this one is as slow as the later modes
        again = measure_one(run, a, f"{name}.{MODES[0]}_again", packed[name], baseline(plan, MODES[0]), MODES[0],
                            pred, prompt)
        run.metrics[f"{name}.{MODES[0]}_again_over_first_measured"] = (again["decode_tok_s_measured"]
                                                                       / got[MODES[0]]["decode_tok_s_measured"])
        for base in ("lru", "on-demand"):
            for kind in ("measured", "predicted"):
                run.metrics[f"{name}.plan_over_{base}_{kind}"] = (got["plan"][f"decode_tok_s_{kind}"]
                                                                   / got[base][f"decode_tok_s_{kind}"])
        if not any(l.nvme for l in plan.layers):
            if a.sample != "greedy":        # the draw's GPU time: LRU-only once more with the argmax (A/B)
                greedy = measure_one(run, a, f"{name}.lru_greedy", packed[name], baseline(plan, "lru"), "lru",
                                     Predictor(path, pred.profile), prompt, greedy=True)
                step = {k: (run.extra["runs"][f"{name}.{k}"].get("device_step") or {}).get("without_moe_s")
                        for k in ("lru", "lru_greedy")}
                if None not in step.values():
                    run.metrics[f"{name}.draw_us_measured"] = (step["lru"] - step["lru_greedy"]) * 1e6
                run.metrics[f"{name}.lru_greedy_over_lru_measured"] = (greedy["decode_tok_s_measured"]
                                                                       / got["lru"]["decode_tok_s_measured"])
            continue
        # the NVMe tier's A/Bs: the deepest guesses read alone (depth >= 2); the stager's reads submitted together
        if plan.prefetch_depth >= 2:
            deep = measure_one(run, a, f"{name}.plan_deepest", packed[name], plan, "plan", pred, prompt,
                               EngineOptions(stage_depths="deepest"))
            run.metrics[f"{name}.plan_deepest_over_plan_measured"] = (deep["decode_tok_s_measured"]
                                                                      / got["plan"]["decode_tok_s_measured"])
        if a.lookahead_repeats:
            lookahead_margin(run, a, name, packed[name], plan, pred, prompt)
        files = sorted(packed[name].glob("experts-*.bin"))
        block = -(-int(mean_blob_bytes(packed[name])) // 4096) * 4096
        gbps = [plain_read_gbps(files, block, threads=4, nbytes=256 << 20, seed=s) for s in range(3)]
        run.metrics[f"{name}.plain_odirect_gbps_measured"] = float(np.median(gbps))
        run.metrics[f"{name}.plain_odirect_gbps_spread"] = [min(gbps), max(gbps)]
        run.metrics[f"{name}.page_cache_after"] = max(page_cache_residency(f) for f in files)
        nv = run.extra["runs"][f"{name}.plan"]["links"]["nvme_gbps_wall"]
        run.metrics[f"{name}.plan.nvme_gbps_wall_measured"] = nv
        if aio_available():     # the other way of reading, then (default, other) x (io_repeats - 1); medians (last:
            # the A/B of an engine option, after the rows the issue asks for)
            first = default_stager_io()
            other = "threads" if first == "aio" else "aio"
            tok = {first: [got["plan"]["decode_tok_s_measured"], again["decode_tok_s_measured"]], other: []}
            for k in range(a.io_repeats):
                for way in (first, other) if k else (other,):
                    key = f"{name}.plan_{way}" + (f"_{k}" if k else "")
                    tok[way].append(measure_one(run, a, key, packed[name], plan, "plan", pred, prompt,
                                               EngineOptions(stager_io=way))["decode_tok_s_measured"])
            run.metrics[f"{name}.plan_aio_over_threads_measured"] = (float(np.median(tok["aio"]))
                                                                     / float(np.median(tok["threads"])))
            run.metrics[f"{name}.plan_io_runs_measured"] = tok


def lookahead_margin(run: Run, a, name: str, packed: Path, plan, pred: Predictor, prompt: list[int]) -> None:
    """The NVMe plan's lookahead against on-demand, `--lookahead-repeats` runs of each interleaved (ABBA: the
    drive's latency drifts between runs of one call): the plan where it has a lookahead depth, else the same budget
    at `--lookahead-depth` (labelled forced). Medians: `<name>.lookahead_over_ondemand_measured`, beside the cost
    model's ratio for the two placements run (`_predicted`). With `--lookahead-point-ab` a third row, the same
    lookahead with its guesses taken at each layer's router (EngineOptions.lookahead_point="attention"; ABCCBA):
    `<name>.lookahead_router_over_ondemand_measured` and `_over_lookahead_measured`, beside `_predicted` (the cost
    model with the guesses issued at the router, their precision the layer's end's: an estimate)."""
    from strata_plan.engine.engine import EngineOptions, baseline
    depth = plan.prefetch_depth or a.lookahead_depth
    ahead = plan if plan.prefetch_depth else forced_depth(plan, depth)
    ab = getattr(a, "lookahead_point_ab", False)
    rows = {"lookahead": (ahead, "plan", EngineOptions(lookahead_point="output") if ab else None),
            "on-demand": (baseline(plan, "on-demand"), "on-demand", None)}
    if ab:
        rows["lookahead_router"] = (ahead, "plan", EngineOptions(lookahead_point="attention"))
    tok: dict[str, list[float]] = {k: [] for k in rows}
    for k in range(a.lookahead_repeats):
        for label in (list(rows) if k % 2 == 0 else list(rows)[::-1]):
            executed, mode, options = rows[label]
            tok[label].append(measure_one(run, a, f"{name}.{label}_r{k}", packed, executed, mode, pred,
                                          prompt, options)["decode_tok_s_measured"])
    predicted = {k: pred.for_plan(*rows[k][:2], point=rows[k][2].lookahead_point if rows[k][2] else None)
                 ["decode_tok_s"] for k in rows}
    m = run.metrics
    m[f"{name}.lookahead_depth"], m[f"{name}.lookahead_forced"] = depth, not plan.prefetch_depth
    m[f"{name}.lookahead_runs_measured"] = tok
    med = {k: float(np.median(v)) for k, v in tok.items()}
    m[f"{name}.lookahead_over_ondemand_measured"] = med["lookahead"] / med["on-demand"]
    m[f"{name}.lookahead_over_ondemand_predicted"] = predicted["lookahead"] / predicted["on-demand"]
    log(f"{name}: lookahead (depth {depth}{', forced' if not plan.prefetch_depth else ''}) / on-demand, medians of "
        f"{a.lookahead_repeats} interleaved runs each: MEASURED {m[f'{name}.lookahead_over_ondemand_measured']:.3f}, "
        f"PREDICTED {m[f'{name}.lookahead_over_ondemand_predicted']:.3f}")
    if "lookahead_router" in med:
        for base in ("on-demand", "lookahead"):
            b = base.replace("-", "")
            m[f"{name}.lookahead_router_over_{b}_measured"] = med["lookahead_router"] / med[base]
            m[f"{name}.lookahead_router_over_{b}_predicted"] = predicted["lookahead_router"] / predicted[base]
        log(f"{name}: the guesses taken at the router / at the layer's end, medians: MEASURED "
            f"{m[f'{name}.lookahead_router_over_lookahead_measured']:.3f}, PREDICTED "
            f"{m[f'{name}.lookahead_router_over_lookahead_predicted']:.3f} (over on-demand "
            f"{m[f'{name}.lookahead_router_over_ondemand_measured']:.3f} / "
            f"{m[f'{name}.lookahead_router_over_ondemand_predicted']:.3f})")


def mean_blob_bytes(folder: Path) -> float:
    """Mean packed expert blob of a folder (the transfer size its links are held to)."""
    from strata_plan.engine.packed import load_index
    index = load_index(folder / "index.json")
    return index.expert_bytes / len(index.entries)


def depth_sweep(run: Run, a, plans: dict[str, Path], packed: dict[str, Path], prompt: list[int]) -> None:
    """Hit rate (the seeds' definition) by lookahead depth: depth 0 is the LRU-only run, the plan's own depth
    its plan run, every other depth of --depths the plan run at that depth."""
    from strata_plan.core.plan import load_plan
    from strata_plan.planner.repredict import with_calibration_of
    for name, path in plans.items():
        plan = load_plan(path)
        pred = Predictor(path, with_calibration_of(a.profile_predict, a.calibration), sampled=a.sample != "greedy")
        table = {0: f"{name}.lru", plan.prefetch_depth: f"{name}.plan"}
        for d in [int(x) for x in a.depths.split(",") if x]:
            if d not in table:
                key = f"{name}.depth{d}"
                measure_one(run, a, key, packed[name], forced_depth(plan, d), "plan", pred, prompt)
                table[d] = key
        rows = {}
        for d in sorted(table):
            r = run.extra["runs"][table[d]]
            rows[d] = {"run": table[d], "hit_rate_measured": r["hit_rate"], "resident_hit_rate_measured": r["resident_hit_rate"],
                       "wasted_gb_per_token_measured": r["bytes_per_token"]["wasted"] / 1e9,
                       "decode_tok_s_measured": r["measured"]["decode_tok_s"],
                       "decode_tok_s_predicted": r["predicted"]["decode_tok_s"]}
            run.metrics[f"{name}.depth{d}.hit_rate_measured"] = r["hit_rate"]
            run.metrics[f"{name}.depth{d}.wasted_gb_per_token_measured"] = r["bytes_per_token"]["wasted"] / 1e9
        run.extra["depth_sweep"][name] = rows


def stager_stage(run: Run, plans: dict[str, Path]) -> None:
    """Per plan with an NVMe tier: the stager's host time measured by its rows' counters (`stager_wake_us`,
    `stager_read_us`, `stager_publish_us`, as `strata-plan calibrate` measures them; the rows that read the engine's
    default way), and every row of the plan predicted again with them in place of the profile's (defaults: estimates):
    `*.decode_tok_s_predicted_stager_measured`. Run again (after the depth sweep), it predicts the new rows with the
    figures the first call measured."""
    import dataclasses

    from strata_plan.engine.store import default_stager_io
    from strata_plan.planner.calibrate import stager_host_us
    from strata_plan.profiles.schema import Figure
    for name, path in plans.items():
        rows = {k: v for k, v in run.executed.items() if k.startswith(f"{name}.")
                and f"{k}.decode_tok_s_predicted_stager_measured" not in run.metrics}
        if name in run.stager_predictors:                  # measured already: the new rows predicted with it
            for key, (executed, mode, _) in rows.items():
                _stager_measured_row(run, key, run.stager_predictors[name].for_plan(executed, mode)["decode_tok_s"])
            continue
        default = default_stager_io()                      # the A/B's other way of reading is not the engine's
        got = stager_host_us([run.extra["runs"][k].get("stager") for k in rows
                              if run.extra["runs"][k].get("stager_io", default) == default])
        if got is None:
            continue
        wake, read, publish, n = got
        run.metrics.update({f"{name}.stager_wake_us_measured": wake, f"{name}.stager_read_us_measured": read,
                            f"{name}.stager_demand_reads_counted": n})
        src = f"bench_trained: the {name} rows' stager counters, {n} demand reads"
        fig = lambda v: Figure(v, "measured", src, time.strftime("%Y-%m-%d"))     # noqa: E731
        prof = next(iter(rows.values()))[2].problem.profile          # every row of a plan: the same profile
        cal = dataclasses.replace(prof.calibration, stager_wake_us=fig(wake), stager_read_us=fig(read))
        if publish is not None:
            run.metrics[f"{name}.stager_publish_us_measured"] = publish
            cal = dataclasses.replace(cal, stager_publish_us=fig(publish))
        again = run.stager_predictors[name] = Predictor(path, dataclasses.replace(prof, calibration=cal),
                                                        sampled=next(iter(rows.values()))[2].problem.sampled)
        for key, (executed, mode, _) in rows.items():
            _stager_measured_row(run, key, again.for_plan(executed, mode)["decode_tok_s"])
        pub = f"{publish:.0f} us" if publish is not None else "not timed"
        log(f"{name}: the stager's host measured by its rows: wake {wake:.0f} us, {read:.0f} us a read, publish "
            f"{pub} ({n} demand reads); predicted again with them: " + ", ".join(
                f"{k.split('.', 1)[1]} {run.metrics[f'{k}.decode_tok_s_predicted_stager_measured']:.0f}" for k in rows))


def _stager_measured_row(run: Run, key: str, tok_s: float) -> None:
    run.metrics[f"{key}.decode_tok_s_predicted_stager_measured"] = tok_s
    run.metrics[f"{key}.measured_over_predicted_stager_measured"] = run.metrics[f"{key}.decode_tok_s_measured"] / tok_s


def run_routing_stage(run: Run, a, ckpt: Path) -> None:
    """Every engine row predicted again on the routing it decoded on (`trained.run_routing`: its text teacher-forced
    through the checkpoint, as the plans' held-out trace was made): `*.decode_tok_s_predicted_run_routing`, its VRAM
    hit rate and NVMe bytes beside the row's measured ones; with the stager's measured host time too where its plan
    has an NVMe tier (`*_run_routing_stager_measured`). The traces: <work>/run-routing/<row>.npz. Run again, it
    predicts the rows that came since."""
    from trained.run_routing import row_stats, row_trace
    from strata_plan.core.routing import save_trace
    from strata_plan.core.spec import load_spec
    rows = {k: v for k, v in run.executed.items() if f"{k}.decode_tok_s_predicted_run_routing" not in run.metrics}
    if not rows:
        return
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = hf.load(ckpt, torch.float32, dev, experts_implementation="eager")   # as the held-out trace was made
    spec = load_spec(str(ckpt))
    folder = Path(a.work) / "run-routing"
    folder.mkdir(parents=True, exist_ok=True)
    for key, (executed, mode, pred) in rows.items():
        r = run.extra["runs"][key]
        trace = row_trace(model, r["context"], spec, f"engine row {key}: its prompt and decode tokens, teacher-forced")
        save_trace(trace, folder / f"{key}.npz")
        stats = row_stats(trace, r["context"], executed)
        m = r["measured"]["decode_tok_s"]
        name = key.split(".")[0]
        for suffix, p in (("run_routing", pred), ("run_routing_stager_measured", run.stager_predictors.get(name))):
            if p is None:
                continue
            got = p.for_plan(executed, mode, stats=stats)
            bt = got["bytes_per_token"]
            run.metrics.update({f"{key}.decode_tok_s_predicted_{suffix}": got["decode_tok_s"],
                                f"{key}.measured_over_predicted_{suffix}": m / got["decode_tok_s"],
                                f"{key}.vram_hit_rate_predicted_{suffix}": got["vram_hit_rate"],
                                f"{key}.nvme_gb_per_token_predicted_{suffix}": bt.get("nvme", 0.0) / 1e9,
                                f"{key}.pcie_gb_per_token_predicted_{suffix}": bt.get("pcie", 0.0) / 1e9})
        own = {k: run.metrics[f"{key}.{k}_predicted_run_routing"] for k in ("decode_tok_s", "vram_hit_rate")}
        log(f"{key:22s} predicted on its own routing {own['decode_tok_s']:8.2f} tok/s (measured / predicted "
            f"{m / own['decode_tok_s']:.3f}; VRAM hit rate predicted {own['vram_hit_rate']:.3f}, measured "
            f"{r['resident_hit_rate']:.3f})")
    del model
    _empty()


# ---- 4. transformers (+ accelerate) ----------------------------------------------------------------------
def transformers_stage(run: Run, a, ckpt: Path, n_moe: int, prompt: list[int]) -> None:
    """transformers all on the device (the reference tokens), then accelerate offload under each budget."""
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    n = a.warmup + a.tokens + 1
    _peak_reset()
    model = hf.load(ckpt, dtype, dev)
    g = hf.greedy(model, prompt, n, timed_from=a.warmup)
    ref = g.tokens
    run.extra["transformers"]["resident"] = _greedy_record(g, dev, dtype, None)
    run.metrics["transformers_resident.decode_tok_s_measured"] = g.decode_tok_s
    log(f"transformers, all on {dev}: MEASURED {g.decode_tok_s:.2f} tok/s")
    del model
    _empty()
    shares = {"ramrich": (VRAM_SHARE, None), "seed": (VRAM_SHARE, SEED_RAM_SHARE)}
    from strata_plan.planner.bound import link_peaks
    from strata_plan.profiles.schema import load_profile
    peak_pcie = link_peaks(load_profile(a.profile))["pcie"]     # the bound: copied bytes over the best H2D rate
    for name in a.budgets.split(","):
        tiers = hf.expert_tiers(n_moe, *shares[name])
        folder = Path(a.work) / f"offload-{name}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        _peak_reset()
        t = time.perf_counter()
        model = hf.load(ckpt, dtype, dev, tiers, folder)
        load_s = time.perf_counter() - t
        g = hf.greedy(model, prompt, n, timed_from=a.warmup)
        rec = _greedy_record(g, dev, dtype, tiers)
        rec.update(load_s=load_s, tokens_equal_resident=g.tokens == ref,
                   offload_files=sorted(p.name for p in folder.iterdir()))
        files = [p for p in folder.iterdir() if p.is_file()]
        if files:
            from strata_plan.engine.directio import page_cache_residency
            rec["offload_page_cache_after"] = max(page_cache_residency(p) for p in files)
        moved = hf.offloaded_bytes(model, tiers)
        rec["bytes_per_token_copied"] = moved
        rec["bound_tok_s"] = peak_pcie / moved if moved else None
        run.extra["transformers"][f"accelerate_{name}"] = rec
        run.metrics[f"{name}.accelerate.decode_tok_s_measured"] = g.decode_tok_s
        run.metrics[f"{name}.accelerate.gb_per_token_copied"] = moved / 1e9
        if moved:
            run.metrics[f"{name}.accelerate.bound_tok_s"] = peak_pcie / moved
        run.metrics[f"{name}.accelerate.vram_peak_gb_measured"] = rec["vram_peak_gb_measured"]
        key = f"{name}.plan.decode_tok_s_measured"
        if key in run.metrics:
            run.metrics[f"{name}.plan_over_accelerate_measured"] = run.metrics[key] / g.decode_tok_s
        log(f"transformers + accelerate ({name}: experts {_tier_counts(tiers)}): MEASURED {g.decode_tok_s:.2f} tok/s, "
            f"{moved / 1e6:.1f} MB copied a token (bound {rec['bound_tok_s'] or 0:.1f} tok/s at the profile's best "
            f"H2D), tokens equal to the resident run: {g.tokens == ref}")
        del model
        _empty()


def _tier_counts(tiers: dict[int, str]) -> dict[str, int]:
    return {t: sum(v == t for v in tiers.values()) for t in ("gpu", "cpu", "disk")}


def _greedy_record(g, dev, dtype, tiers) -> dict:
    return {"device": dev, "dtype": str(dtype), "experts_layers_by_tier": None if tiers is None else _tier_counts(tiers),
            "expert_tiers": None if tiers is None else {str(k): v for k, v in tiers.items()},
            "decode_tok_s_measured": g.decode_tok_s, "decode_tok_s_mean_measured": g.decode_tok_s_mean,
            "prefill_s_measured": g.prefill_s, "timed_tokens": len(g.step_s), "tokens": g.tokens,
            "vram_peak_gb_measured": _peak_gb()}


def _empty() -> None:
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- 5. equivalence --------------------------------------------------------------------------------------
def engine_tokens(packed: Path, plan: Path, device: str, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of the engine (`engine.generate`, as `strata-plan run` calls it; no end-of-sequence stop)."""
    from strata_plan.engine.engine import Engine, EngineOptions
    from strata_plan.engine.generate import generate
    with Engine.open(packed, str(plan), EngineOptions(mode="plan", device=device)) as eng:
        return generate(eng.model, prompt, n, eng.plan.prefill_chunk, eos_ids=())


def compare(name: str, run: Run, want: list[int], gaps: list[float], got: list[int], what: str) -> None:
    div = hf.first_divergence(want, got)
    rec = {"reference": what, "tokens_equal": div is None, "first_divergence": div, "tokens": len(want),
           "reference_top2_gap_there": None if div is None or div >= len(gaps) else gaps[div],
           "engine_tokens": got, "reference_tokens": want}
    run.extra["equivalence"][name] = rec
    run.metrics[f"equivalence.{name}.tokens_equal"] = div is None
    run.metrics[f"equivalence.{name}.first_divergence"] = div
    log(f"equivalence {name}: tokens equal {div is None}" + ("" if div is None else
        f" (first divergence at token {div}, reference's top-2 logit gap there {rec['reference_top2_gap_there']:.4f})"))


def equivalence(run: Run, a, ckpt: Path, packed_bf16: Path, plan_bf16: Path, prompt: list[int]) -> None:
    n = a.equiv_tokens
    model = hf.load(ckpt, torch.float32, "cpu", experts_implementation="eager")
    want = hf.greedy(model, prompt, n)
    del model
    _empty()
    compare("cpu_float32", run, want.tokens, want.gaps, engine_tokens(packed_bf16, plan_bf16, "cpu", prompt, n),
            "transformers float32 on the CPU, eager experts, the BF16 checkpoint upcast")
    if torch.cuda.is_available() and (a.device or "cuda") == "cuda":
        model = hf.load(ckpt, torch.bfloat16, "cuda")
        want = hf.greedy(model, prompt, n)
        del model
        _empty()
        compare("cuda_bf16", run, want.tokens, want.gaps, engine_tokens(packed_bf16, plan_bf16, "cuda", prompt, n),
                "transformers bf16 on the GPU (its default experts)")


# ---- the table -------------------------------------------------------------------------------------------
def table(run: Run) -> str:
    m = run.metrics
    lines = [f"{'budget / run':24s} {'MEASURED tok/s':>15s} {'PREDICTED':>10s} {'meas/pred':>9s} {'hit (seeds)':>11s} "
             f"{'PCIe MB/tok':>11s} {'NVMe MB/tok':>11s} {'wasted MB/tok':>13s} {'% of bound':>10s} "
             f"{'meas/pred own routing':>21s}"]
    for name in run.args.budgets.split(","):
        for mode in MODES:
            k = f"{name}.{mode}"
            if f"{k}.decode_tok_s_measured" not in m:
                continue
            lines.append(f"{k:24s} {m[f'{k}.decode_tok_s_measured']:15.2f} {m[f'{k}.decode_tok_s_predicted']:10.2f} "
                         f"{m[f'{k}.measured_over_predicted']:9.3f} {m[f'{k}.hit_rate_measured']:11.3f} "
                         f"{m[f'{k}.pcie_gb_per_token_measured'] * 1e3:11.3f} {m[f'{k}.nvme_gb_per_token_measured'] * 1e3:11.3f} "
                         f"{m[f'{k}.wasted_gb_per_token_measured'] * 1e3:13.3f} "
                         f"{m[f'{k}.share_of_bound_measured']:10.1%} "
                         f"{m.get(f'{k}.measured_over_predicted_run_routing', float('nan')):21.3f}")
        if f"{name}.accelerate.decode_tok_s_measured" in m:
            acc = m[f"{name}.accelerate.decode_tok_s_measured"]
            bound = m.get(f"{name}.accelerate.bound_tok_s")
            lines.append(f"{name + '.accelerate':24s} {acc:15.2f} {'':>10s} {'':>9s} {'':>11s} "
                         f"{m[f'{name}.accelerate.gb_per_token_copied'] * 1e3:11.3f} {'':>11s} {'':>13s} "
                         + (f"{acc / bound:10.1%}" if bound else ""))
        rows = run.extra["depth_sweep"].get(name)
        if rows:
            lines.append(f"  {name} hit rate by lookahead depth (MEASURED, seeds' definition): " + ", ".join(
                f"d{d} {r['hit_rate_measured']:.3f}" for d, r in rows.items()))
    if "transformers_resident.decode_tok_s_measured" in m:
        lines.append(f"{'transformers (resident)':24s} {m['transformers_resident.decode_tok_s_measured']:15.2f}")
    for name, rec in run.extra["equivalence"].items():
        lines.append(f"equivalence {name}: tokens equal {rec['tokens_equal']}, first divergence {rec['first_divergence']}")
    for name, err in run.extra["errors"].items():
        lines.append(f"FAILED {name}: {err}")
    return "\n".join(lines)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/root/trained", help="folder for the checkpoint, plans, packed models, offload")
    p.add_argument("--out-dir", default=None, help="where the result JSONs go (default benchmarks/results)")
    p.add_argument("--smoke", action="store_true", help="CPU smoke run: the fixture shape trained for 2 steps on a "
                   "small corpus, tiny context, a few tokens (checks every stage, measures nothing worth keeping)")
    p.add_argument("--train-seconds", type=float, default=200.0, help="training time budget (default 200 s)")
    p.add_argument("--train-steps", type=int, default=None, help="a fixed step count instead of --train-seconds")
    p.add_argument("--checkpoint", help="skip training: this checkpoint folder (with --trace)")
    p.add_argument("--trace", help="with --checkpoint: its routing trace .npz")
    p.add_argument("--corpus-mb", type=float, default=300)
    p.add_argument("--trace-tokens", type=int, default=4096)
    p.add_argument("--source-root", action="append", help="training text from here (train_moe.py --source-root)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default=None, help="profile the plans are made with (default: --profile-predict's, "
                   "with the model's layer times, as a user plans with the machine's own profile; else h200)")
    p.add_argument("--profile-predict", default=None, help="re-predict with this profile YAML (default: the plan's)")
    p.add_argument("--calibration", default=None, help="with --profile-predict: the calibration constants of this "
                   "profile YAML (measured by `strata-plan calibrate`, committed before the run) with its measured figures")
    p.add_argument("--io-repeats", type=int, default=1,
                   help="the stager's A/B on an NVMe plan: runs of the other way of reading (reader threads where the "
                        "default is aio), interleaved with as many of the default less one")
    p.add_argument("--lookahead-repeats", type=int, default=0,
                   help="an NVMe plan's lookahead (its depth, else --lookahead-depth, forced) against on-demand: this "
                        "many runs of each, interleaved; medians (`lookahead_over_ondemand_measured`)")
    p.add_argument("--lookahead-depth", type=int, default=1, help="--lookahead-repeats' depth where the plan has none")
    p.add_argument("--lookahead-point-ab", action="store_true",
                   help="with --lookahead-repeats: a third interleaved row, the guesses taken at each layer's router "
                        "(EngineOptions.lookahead_point='attention'; `lookahead_router_over_lookahead_measured`, "
                        "`_predicted`)")
    p.add_argument("--lookahead-point", choices=LOOKAHEAD_POINTS, default=DEFAULT_LOOKAHEAD_POINT,
                   help="the plans' `strata-plan plan --lookahead-point`: where the engine takes the NVMe guesses (the "
                        "rows follow the plan; --lookahead-point-ab's rows name theirs)")
    p.add_argument("--budgets", default="ramrich,seed")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--tokens", type=int, default=64, help="timed decode tokens per run")
    p.add_argument("--warmup", type=int, default=64, help="decode tokens before timing (the statistics' warm-up "
                   "is 0: plan --stats TRACE counts from the first token)")
    p.add_argument("--sample", default="1.0,0.95", help="decode tokens drawn at TEMPERATURE,TOP_P (seed --seed; the "
                   "same stream in every mode) or 'greedy': a greedy continuation of this small model loops over a "
                   "few tokens whose routing is not the text's the statistics come from")
    p.add_argument("--equiv-tokens", type=int, default=64)
    p.add_argument("--depths", default="1,2,3,4", help="lookahead depths for the hit-rate sweep ('' to skip)")
    p.add_argument("--device", default="", help="cuda or cpu (default cuda when there is a GPU)")
    p.add_argument("--skip", default="", help="stages to leave out: transformers, equivalence, depth_sweep (comma list)")
    p.add_argument("--deadline-s", type=float, default=560.0, help="optional stages are skipped past this")
    a = p.parse_args(argv)
    if a.smoke:
        for k, v in SMOKE.items():
            if getattr(a, k) == p.get_default(k):
                setattr(a, k, v)
        a.device = a.device or "cpu"
        a.corpus_mb = 3 if a.corpus_mb == p.get_default("corpus_mb") else a.corpus_mb
        a.trace_tokens = 512 if a.trace_tokens == p.get_default("trace_tokens") else a.trace_tokens
        if not a.source_root and not a.checkpoint:
            import sysconfig
            a.source_root = [sysconfig.get_paths()["stdlib"]]
    if bool(a.checkpoint) != bool(a.trace):
        p.error("--checkpoint and --trace go together")
    try:
        decode_pick(a)
    except (ValueError, UserError):
        p.error(f"--sample {a.sample!r}: give TEMPERATURE,TOP_P (e.g. 1.0,0.95; top-p in (0, 1]) or greedy")
    if a.calibration and not a.profile_predict:
        p.error("--calibration goes with --profile-predict")
    return a



NOTES = ("bench-moe (or the fixture shape with --smoke) retrained in this run and planned from its own held-out trace; "
         "routing from the model's own router (no replay). *_measured: measured here; *_predicted: the cost model on "
         "the executed placement (see extra.runs.*.predicted.source); bound_from_moved_bytes: bytes moved per token "
         "over the profile's best link rates. Decode text: extra.prompt continued by settings.sample (each row's "
         "text: extra.runs.<row>.context); *_predicted_run_routing: the row predicted on its own text's routing, "
         "teacher-forced. complete: false where the run was cut short (the stages and rows done are here).")


def main(argv=None) -> int:
    a = parse(argv)
    if a.smoke:
        torch.set_num_threads(1)       # tiny experts on a shared 2-core machine: threads only add overhead (5x)
    signal.signal(signal.SIGTERM, on_timeout)                     # `timeout`: still write what was measured
    if a.deadline_s:       # still running well past the deadline: every thread's stack on stderr (a hang's place)
        faulthandler.dump_traceback_later(a.deadline_s + 20, exit=False)
    Path(a.work).mkdir(parents=True, exist_ok=True)
    if a.out_dir:
        Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    run = Run(a)
    plans: dict[str, Path] = {}
    try:
        got = run.do("train", lambda: train(run, a))
        if got is None:
            return 1
        ckpt, trace = got
        _empty()                                                     # the training run's cached GPU memory
        from strata_plan.engine.generate import load_tokenizer
        from strata_plan.core.spec import load_spec
        prompt = [0] + load_tokenizer(ckpt).encode(PROMPT).ids       # <|endoftext|> first, as every training file
        run.extra["prompt"] = {"text": PROMPT, "ids": prompt}
        n_moe = load_spec(str(ckpt)).n_moe_layers
        if a.profile_predict and torch.cuda.is_available():
            run.do("layer times", lambda: layer_times(run, a, ckpt))
        a.profile = a.profile or a.profile_predict or "h200"
        run.do("statistics", lambda: trace_statistics(run, a, ckpt, trace))
        for name in a.budgets.split(","):
            path = run.do(f"plan.{name}", lambda name=name: plan_budget(run, a, name, ckpt, trace))
            if path is not None:
                plans[name] = path
        packed = run.do("pack", lambda: pack(run, a, ckpt, plans)) if plans else None
        if packed:
            run.do("engine", lambda: engine_stage(run, a, plans, packed, prompt))
        if run.executed:            # the engine rows predicted again (a few seconds) before the optional stages
            run.do("stager", lambda: stager_stage(run, plans))
            run.do("run_routing", lambda: run_routing_stage(run, a, ckpt))
        skip = set(filter(None, a.skip.split(",")))
        if "transformers" not in skip:
            run.do("transformers", lambda: transformers_stage(run, a, ckpt, n_moe, prompt), need_s=60)
        if packed and "ramrich" in plans and "equivalence" not in skip:
            run.do("equivalence", lambda: equivalence(run, a, ckpt, packed["bf16"], bf16_plan(
                plans["ramrich"], Path(a.work) / "plan-bf16.yaml"), prompt), need_s=45)
        if run.ok("engine") and a.depths and "depth_sweep" not in skip:
            run.do("depth_sweep", lambda: depth_sweep(run, a, plans, packed, prompt), need_s=40)
        if run.ok("depth_sweep"):   # its rows too
            run.do("stager.depth_sweep", lambda: stager_stage(run, plans))
            run.do("run_routing.depth_sweep", lambda: run_routing_stage(run, a, ckpt), need_s=15)
    finally:
        faulthandler.cancel_dump_traceback_later()
        path = run.save(complete=True)
        print(table(run))
        print(path)
    return 0 if not run.extra["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
