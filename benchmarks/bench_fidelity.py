"""What the quant tiers cost in quality (issue 30), side by side in one run on the trained benchmark model:
every variant packed once (`engine.pack.pack_checkpoint`) and evaluated on the same held-out windows against
the float32 reference (`engine.eval`), with the seed post's claimed figures beside ours.

    python3 benchmarks/bench_fidelity.py --checkpoint /root/trained/bench-moe --work /root/fidelity --out-dir $OUT
    python3 benchmarks/bench_fidelity.py --work /root/fidelity --train-seconds 170 --out-dir $OUT   # trains first
    python3 benchmarks/bench_fidelity.py --smoke --work /tmp/fid-smoke          # CPU, the committed fixture

Two ways a packed folder is run. Weight quantization alone (the rows without `.engine`): `evaluate_dequantized`,
the engine's float32 model with the folder's experts dequantized once by the kernels' reference dequantizer, so
the only difference from the reference is the weights (the fused MoE's own torch reference, one token and one
expert at a time, would take minutes a row on the GPU). Through the engine (`.engine` rows): `evaluate`, the
engine as `strata-plan eval` runs it; on a GPU that is bf16 activations, KV cache and dense layers, and the
Triton kernels: grouped prefill GEMMs over bf16-dequantized tiles for a 512-token window, and with
`.engine.decode` (token by token, `packed_chunk=1`) the batch-1 decode kernels, which put activations on an
int8 grid. `.engine` minus its weight-only row is what the engine's arithmetic costs in KL; `uniform.bf16.engine`
(unquantized experts) is the part of it that bf16 alone costs. On the CPU the engine computes in float32 with
the torch reference, so those differences are ~0 there by construction.

Rows (names are the result's metric prefixes):
- `mix.popularity.calib`: the three-tier mix at the seed's 1.92 bpw (`formats.tier_mix`, what `pack --bpw`
  uses), the most used experts in the widest tier (`TierMix.assign` on each layer's popularity order, as
  `pack --stats` does), codes from our quantizer with calibration statistics (`pack --calib`). Popularity and
  calibration statistics both come from one float32 forward over TRAINING text (`engine.calib.activation_stats`:
  its per-expert routed-token counts are the popularity), never from the held-out text evaluated.
- `mix.popularity`: the same split, our quantizer without calibration statistics.
- `mix.popularity.rtn`: the same split, codes from plain round-to-nearest with group-wise min/max (`pack --rtn`).
- `mix.popularity.hqq`: the same split quantized by HQQ (`hqq.core.quantize.Quantizer`, PyPI `hqq`) at the
  nbits / group size whose bits per weight (codes + a 16-bit scale and zero per group) are nearest each tier
  format's, dequantized by HQQ (compute dtype bf16, so the dequantized weights are exactly representable), written
  into a copy of the checkpoint and packed as bf16.
- `mix.random.calib`: the same tier counts per layer, experts assigned to tiers at random (seeded).
- `uniform.bf16.engine`, `mix.popularity.calib.engine`, `mix.popularity.calib.engine.decode`: see above.
- `uniform.<format>`: every routed expert in one format (`pack --format`): the three tiers (2.81, 2.56, 1.44
  bpw) and the native 4.25.

Bits per weight: `bpw_stored` from the packed blobs' bytes (`ModelSpec.routed_expert_bytes`: 4 KiB alignment and
K padded to the super-block included; bench-moe's expert width 256 pads down_proj's K to 512), `bpw_format`
from the formats' own `bpw` (K a multiple of the super-block: the bits that carry information). HQQ is matched
to `bpw_format` (padding carries nothing); its row's bpw is HQQ's own storage (codes + 16-bit scale and zero per
group, no padding). Every figure is measured here; the seed post's figures are labelled
as its claims. Writes fidelity-<time>.json (benchmarks/_result.py; fidelity-smoke-<time>.json into --work with
--smoke) and prints a table. Held-out text: the corpus's held-out files (content hash, benchmarks/moe/corpus.py),
each a window from its start as the routing trace takes them, so the first of them are the trace's own
heldout_tokens.npz; --heldout NPZ evaluates on given ids instead (the smoke: the fixture's).
"""
from __future__ import annotations

import argparse
import re
import shutil
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent

from _result import on_timeout, write_result  # noqa: E402

from strata_plan.kernels import formats as F  # noqa: E402

SEED_CLAIMS = {"top1": 0.9520, "top5": 0.9992, "kl_mean": 0.0191, "ppl_change": (0.010, 0.027)}
SEED_SOURCE = "claimed by the seed post (1.92-bpw mix), not measured here"
UNIFORM = (*F.TIER_FORMATS, F.NATIVE_FORMAT)
HQQ_BITS = (1, 2, 3, 4)
HQQ_GROUPS = (8, 16, 32, 64, 128, 256)
MIX = "mix.popularity.calib"
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass(frozen=True)
class Variant:
    name: str                            # row name and metric prefix
    what: str                            # one line for the table
    formats: list                        # per MoE layer: expert -> format
    quantizer: str = "ours"              # ours | ours+calib | rtn | hqq
    path: str = "weights"                # weights (dequantized, float32) | engine | engine.decode (token by token)
    packed_as: str = ""                  # reuse another row's packed folder


# ---- model and text ---------------------------------------------------------------------------------------
def model(a) -> Path:
    """The checkpoint: --checkpoint, or bench-moe trained now (`train_moe.py --size bench`)."""
    if a.checkpoint:
        return Path(a.checkpoint)
    import train_moe
    out = Path(a.work) / "bench-moe"
    argv = ["--size", "bench", "--out", str(out), "--seconds", str(a.train_seconds), "--corpus-mb", "300"]
    if train_moe.main(argv) != 0:
        raise RuntimeError("train_moe.py failed (see its line above)")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()                        # the training run's cached memory
    return out


def model_metrics(ckpt: Path) -> dict:
    """The checkpoint's own training record (train_log.json, written by train_moe.py), when it has one."""
    import json
    p = ckpt / "train_log.json"
    if not p.is_file():
        return {}
    t = json.loads(p.read_text())
    return {"model.parameters_M": t["parameters"] / 1e6, "model.train_steps": t["train"]["steps"],
            "model.train_seconds_measured": t["train"]["seconds"],
            "model.held_out_perplexity_measured": t["held_out"]["perplexity"]}


def texts(a, ckpt: Path) -> tuple[list[int], list[int], dict]:
    """(training-text ids for calibration and popularity, held-out ids to evaluate on, where they came from).
    Both are files as sequences (EOT + a file's first tokens, `moe.trace.heldout_sequences`): training text
    from the corpus's train split, held-out text from --heldout or else the held-out split (content hash,
    benchmarks/moe/corpus.py), so no evaluated token was trained on."""
    from moe import corpus as C
    from moe.trace import heldout_sequences

    from strata_plan.engine.generate import load_tokenizer
    tok = load_tokenizer(ckpt)
    roots = [(Path(r).name, Path(r).resolve()) for r in a.source_root] if a.source_root else C.python_source_roots()
    corpus = C.split(C.read_sources(roots))
    train, train_keys = heldout_sequences(tok, corpus.train, a.chunk, a.calib_tokens)
    if a.heldout:
        with np.load(a.heldout) as d:
            held, held_from = d["tokens"].astype(np.int64).tolist(), a.heldout
    else:
        seqs, _ = heldout_sequences(tok, corpus.held_out, a.chunk, a.windows * a.chunk * 2)
        held, held_from = np.concatenate(seqs).tolist(), "the corpus's held-out split (first files, digest order)"
    info = {"train_files": len(train_keys), "train_tokens": int(sum(len(s) for s in train)),
            "heldout_tokens_available": len(held), "heldout_from": held_from,
            "corpus": corpus.summary(), "roots": [str(r) for _, r in roots]}
    return np.concatenate(train).tolist(), held, info


# ---- tier assignments ---------------------------------------------------------------------------------------
def popularity_orders(counts: torch.Tensor) -> list[list[int]]:
    """Per MoE layer, expert ids most routed first (ties: lower id first, as `RoutingStats.order`)."""
    return [sorted(range(row.numel()), key=lambda e: (-int(row[e]), e)) for row in counts]


def random_orders(n_layers: int, n_experts: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.permutation(n_experts).tolist() for _ in range(n_layers)]


def bpw(spec, formats: list[dict[int, str]]) -> dict:
    """Bits per weight of the routed experts: stored (the blobs' bytes, padding included) and the formats' own."""
    per_expert = 3 * spec.hidden * spec.moe_intermediate
    fmts = [f for layer in formats for f in layer.values()]
    stored = sum(spec.routed_expert_bytes(f) for f in fmts) * 8 / (per_expert * len(fmts))
    return {"bpw_stored": stored, "bpw_format": sum(F.get_format(f).bpw for f in fmts) / len(fmts)}


# ---- HQQ -----------------------------------------------------------------------------------------------------
def hqq_bpw(nbits: int, group: int) -> float:
    """HQQ's bits per weight: the codes plus a 16-bit scale and a 16-bit zero per group (quant_scale and
    quant_zero off, HQQ 0.2's defaults)."""
    return nbits + 32 / group


def hqq_settings(tiers: tuple[str, ...], hidden: int, inter: int) -> dict[str, dict]:
    """Tier format -> the HQQ nbits / group size (a group dividing every matrix's K) nearest its bpw (ties: the
    lower bpw, then more code bits: 2-bit g32 over 1-bit g16, both 3.0)."""
    cands = [(b, g) for b in HQQ_BITS for g in HQQ_GROUPS if hidden % g == 0 and inter % g == 0]
    out = {}
    for t in tiers:
        want = F.get_format(t).bpw
        b, g = min(cands, key=lambda c: (abs(hqq_bpw(*c) - want), hqq_bpw(*c), -c[0]))
        out[t] = {"nbits": b, "group_size": g, "hqq_bpw": hqq_bpw(b, g), "format_bpw": want}
    return out


def hqq_mix_bpw(settings: dict, formats: list[dict[int, str]]) -> dict:
    """HQQ's bits per weight over the split as HQQ stores it (packed codes, a 16-bit scale and zero per group;
    no padding: every group divides K). The engine runs its dequantized weights as bf16 blobs."""
    b = float(np.mean([settings[f]["hqq_bpw"] for layer in formats for f in layer.values()]))
    return {"bpw_stored": b, "bpw_format": b}


def hqq_dequantized(w: torch.Tensor, nbits: int, group: int, device: str) -> torch.Tensor:
    """w [N, K] quantized by HQQ (groups of `group` along K, its proximal optimizer) and dequantized, bf16."""
    from hqq.core.quantize import BaseQuantizeConfig, Quantizer
    params = BaseQuantizeConfig(nbits=nbits, group_size=group)["weight_quant_params"]    # HQQ's defaults, axis 1
    w_q, meta = Quantizer.quantize(w.to(device, torch.float32), device=device, **params)
    meta["compute_dtype"] = torch.bfloat16          # scale and zero stored in bf16, the weights come back bf16
    w_q, meta = Quantizer.to_ooplace(w_q, meta, device)
    return Quantizer.dequantize(w_q, meta).reshape(w.shape)


def hqq_checkpoint(ckpt: Path, spec, formats: list[dict[int, str]], settings: dict, out: Path, device: str) -> Path:
    """A copy of the checkpoint whose routed experts are HQQ-quantized and dequantized at each expert's tier's
    setting (everything else unchanged)."""
    from safetensors.torch import load_file, save_file
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for p in ckpt.iterdir():
        if p.is_file() and p.name != "model.safetensors" and not p.name.endswith(".npz"):
            shutil.copyfile(p, out / p.name)
    tensors = load_file(str(ckpt / "model.safetensors"))
    moe = {layer: i for i, layer in enumerate(spec.moe_layers)}
    done = 0
    for name, w in tensors.items():
        m = _EXPERT.match(name)
        if m and int(m.group(1)) in moe:
            s = settings[formats[moe[int(m.group(1))]][int(m.group(2))]]
            tensors[name] = hqq_dequantized(w, s["nbits"], s["group_size"], device).to(w.dtype).cpu()
            done += 1
    want = 3 * spec.n_routed * spec.n_moe_layers
    if done != want:
        raise RuntimeError(f"{ckpt}: {done} routed-expert tensors found by name, {want} expected")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


# ---- the rows --------------------------------------------------------------------------------------------------
def variants(spec, counts: torch.Tensor, a) -> list[Variant]:
    """Every row, in the order they run (the targets' rows first, so a short run still decides them)."""
    mix = F.tier_mix(a.bpw)
    pop = [mix.assign(o) for o in popularity_orders(counts)]
    rnd = [mix.assign(o) for o in random_orders(spec.n_moe_layers, spec.n_routed, a.seed)]
    rows = [Variant(MIX, f"{a.bpw} bpw tier mix by training-text popularity, our quantizer + calibration", pop, "ours+calib"),
            Variant("mix.popularity", "same split, our quantizer, no calibration", pop),
            Variant("mix.popularity.rtn", "same split, round-to-nearest (group min/max)", pop, "rtn"),
            Variant("mix.popularity.hqq", "same split, HQQ at the nearest bit rates", pop, "hqq"),
            Variant("mix.random.calib", f"same tier counts assigned at random (seed {a.seed}), + calibration", rnd, "ours+calib")]
    if a.engine:                     # after the targets' rows: on a fresh GPU machine the kernels compile first
        rows += [Variant("uniform.bf16.engine", "every expert bf16 through the engine: its own arithmetic alone",
                         every(spec, "bf16"), path="engine"),
                 Variant(f"{MIX}.engine", "the first row's folder through the engine (prefill kernels on a GPU)",
                         pop, "ours+calib", path="engine", packed_as=MIX),
                 Variant(f"{MIX}.engine.decode", "the same token by token (decode kernels, int8 activations)",
                         pop, "ours+calib", path="engine.decode", packed_as=MIX)]
    rows += [Variant(f"uniform.{f}", f"every expert {f} ({F.get_format(f).bpw:.2f} bpw), our quantizer", every(spec, f))
             for f in UNIFORM]
    return rows


def every(spec, fmt: str) -> list[dict[int, str]]:
    return [{e: fmt for e in range(spec.n_routed)} for _ in spec.moe_layers]


def pack_variant(v: Variant, ckpt: Path, spec, stats, a, run) -> Path:
    from strata_plan.engine.pack import pack_checkpoint
    out = Path(a.work) / f"packed-{v.name}"
    shutil.rmtree(out, ignore_errors=True)
    if v.quantizer == "hqq":
        settings = hqq_settings(F.TIER_FORMATS, spec.hidden, spec.moe_intermediate)
        run.extra["hqq_settings"] = settings
        src = hqq_checkpoint(ckpt, spec, v.formats, settings, Path(a.work) / "hqq-checkpoint", a.device)
        pack_checkpoint(src, out, every(spec, "bf16"), device=a.device)
    else:
        pack_checkpoint(ckpt, out, v.formats, device=a.device, importance=stats if v.quantizer == "ours+calib" else None,
                        rtn=v.quantizer == "rtn")
    return out


def measure(v: Variant, packed: Path, ckpt: Path, held: list[int], a) -> dict:
    from strata_plan.engine.eval import evaluate, evaluate_dequantized
    n = a.windows * a.chunk
    if v.path == "weights":
        f = evaluate_dequantized(packed, ckpt, held, a.chunk, n, device=a.device)
    else:
        f = evaluate(packed, ckpt, held, a.chunk, n, device=a.device, packed_chunk=1 if v.path == "engine.decode" else None)
    return {"top1": f.top1, "top5": f.top5, "kl_mean": f.kl_mean, "kl_p99": f.kl_p99, "ppl_change": f.ppl_change,
            "ppl_packed": f.ppl_packed, "ppl_reference": f.ppl_reference, "predictions": f.predictions}


class Run:
    """The results so far; a row's failure is recorded and the next row still runs."""

    def __init__(self, a):
        self.a, self.t0 = a, time.perf_counter()
        self.rows: dict[str, dict] = {}
        self.model: dict = {}
        self.extra: dict = {"errors": {}, "skipped": [], "rows": {}, "text": {}}

    def left(self) -> float:
        return self.a.deadline_s - (time.perf_counter() - self.t0)


def run_rows(run: Run, rows: list[Variant], ckpt: Path, spec, stats, held: list[int]) -> None:
    a, folders = run.a, {}
    for v in rows:
        if run.left() < a.row_s:
            log(f"{v.name}: skipped ({run.left():.0f} s left of --deadline-s)")
            run.extra["skipped"].append(v.name)
            continue
        t = time.perf_counter()
        try:
            if v.packed_as and v.packed_as not in folders:      # its source row was not selected (--rows)
                folders[v.packed_as] = pack_variant(v, ckpt, spec, stats, a, run)
            folders[v.name] = folders[v.packed_as] if v.packed_as else pack_variant(v, ckpt, spec, stats, a, run)
            t_pack = time.perf_counter() - t
            r = measure(v, folders[v.name], ckpt, held, a)
        except Exception as e:      # noqa: BLE001 - a benchmark records what broke and carries on
            traceback.print_exc()
            run.extra["errors"][v.name] = f"{type(e).__name__}: {e}"
            log(f"{v.name} FAILED: {type(e).__name__}: {e}")
            continue
        r.update(bpw(spec, v.formats) if v.quantizer != "hqq" else hqq_mix_bpw(run.extra["hqq_settings"], v.formats),
                 pack_seconds=t_pack, eval_seconds=time.perf_counter() - t - t_pack)
        run.rows[v.name] = r
        run.extra["rows"][v.name] = {"what": v.what, "quantizer": v.quantizer, "path": v.path,
                                     "tier_counts": tier_counts(v.formats)}
        log(f"{v.name}: top-1 {r['top1']:.2%}, top-5 {r['top5']:.2%}, KL {r['kl_mean']:.4f} (p99 {r['kl_p99']:.3f}), "
            f"ppl {r['ppl_change']:+.1%}, {r['bpw_stored']:.3f} bpw stored; pack {t_pack:.0f} s, eval "
            f"{r['eval_seconds']:.0f} s")


def tier_counts(formats: list[dict[int, str]]) -> dict[str, int]:
    every = [f for layer in formats for f in layer.values()]
    return {f: every.count(f) for f in dict.fromkeys(every)}


# ---- targets, metrics, table --------------------------------------------------------------------------------
TARGETS = (  # (name, better row, worse row): the first's mean KL below the second's
    ("quantizer_beats_rtn", "mix.popularity", "mix.popularity.rtn"),
    ("quantizer_beats_hqq", "mix.popularity", "mix.popularity.hqq"),
    ("quantizer_calib_beats_rtn", MIX, "mix.popularity.rtn"),
    ("quantizer_calib_beats_hqq", MIX, "mix.popularity.hqq"),
    ("popularity_beats_random", MIX, "mix.random.calib"),
)


ENGINE_PAIRS = {"prefill": (MIX, f"{MIX}.engine"), "decode": (MIX, f"{MIX}.engine.decode")}


def targets(rows: dict[str, dict]) -> dict[str, dict]:
    out = {}
    for name, good, bad in TARGETS:
        if good in rows and bad in rows:
            ratio = rows[good]["kl_mean"] / rows[bad]["kl_mean"]
            out[name] = {"kl_ratio_measured": ratio, "met": ratio < 1.0, "rows": [good, bad]}
    return out


def metrics(run: Run) -> dict:
    m: dict = dict(run.model)
    for name, r in run.rows.items():
        for k, v in r.items():
            label = k if k.startswith(("bpw", "predictions")) else f"{k}_measured"      # bpw: counted from bytes
            m[f"{name}.{label}"] = v
    for name, t in targets(run.rows).items():
        m[f"target.{name}.kl_ratio_measured"] = t["kl_ratio_measured"]
        m[f"target.{name}.met"] = t["met"]
    for path, (weights_row, engine_row) in ENGINE_PAIRS.items():
        if weights_row in run.rows and engine_row in run.rows:
            k, t = run.rows[engine_row], run.rows[weights_row]
            m[f"engine_arithmetic.{path}.kl_mean_difference_measured"] = k["kl_mean"] - t["kl_mean"]
            m[f"engine_arithmetic.{path}.top1_difference_measured"] = k["top1"] - t["top1"]
    m.update({"seed_claim.top1": SEED_CLAIMS["top1"], "seed_claim.top5": SEED_CLAIMS["top5"],
              "seed_claim.kl_mean": SEED_CLAIMS["kl_mean"], "seed_claim.ppl_change_low": SEED_CLAIMS["ppl_change"][0],
              "seed_claim.ppl_change_high": SEED_CLAIMS["ppl_change"][1]})
    return m


COLUMNS = ("row", "bpw stored", "bpw fmt", "top-1", "top-5", "KL mean", "KL p99", "ppl", "what")


def table_rows(run: Run) -> list[tuple[str, ...]]:
    out = [(name, f"{r['bpw_stored']:.3f}", f"{r['bpw_format']:.3f}", f"{r['top1']:.2%}", f"{r['top5']:.2%}",
            f"{r['kl_mean']:.4f}", f"{r['kl_p99']:.3f}", f"{r['ppl_change']:+.2%}", run.extra["rows"][name]["what"])
           for name, r in run.rows.items()]
    c = SEED_CLAIMS
    return out + [("seed post (claim)", "", "1.92", f"{c['top1']:.2%}", f"{c['top5']:.2%}", f"{c['kl_mean']:.4f}", "",
                   f"+{c['ppl_change'][0]:.1%}..+{c['ppl_change'][1]:.1%}", SEED_SOURCE)]


def table(run: Run) -> None:
    title = (f"Fidelity against the float32 reference, MEASURED on {run.extra.get('predictions', '?')} held-out "
             "next-token predictions")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:                       # plain text where rich is missing
        print(title)
        for row in (COLUMNS, *table_rows(run)):
            print(f"{row[0]:30s} " + " ".join(f"{v:>12s}" for v in row[1:-1]) + f"  {row[-1]}")
        con = None
    else:
        t = Table(title=title)
        for c in COLUMNS:
            t.add_column(c, justify="left" if c in ("row", "what") else "right")
        for row in table_rows(run):
            t.add_row(*row)
        con = Console(width=200)
        con.print(t)
    say = print if con is None else con.print
    if MIX in run.rows:
        r = run.rows[MIX]
        say(f"the mix: {r['bpw_format']:.3f} bpw by the formats' bits, {r['bpw_stored']:.3f} as stored (blobs padded "
            "to 4 KiB, K to the super-block)")
    for name, v in targets(run.rows).items():
        say(f"target {name}: KL {v['rows'][0]} / {v['rows'][1]} = {v['kl_ratio_measured']:.3f} -> "
            f"{'met' if v['met'] else 'MISSED'}")
    where = "" if run.a.device == "cuda" else " (on the CPU the engine computes in float32: ~0 by construction)"
    for path, (weights_row, engine_row) in ENGINE_PAIRS.items():
        if weights_row in run.rows and engine_row in run.rows:
            d = run.rows[engine_row]["kl_mean"] - run.rows[weights_row]["kl_mean"]
            say(f"the engine's arithmetic, {path} ({engine_row} minus {weights_row}, same windows): KL {d:+.5f}{where}")
    for name, e in run.extra["errors"].items():
        say(f"FAILED {name}: {e}")
    for name in run.extra["skipped"]:
        say(f"skipped {name} (deadline)")
    for name in run.extra.get("not_run", []):
        say(f"not run {name} (stopped at the time limit)")


# ---- main -------------------------------------------------------------------------------------------------------
def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="the trained model (default: train bench-moe into --work first)")
    p.add_argument("--work", default="/root/fidelity", help="folder for packed models (and the checkpoint if trained)")
    p.add_argument("--out-dir", default=None, help="where the result JSON goes (default benchmarks/results)")
    p.add_argument("--train-seconds", type=float, default=170.0, help="training budget when there is no --checkpoint")
    p.add_argument("--heldout", default=None, help=".npz with `tokens` to evaluate on (default: the corpus's held-out files)")
    p.add_argument("--source-root", action="append", help="training (and held-out) text from here (default: this "
                   "interpreter's library, the corpus train_moe.py trained on)")
    p.add_argument("--chunk", type=int, default=512, help="evaluation and calibration window, tokens")
    p.add_argument("--windows", type=int, default=16, help="held-out windows evaluated per row")
    p.add_argument("--calib-tokens", type=int, default=32768, help="training-text tokens for calibration + popularity")
    p.add_argument("--bpw", type=float, default=F.SEED_TARGET_BPW, help="the tier mix's target (formats' bpw)")
    p.add_argument("--seed", type=int, default=0, help="random tier assignment's seed")
    p.add_argument("--device", default="", help="cuda or cpu (default cuda when there is a GPU)")
    p.add_argument("--no-engine", dest="engine", action="store_false", help="skip the rows run through the engine")
    p.add_argument("--rows", default="", help="run only the rows whose names start with one of these (comma list; "
                   "e.g. uniform.,mix.popularity.calib.engine.decode); default every row")
    p.add_argument("--deadline-s", type=float, default=1e9, help="rows are skipped past this (seconds from start)")
    p.add_argument("--row-s", type=float, default=25.0, help="seconds a row needs at least (for the deadline)")
    p.add_argument("--smoke", action="store_true", help="CPU run on the committed fixture (tests/data/fixture-moe, "
                   "its held-out tokens, the stdlib as training text), 2 windows of 128: checks every row")
    a = p.parse_args(argv)
    if a.smoke:
        import sysconfig
        a.checkpoint = a.checkpoint or str(HERE.parent / "tests" / "data" / "fixture-moe")
        a.heldout = a.heldout or str(Path(a.checkpoint) / "heldout_tokens.npz")
        a.source_root = a.source_root or [sysconfig.get_paths()["stdlib"]]
        a.device, a.chunk, a.windows, a.calib_tokens = a.device or "cpu", 128, 2, 512
        a.work = a.work if a.work != p.get_default("work") else "/tmp/fid-smoke"
        a.out_dir = a.out_dir or a.work          # a smoke result never lands in benchmarks/results
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    if a.smoke:
        torch.set_num_threads(1)
    signal.signal(signal.SIGTERM, on_timeout)      # `timeout`: still write what was measured
    Path(a.work).mkdir(parents=True, exist_ok=True)
    run = Run(a)
    try:
        from strata_plan.engine.calib import activation_stats
        from strata_plan.core.spec import load_spec
        ckpt = model(a)
        spec = load_spec(str(ckpt))
        run.model = model_metrics(ckpt)
        log(f"model {ckpt} ({spec.n_moe_layers} MoE layers x {spec.n_routed} experts)")
        train_ids, held, run.extra["text"] = texts(a, ckpt)
        t = time.perf_counter()
        stats = activation_stats(ckpt, train_ids, a.chunk, device=a.device)
        run.extra["calibration_seconds"] = time.perf_counter() - t
        run.extra["popularity_training_text"] = stats.counts.tolist()
        log(f"calibration + popularity: {stats.tokens} training-text tokens in {run.extra['calibration_seconds']:.0f} s")
        rows = variants(spec, stats.counts, a)
        if a.rows:
            rows = [v for v in rows if v.name.startswith(tuple(filter(None, a.rows.split(","))))]
        run.extra["planned"] = [v.name for v in rows]
        run_rows(run, rows, ckpt, spec, stats, held)
    except Exception as e:          # noqa: BLE001 - the result file still records what broke
        traceback.print_exc()
        run.extra["errors"]["setup"] = f"{type(e).__name__}: {e}"
    finally:
        run.extra["predictions"] = next((r["predictions"] for r in run.rows.values()), None)
        done = set(run.rows) | set(run.extra["skipped"]) | set(run.extra["errors"])
        run.extra["not_run"] = [n for n in run.extra.get("planned", []) if n not in done]   # killed at the time limit
        m = metrics(run)
        m["total_seconds_measured"] = time.perf_counter() - run.t0
        notes = ("Issue 30 side by side on the trained bench-moe (fixture-moe with --smoke): *_measured against the "
                 "float32 reference on held-out text: rows without .engine run the packed weights dequantized in float32 "
                 "(weight quantization alone), .engine rows the engine itself (bf16 + Triton kernels on a GPU). Tiers by "
                 "popularity and calibration from training text. "
                 "bpw_stored counts the blobs' bytes (padding included), bpw_format the formats' bits. seed_claim.*: "
                 + SEED_SOURCE + ".")
        path = write_result("fidelity-smoke" if a.smoke else "fidelity", m, out_dir=a.out_dir, notes=notes,
                            extra={**run.extra, "settings": vars(a)})
        if run.rows:
            table(run)
        print(path)
    return 0 if not run.extra["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
