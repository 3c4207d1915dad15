"""Packed-expert kernels on one GPU: the fused MoE layer, the peer (GemLite), prefill GEMMs, references.

    python benchmarks/bench_kernels.py --out-dir OUT [--budget-s 210] [--prewarm 14] [--gemlite fast|off]

In one run, at kimi-k3.1-pro's expert shapes (hidden 7168, intermediate 3584) and Kimi-K2's (7168, 2048):
 1. read bandwidth of this card: torch.sum over a 4 GB tensor (the yardstick for the % figures);
 2. the fused MoE call for one layer's top-8 experts at batch 1 in the seed's tier mix (2 x q2_g16_s8m4,
    1 x q2_g32_s8m8, 5 x q1_g32_s8m4: 1.92 bpw), 8 layers with disjoint experts captured in one CUDA
    graph (weights rotate, L2 never serves a repeat), eager timed separately; both launches' configs are
    swept (GATE_UP_SWEEP, DOWN_SWEEP below); the "shipped" rows time this GPU's shipped configs (strata_plan/kernels/configs/; what
    the library runs) beside the portable defaults, and a "best" row the sweep's winner if it differs;
    the shipped row again with every layer back to back (--sustained-s, with the SM clock and power);
 3. GemLite (2 and 4 bit, groups of 64), 24 calls per layer in a CUDA graph, and single-matrix GEMVs;
 4. prefill: packed GEMM at M = 512 and 2048 against torch.matmul on the unpacked bf16 weights, in short
    bursts from an idle GPU and, each cell again, back to back for --sustained-s seconds with the SM
    clock and board power (kernels.bench.sustained: what a long prefill runs at);
 4b. the fused MoE call for prefill chunks (M = 512, 2048: the grouped path) on a whole layer of 384
    experts, against its bound (bf16 FLOP rate or read bandwidth, measured in the same run);
 5. the reference path (dequantize to bf16, then torch.matmul), launch overhead, and the profiler's
    measure_gemv_gbps for each format.
Sections run in that order and are skipped (and said so) once the time budget is spent. The result goes
through benchmarks/_result.py into OUT (or benchmarks/results), with the winning configs.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent

import torch  # noqa: E402

from _result import write_result  # noqa: E402
from strata_plan.kernels import ops  # noqa: E402
from strata_plan.kernels import bench as B  # noqa: E402
from strata_plan.kernels.formats import expert_layout, get_format, tier_mix  # noqa: E402
from strata_plan.kernels.quantizer import dequantize  # noqa: E402
from strata_plan.kernels import tuned  # noqa: E402
from strata_plan.kernels.tuned import config_for, make  # noqa: E402

SHAPES = {"kimi-k3.1-pro": (7168, 3584), "kimi-k2": (7168, 2048)}
LAYERS = 8
TOPK = 8
GB = 1e9

# Sweep candidates, as named fields of the configs (strata_plan/kernels/tuned.py): gate/up and down are timed as
# separate launches, so each is tuned on its own. Only options the kernels still carry are swept (the
# candidates that lost and are not carried: strata_plan/kernels/KERNELS.md).
GATE_UP_SWEEP = [dict(rows1=64, warps1=4, split1=0, wave1=4, chunk=4096, dp4a_block1=True, clamp_rows1=True,
                      max_registers1=mx) for mx in (128, 0)]
DOWN_SWEEP = [dict(rows2=64, warps2=4, split2=1, dp4a_block2=True, clamp_rows2=True, max_registers2=mx) for mx in (0, 72)]
GEMV_SWEEP = [dict(rows=bn, warps=w, threads=131072, max_split=ms, dp4a_block=True) for bn, w, ms in
              ((64, 4, 8), (64, 4, 16), (128, 8, 8))] + [dict(rows=64, warps=4, threads=131072, max_split=8)]
# q4 (gate + down): its own winner, more K splits and threads
GEMV_SWEEP_Q4 = GEMV_SWEEP + [dict(rows=64, warps=4, threads=th, max_split=ms, dp4a_block=True) for th, ms in
                              ((262144, 16), (57344, 16), (57344, 32), (114688, 32))]
# fused MoE prefill (the grouped Triton kernels) and the Hopper prefill GEMM (the Gluon kernel)
MOE_PREFILL_EXPERTS = 384           # routed experts of a kimi-k3.1-pro layer (strata_plan/core/models/kimi-k3.1-pro.json)
MOE_GROUPED_SWEEP = [dict(bf16x2_dequant=False, prefetch_scales=False),
                     dict(bf16x2_dequant=True, prefetch_scales=True, stages=2),
                     dict(bf16x2_dequant=True, prefetch_scales=True, stages=4),
                     dict(bf16x2_dequant=True, prefetch_scales=True, block_n=256, warps=8)]
PREFILL_FORMATS = ("q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "q4_g128_f16")
GEMM_SWEEP = [dict(gluon=True, gluon_tokens=bt, gluon_stages=ns, gluon_warps=w)
              for bt, ns, w in ((256, 3, 4), (256, 2, 4), (256, 4, 8), (128, 4, 4))]


def shipped(kind: str):
    """The config the library picks for `kind` on this GPU (its configs/ file over the defaults): what
    the "shipped" rows measure."""
    return config_for(kind, "mix", 2048, 0, 0, "cuda")


def tier_layers(hidden, inter, device):
    """LAYERS layers of TOPK experts each, every layer in the tier mix, all experts distinct."""
    per_layer = tier_mix().names(TOPK)
    names = per_layer * LAYERS
    arena, offsets = B.random_expert_blobs(names, hidden, inter, device)
    fm = ops.ExpertFormats.from_names(names, device)
    ids = [torch.arange(l * TOPK, (l + 1) * TOPK, device=device, dtype=torch.int32)[None] for l in range(LAYERS)]
    wts = torch.softmax(torch.randn(1, TOPK, device=device), -1)
    wbytes = sum(expert_layout(f, hidden, inter).payload_bytes for f in per_layer)
    return arena, offsets, fm, ids, wts, wbytes, per_layer


# ------------------------------------------------------------------------------------------ prewarm

def _prewarm_job(job):
    """Compile one kernel variant by running it once (in a worker process; the Triton cache is shared)."""
    kind, args = job
    try:
        torch.cuda.set_device(0)
        dev = torch.device("cuda")
        if kind in ("gate_up", "down"):
            hidden, inter, cfg = args
            arena, offsets, fm, ids, wts, _, _ = _one_layer(hidden, inter, dev)
            full = make("moe", cfg) if isinstance(cfg, dict) else cfg
            x = torch.randn(1, hidden, dtype=torch.bfloat16, device=dev)
            sc = ops.moe_gate_up(x, ids, arena, offsets, fm, hidden, inter, full)
            if kind == "down":
                ops.moe_down(sc, ids, wts, arena, offsets, fm, hidden, inter,
                             torch.empty(1, hidden, dtype=torch.bfloat16, device=dev), full)
        elif kind == "gemv":
            fmt, n, k, cfg = args
            ops.packed_linear(torch.randn(1, k, dtype=torch.bfloat16, device=dev), B.random_packed(fmt, n, k, dev),
                              config=make("gemv", cfg) if isinstance(cfg, dict) else cfg)
        elif kind == "gemm":
            fmt, n, k, m, cfg = args
            ops.packed_linear(torch.randn(m, k, dtype=torch.bfloat16, device=dev), B.random_packed(fmt, n, k, dev),
                              config=make("gemm", cfg) if isinstance(cfg, dict) else cfg)
        elif kind == "moe_grouped":         # the grouped prefill kernels at moe_prefill's block size (BM
            m, n_exp, cfg = args            # follows M * top-k / experts; H and I are run-time ints)
            names = tier_mix().names(n_exp)
            arena, offsets = B.random_expert_blobs(names, 512, 512, dev)
            ids = torch.topk(torch.randn(m, n_exp, device=dev), TOPK, dim=-1).indices.to(torch.int32)
            ops.fused_moe(torch.randn(m, 512, dtype=torch.bfloat16, device=dev), ids,
                          torch.full((m, TOPK), 1.0 / TOPK, device=dev), arena, offsets,
                          ops.ExpertFormats.from_names(names, dev), 512, 512,
                          config=make("moe_grouped", cfg, config_for("moe_grouped", "mix", m, 512, 512, dev)))
        elif kind == "gemlite":
            n, k, bits = args
            lin = _gemlite_linear(n, k, bits, dev)
            lin(torch.randn(1, k, dtype=torch.bfloat16, device=dev))
        torch.cuda.synchronize()
        return kind, "ok"
    except Exception as e:  # noqa: BLE001 -- the main process reports failures when it runs the same thing
        return kind, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _one_layer(hidden, inter, dev):
    names = tier_mix().names(TOPK)
    arena, offsets = B.random_expert_blobs(names, hidden, inter, dev)
    fm = ops.ExpertFormats.from_names(names, dev)
    ids = torch.arange(TOPK, device=dev, dtype=torch.int32)[None]
    wts = torch.softmax(torch.randn(1, TOPK, device=dev), -1)
    return arena, offsets, fm, ids, wts, 0, names


def prewarm(jobs, nproc: int, log) -> None:
    import multiprocessing as mp
    t = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(nproc) as pool:
        res = pool.map(_prewarm_job, jobs, chunksize=1)
    bad = [r for r in res if r[1] != "ok"]
    log(f"prewarm: {len(jobs)} variants compiled in {time.time() - t:.1f}s with {nproc} processes; "
        f"{len(bad)} failed {bad[:3]}")


# ------------------------------------------------------------------------------------------ GemLite

def _gemlite_linear(n, k, bits, dev, group=64):
    from gemlite.helper import A16Wn
    w_q = torch.randint(0, 1 << bits, (n, k), dtype=torch.uint8, device=dev)
    scales = torch.rand(n, k // group, device=dev, dtype=torch.bfloat16) * 0.01
    zeros = torch.full((n, k // group), float((1 << bits) // 2), device=dev, dtype=torch.bfloat16)
    return A16Wn(device=dev, dtype=torch.bfloat16).from_weights(w_q, scales, zeros, W_nbits=bits, group_size=group)


def _module_bytes(lin) -> int:
    return sum(t.numel() * t.element_size() for t in (lin.W_q, lin.scales, lin.zeros) if isinstance(t, torch.Tensor))


# --------------------------------------------------------------------------------------------- main

class Bench:
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.dev = torch.device("cuda")
        self.metrics: dict = {}
        self.notes: list[str] = []
        self.tuned: dict = {}

    def left(self) -> float:
        return self.args.budget_s - (time.time() - self.t0)

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.t0:6.1f}s] {msg}", flush=True)

    def section(self, name, fn, need_s):
        if self.left() < need_s:
            self.notes.append(f"{name}: skipped, time budget spent ({self.left():.0f}s left, needs ~{need_s}s)")
            self.log(self.notes[-1])
            return
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- one broken section must not lose the others
            self.notes.append(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
            self.log(self.notes[-1])
            traceback.print_exc()

    # 1 -------------------------------------------------------------------------------------------
    def bandwidth(self):
        t = torch.rand(1 << 30, device=self.dev)                      # 4 GB of float32
        ms = statistics.median(B.event_times(lambda: t.sum(), reps=10))
        c = torch.empty_like(t)
        ms_copy = statistics.median(B.event_times(lambda: c.copy_(t), reps=10))
        self.read_gbps = t.numel() * 4 / (ms * 1e-3) / GB
        self.metrics["hbm"] = {"read_GBps_sum_4GB": round(self.read_gbps, 1),
                               "copy_GBps_read_plus_write": round(2 * t.numel() * 4 / (ms_copy * 1e-3) / GB, 1)}
        self.log(f"HBM read {self.read_gbps:.0f} GB/s")

    # 2 -------------------------------------------------------------------------------------------
    def moe(self):
        for model, (hidden, inter) in SHAPES.items():
            arena, offsets, fm, ids, wts, wbytes, per_layer = tier_layers(hidden, inter, self.dev)
            x = torch.randn(1, hidden, dtype=torch.bfloat16, device=self.dev)
            out = torch.empty(1, hidden, dtype=torch.bfloat16, device=self.dev)
            abytes = 2 * hidden * 2 + TOPK * (inter + inter // 32 * 4 + inter // 8 * 4)   # x, out, packed h
            res = {"experts": per_layer, "weight_bytes_per_layer": wbytes, "activation_bytes_per_layer": abytes}

            def layers_run(cfg, part="both"):
                # the LAYERS layers once (part: both launches, or gate/up or down alone)
                scs = [ops.moe_gate_up(x, i, arena, offsets, fm, hidden, inter, cfg) for i in ids]

                def run():
                    for i, sc in zip(ids, scs):
                        if part in ("both", "gate_up"):
                            sc2 = ops.moe_gate_up(x, i, arena, offsets, fm, hidden, inter, cfg)
                        if part in ("both", "down"):
                            ops.moe_down(sc2 if part == "both" else sc, i, wts, arena, offsets, fm, hidden, inter,
                                         out, cfg)
                return run

            def layer_ms(cfg, part="both"):
                return B.graph_ms(layers_run(cfg, part), reps=self.args.reps) / LAYERS

            def layer_out(cfg):
                o = torch.empty_like(out)
                ops.moe_down(ops.moe_gate_up(x, ids[0], arena, offsets, fm, hidden, inter, cfg), ids[0], wts, arena,
                             offsets, fm, hidden, inter, o, cfg)
                return o.float()

            def checked_ms(cfg, part):
                # a candidate must give the default config's output (up to the order of float sums)
                err = float((layer_out(cfg) - ref).norm() / ref.norm())
                if not err < 1e-3:
                    raise RuntimeError(f"output {err:.2e} away from the default config's")
                return layer_ms(cfg, part)

            default = tuned.MoEConfig()
            rows = [("default", default), ("shipped", shipped("moe"))]          # shipped: configs/'s
            cfg = shipped("moe")
            if self.args.sweep:
                ref = layer_out(default)
                gu = self._sweep(checked_ms, default, GATE_UP_SWEEP, "gate_up")
                dn = self._sweep(checked_ms, default, DOWN_SWEEP, "down")
                best = make("moe", {**GATE_UP_SWEEP[gu[0][1]], **DOWN_SWEEP[dn[0][1]]}, default)
                res["sweep_gate_up_us"] = {json.dumps(GATE_UP_SWEEP[i]): (round(t * 1e3, 2) if t < float("inf") else None) for t, i in gu}
                res["sweep_down_us"] = {json.dumps(DOWN_SWEEP[i]): (round(t * 1e3, 2) if t < float("inf") else None) for t, i in dn}
                if best != cfg:                     # the sweep's winner, timed whole, beside the shipped one
                    rows.append(("best", best))
                cfg = best
            for label, rcfg in rows:
                ms = layer_ms(rcfg)
                gu_ms, dn_ms = layer_ms(rcfg, "gate_up"), layer_ms(rcfg, "down")
                gbps = (wbytes + abytes) / (ms * 1e-3) / GB
                res[label] = {"config": asdict(rcfg), "graph_us_per_layer": round(ms * 1e3, 2),
                              "gate_up_us": round(gu_ms * 1e3, 2), "down_us": round(dn_ms * 1e3, 2),
                              "GBps": round(gbps, 1), "pct_of_read_bw": round(100 * gbps / self.read_gbps, 1)}
                self.log(f"{model} MoE layer [{label}] {ms * 1e3:.1f} us = {gbps:.0f} GB/s "
                         f"({100 * gbps / self.read_gbps:.1f}% of read BW)  cfg={rcfg}")
                if label == "shipped" and self.args.sustained_s > 0:
                    # every layer back to back for --sustained-s seconds, as a long decode runs them
                    su = B.sustained(layers_run(rcfg), self.args.sustained_s, calls=5)
                    us = su["ms"] / LAYERS * 1e3
                    gb = (wbytes + abytes) / (us * 1e-6) / GB
                    res[label]["sustained"] = {"us_per_layer": round(us, 2), "sm_mhz": su["sm_mhz"],
                                               "watts": su["watts"], "pct_of_read_bw": round(100 * gb / self.read_gbps, 1)}
                    self.log(f"{model} MoE layer [{label}] back to back {us:.1f} us "
                             f"({100 * gb / self.read_gbps:.1f}% of read BW) at {su['sm_mhz']} MHz, {su['watts']} W")

            def eager():
                for i in ids:
                    ops.fused_moe(x, i, wts, arena, offsets, fm, hidden, inter, out=out, config=cfg)
            ms_e = statistics.median(B.event_times(eager, reps=self.args.reps)) / LAYERS
            t = time.perf_counter()
            for _ in range(20):
                eager()
            torch.cuda.synchronize()
            host_us = (time.perf_counter() - t) / (20 * LAYERS) * 1e6
            res["eager_us_per_layer"] = round(ms_e * 1e3, 2)
            res["eager_wall_us_per_layer"] = round(host_us, 2)
            self.metrics[f"moe_{model}"] = res
            self.tuned[f"moe_{model}"] = cfg
            self.log(f"{model} eager {ms_e * 1e3:.1f} us/layer (events), {host_us:.1f} us/layer wall")

    def _sweep(self, checked_ms, default, cands: list[dict], part: str) -> list[tuple[float, int]]:
        """(median ms, index) of every candidate, best first, over --sweep-rounds rounds that each time
        every candidate once in turn (so clock drift falls on all of them); a failed one is infinite."""
        times: list[list[float]] = [[] for _ in cands]
        for _ in range(self.args.sweep_rounds):
            for i, c in enumerate(cands):
                if not times[i] or times[i][-1] < float("inf"):
                    times[i].append(self._try_ms(checked_ms, make("moe", c, default), part))
        return sorted((statistics.median(t), i) for i, t in enumerate(times))

    def _try_ms(self, fn, *args) -> float:
        """fn(*args), or infinity (and a note) if this candidate fails: one bad config must not end a sweep."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001
            self.notes.append(f"sweep candidate {args}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            self.log(self.notes[-1])
            return float("inf")

    # 3 -------------------------------------------------------------------------------------------
    def gemlite(self):
        import gemlite
        self.metrics["gemlite_version"] = gemlite.__version__
        for model, (hidden, inter) in SHAPES.items():
            if self.left() < 40:
                self.notes.append(f"gemlite {model}: skipped, time budget")
                continue
            res = {}
            for bits in (2, 4):
                # 4 layers x 24 matrices, each distinct: one pass is ~8x the L2
                shapes = [(inter, hidden), (inter, hidden), (hidden, inter)] * TOPK
                lins = [[_gemlite_linear(n, k, bits, self.dev) for n, k in shapes] for _ in range(4)]
                xs = {k: torch.randn(1, k, dtype=torch.bfloat16, device=self.dev) for k in (hidden, inter)}
                for layer in lins:                      # autotune (first call per shape) outside the graph
                    for lin in layer[:3]:
                        lin(xs[lin.in_features])
                layer_bytes = sum(_module_bytes(lin) for lin in lins[0])

                def run():
                    for layer in lins:
                        for lin in layer:
                            lin(xs[lin.in_features])
                ms = B.graph_ms(run, reps=self.args.reps) / len(lins)
                gbps = layer_bytes / (ms * 1e-3) / GB

                def one(idx):
                    def r():
                        for layer in lins:
                            layer[idx](xs[layer[idx].in_features])
                    return B.graph_ms(r, reps=self.args.reps) / len(lins)
                single = {}
                for idx, name in ((0, "gate"), (2, "down")):
                    ms1 = one(idx)
                    single[name] = {"us": round(ms1 * 1e3, 2),
                                    "GBps": round(_module_bytes(lins[0][idx]) / (ms1 * 1e-3) / GB, 1)}
                res[f"{bits}bit_g64"] = {"layer_bytes": layer_bytes, "graph_us_per_layer_24_calls": round(ms * 1e3, 2),
                                         "GBps": round(gbps, 1), "single_matrix": single}
                self.log(f"gemlite {model} {bits}-bit: {ms * 1e3:.1f} us/layer, {gbps:.0f} GB/s; single {single}")
            ours = self.metrics.get(f"moe_{model}", {}).get("shipped", {}).get("GBps")
            if ours:
                for key in list(res):
                    res[key]["ours_over_gemlite_GBps"] = round(ours / res[key]["GBps"], 2)
            self.metrics[f"gemlite_{model}"] = res

    def gemv_single(self):
        hidden, inter = SHAPES["kimi-k3.1-pro"]
        res = {}
        cfg_best = shipped("gemv")
        if self.args.sweep:
            times = []
            for i, c in enumerate(GEMV_SWEEP):
                times.append((self._gemv_us("q2_g32_s8m8", inter, hidden, make("gemv", c))
                              + self._gemv_us("q2_g32_s8m8", hidden, inter, make("gemv", c)), i))
            times.sort()
            cfg_best = make("gemv", GEMV_SWEEP[times[0][1]])
            res["sweep_us_gate_plus_down_q2_g32"] = {json.dumps(GEMV_SWEEP[i]): round(t, 2) for t, i in times}
        self.tuned["gemv"] = cfg_best
        fmts = ("q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "q4_g128_f16")
        # the rows time what the library runs (configs/); the sweeps' winners (one format's shapes) only go
        # to the result's "tuned" and <out-dir>/<gpu>.json
        per_fmt = {f: config_for("gemv", f, 1, 0, 0, "cuda") for f in fmts}
        if self.args.sweep:
            # q4's own winner on gate + down (the "gemv:q4_g128_f16" entry)
            times = sorted((self._gemv_us("q4_g128_f16", inter, hidden, make("gemv", c))
                            + self._gemv_us("q4_g128_f16", hidden, inter, make("gemv", c)), i)
                           for i, c in enumerate(GEMV_SWEEP_Q4))
            res["sweep_us_q4_gate_plus_down"] = {json.dumps(GEMV_SWEEP_Q4[i]): round(t, 2) for t, i in times}
            self.tuned["gemv:q4_g128_f16"] = make("gemv", GEMV_SWEEP_Q4[times[0][1]])
        for fmt in fmts:
            for name, (n, k) in (("gate", (inter, hidden)), ("down", (hidden, inter))):
                us = self._gemv_us(fmt, n, k, per_fmt[fmt])
                byts = get_format(fmt).matrix_bytes(n, k) + 2 * (n + k)
                res[f"{fmt}_{name}"] = {"us": round(us, 2), "GBps": round(byts / (us * 1e-6) / GB, 1)}
        if self.args.sweep:
            res["sweep_winner"] = asdict(cfg_best)
        res["config_per_format"] = {f: asdict(c) for f, c in per_fmt.items()}
        self.metrics["gemv_single_kimi-k3.1-pro"] = res
        self.log(f"single GEMV: { {k: v for k, v in res.items() if k not in ('config',) and 'sweep' not in k} }")

    def _gemv_us(self, fmt, n, k, cfg):
        copies = B.copies_to_beat_l2(get_format(fmt).matrix_bytes(n, k), self.dev)
        mats = [B.random_packed(fmt, n, k, self.dev) for _ in range(copies)]
        x = torch.randn(1, k, dtype=torch.bfloat16, device=self.dev)
        outs = [torch.empty(1, n, dtype=torch.bfloat16, device=self.dev) for _ in range(copies)]

        def run():
            for p, o in zip(mats, outs):
                ops.packed_linear(x, p, out=o, config=cfg)
        return B.graph_ms(run, reps=self.args.reps) / copies * 1e3

    # 4 -------------------------------------------------------------------------------------------
    def prefill(self):
        hidden, inter = SHAPES["kimi-k3.1-pro"]
        res = {}
        cfg_best = shipped("gemm")
        if self.args.sweep:     # one shape only, so its winner goes to the result's "tuned", not to the rows below
            times = sorted((self._gemm_ms("q2_g16_s8m4", inter, hidden, 2048, make("gemm", c, cfg_best)), i)
                           for i, c in enumerate(GEMM_SWEEP))
            self.tuned["gemm"] = make("gemm", GEMM_SWEEP[times[0][1]], cfg_best)
            res["sweep_ms_q2_g16_M2048_gate"] = {json.dumps(GEMM_SWEEP[i]): round(t, 4) for t, i in times}
        triton_cfg = make("gemm", {"gluon": False}, cfg_best)   # the Triton GEMM, the path on every other GPU
        for name, (n, k) in (("gate", (inter, hidden)), ("down", (hidden, inter))):
            w = torch.randn(n, k, dtype=torch.bfloat16, device=self.dev)
            for m in (512, 2048):
                x = torch.randn(m, k, dtype=torch.bfloat16, device=self.dev)
                bf = B.graph_ms(lambda: torch.matmul(x, w.T), reps=self.args.reps)
                row = {"bf16_matmul_ms": round(bf, 4), "bf16_TFLOPs": round(2 * m * n * k / (bf * 1e-3) / 1e12, 1)}
                for fmt in PREFILL_FORMATS:
                    ms = self._gemm_ms(fmt, n, k, m, cfg_best)
                    tms = self._gemm_ms(fmt, n, k, m, triton_cfg)
                    row[fmt] = {"ms": round(ms, 4), "over_bf16": round(ms / bf, 3),
                                "triton_ms": round(tms, 4), "triton_over_bf16": round(tms / bf, 3)}
                res[f"{name}_M{m}"] = row
                self.log(f"prefill {name} M={m}: bf16 {bf:.3f} ms; " +
                         ", ".join(f"{f} x{row[f]['over_bf16']} (triton x{row[f]['triton_over_bf16']})"
                                   for f in row if f.startswith("q")))
                if self.args.sustained_s > 0:
                    row["sustained"] = sus = {"bf16": B.sustained(lambda: torch.matmul(x, w.T), self.args.sustained_s)}
                    for fmt in PREFILL_FORMATS:
                        r = self._gemm_sustained(fmt, n, k, m, cfg_best)
                        sus[fmt] = {**r, "over_bf16": round(r["ms"] / sus["bf16"]["ms"], 3)}
                    self.log(f"prefill {name} M={m} sustained: bf16 {sus['bf16']} " +
                             ", ".join(f"{f} x{sus[f]['over_bf16']} ({sus[f]['sm_mhz']} MHz)" for f in PREFILL_FORMATS))
        # where the Gluon kernel starts to pay (gluon_min_m), and its K split where the tiles leave SMs idle
        # (gluon_split: up to 4 ways, one program an SM at most): q2_g16 gate, both paths
        small = {}
        for m in (16, 32, 64, 128, 256, 512):
            gl = make("gemm", {"gluon_min_m": 1}, cfg_best)
            small[f"M{m}"] = {"gluon_ms": round(self._gemm_ms("q2_g16_s8m4", inter, hidden, m,
                                                              make("gemm", {"gluon_split": 1}, gl)), 4),
                              "gluon_split_ms": round(self._gemm_ms("q2_g16_s8m4", inter, hidden, m,
                                                                    make("gemm", {"gluon_split": 4}, gl)), 4),
                              "triton_ms": round(self._gemm_ms("q2_g16_s8m4", inter, hidden, m, triton_cfg), 4)}
        res["small_m_q2_g16_gate"] = small
        # wave quantization: 256-token tiles x the gate's row tiles on the SMs' program slots
        waves = {}
        w = torch.randn(inter, hidden, dtype=torch.bfloat16, device=self.dev)
        sms = torch.cuda.get_device_properties(self.dev).multi_processor_count
        for m in (1024, 1536, 2048, 3072, 4096):
            x = torch.randn(m, hidden, dtype=torch.bfloat16, device=self.dev)
            bf = B.graph_ms(lambda: torch.matmul(x, w.T), reps=self.args.reps)
            ms = self._gemm_ms("q2_g16_s8m4", inter, hidden, m, cfg_best)
            nw = ops.gluon_warps(m, hidden, cfg_best)
            tiles = ops.gluon_module().tiles(m, inter, cfg_best.gluon_tokens, nw)
            waves[f"M{m}"] = {"ms": round(ms, 4), "bf16_ms": round(bf, 4), "over_bf16": round(ms / bf, 3),
                              "waves": round(tiles / (sms * 8 // nw), 2)}     # 2 programs an SM at 4 warps, 1 at 8
        res["waves_q2_g16_gate"] = waves
        self.log(f"prefill waves (gate q2_g16): {waves}")
        if self.args.sustained_s > 0:
            # 64-row tiles (4 warps) against 128-row ones (8 warps: half the x traffic a multiply-add, one
            # program an SM) in bursts and back to back, q2_g16 gate
            warps = {}
            for m in (512, 1024, 2048, 4096):
                x = torch.randn(m, hidden, dtype=torch.bfloat16, device=self.dev)
                bf = B.sustained(lambda: torch.matmul(x, w.T), self.args.sustained_s)
                r = warps[f"M{m}"] = {"bf16": bf}
                for nw in (4, 8):
                    c = make("gemm", {"gluon_warps": nw, "gluon_warps8_min_m": 1 << 62}, cfg_best)
                    su = self._gemm_sustained("q2_g16_s8m4", inter, hidden, m, c)
                    r[f"w{nw}"] = {**su, "over_bf16": round(su["ms"] / bf["ms"], 3),
                                   "burst_ms": round(self._gemm_ms("q2_g16_s8m4", inter, hidden, m, c), 4)}
            res["warps_q2_g16_gate"] = warps
            self.log(f"prefill warps (gate q2_g16, sustained over bf16): " +
                     str({mm: {k2: v["over_bf16"] for k2, v in r.items() if k2 != "bf16"} for mm, r in warps.items()}))
        self.log(f"prefill small M (ms): {small}")
        res["config"] = asdict(cfg_best)
        self.metrics["prefill_kimi-k3.1-pro"] = res

    def _gemm_call(self, fmt, n, k, m, cfg):
        p = B.random_packed(fmt, n, k, self.dev)
        x = torch.randn(m, k, dtype=torch.bfloat16, device=self.dev)
        o = torch.empty(m, n, dtype=torch.bfloat16, device=self.dev)
        return lambda: ops.packed_linear(x, p, out=o, config=cfg)

    def _gemm_ms(self, fmt, n, k, m, cfg):
        return B.graph_ms(self._gemm_call(fmt, n, k, m, cfg), reps=self.args.reps)

    def _gemm_sustained(self, fmt, n, k, m, cfg):
        return B.sustained(self._gemm_call(fmt, n, k, m, cfg), self.args.sustained_s)

    # 4b ------------------------------------------------------------------------------------------
    def moe_prefill(self):
        """fused_moe for a prefill chunk (M > 16: the grouped GEMM path, tokens sorted by expert) on a
        whole kimi-k3.1-pro layer: 384 experts in the tier mix (about 7.1 GB packed), top-8 of random
        logits. Eager (a call of 15 ms hides its launches), events, medians. Set against its
        bound in the same run: max(FLOPs / bf16 matmul rate, bytes of the experts touched / read BW)."""
        hidden, inter = SHAPES["kimi-k3.1-pro"]
        n_exp = MOE_PREFILL_EXPERTS
        names = tier_mix().names(n_exp)
        names = [names[i] for i in torch.randperm(n_exp).tolist()]          # formats interleaved over ids
        arena, offsets = B.random_expert_blobs(names, hidden, inter, self.dev)
        fm = ops.ExpertFormats.from_names(names, self.dev)
        expert_bytes = torch.tensor([expert_layout(f, hidden, inter).payload_bytes for f in names], dtype=torch.float64)
        w = torch.randn(inter, hidden, dtype=torch.bfloat16, device=self.dev)
        xb = torch.randn(2048, hidden, dtype=torch.bfloat16, device=self.dev)
        bf = B.graph_ms(lambda: torch.matmul(xb, w.T), reps=self.args.reps)
        bf16_rate = 2 * 2048 * inter * hidden / (bf * 1e-3)                  # FLOP/s, dense bf16 GEMM
        res = {"experts": n_exp, "top_k": TOPK, "arena_GB": round(arena.numel() / GB, 2),
               "bf16_matmul_TFLOPs": round(bf16_rate / 1e12, 1), "read_GBps": round(self.read_gbps, 1)}
        shipped_cfg = config_for("moe_grouped", "mix", 2048, hidden, inter, self.dev)
        for m in (512, 2048):
            logits = torch.randn(m, n_exp, device=self.dev)
            top = torch.topk(logits, TOPK, dim=-1)
            ids, wts = top.indices.to(torch.int32), torch.softmax(top.values, -1)
            x = torch.randn(m, hidden, dtype=torch.bfloat16, device=self.dev)
            out = torch.empty(m, hidden, dtype=torch.bfloat16, device=self.dev)
            def run(cfg):
                return statistics.median(B.event_times(
                    lambda: ops.fused_moe(x, ids, wts, arena, offsets, fm, hidden, inter, out=out, config=cfg),
                    reps=self.args.reps))
            ms = run(shipped_cfg)
            if self.args.sweep:
                ref = out.float().clone()
                sweep = {}
                for c in MOE_GROUPED_SWEEP:
                    cfg = make("moe_grouped", c, shipped_cfg)
                    ops.fused_moe(x, ids, wts, arena, offsets, fm, hidden, inter, out=out, config=cfg)
                    err = float((out.float() - ref).norm() / ref.norm())
                    sweep[json.dumps(c)] = round(run(cfg), 3) if err < 1e-2 else f"wrong output (rel {err:.2e})"
                res[f"sweep_ms_M{m}"] = sweep
                self.log(f"MoE prefill M={m} sweep: {sweep}")
            touched = torch.unique(ids.long()).cpu()
            nbytes = float(expert_bytes[touched].sum()) + 2 * m * hidden * 2        # weights + x in, out
            flops = 2 * 3 * hidden * inter * m * TOPK
            t_flop, t_byte = flops / bf16_rate * 1e3, nbytes / (self.read_gbps * GB) * 1e3
            # every touched expert's weights are expanded once a block of its tokens (one block at these M);
            # the same experts in bf16 would read 3 H I 2 bytes each (a bf16 MoE layer of this size: 59 GB)
            weights = len(touched) * 3 * hidden * inter
            res[f"M{m}"] = {"ms": round(ms, 3), "TFLOPs": round(flops / (ms * 1e-3) / 1e12, 1),
                            "Gweights_expanded_per_s": round(weights / (ms * 1e-3) / 1e9, 1),
                            "bf16_weights_read_ms": round(2 * weights / (self.read_gbps * GB) * 1e3, 3),
                            "experts_touched": len(touched), "weight_GB": round(nbytes / GB, 3),
                            "bound_ms": round(max(t_flop, t_byte), 3),
                            "bound_by": "bf16 FLOPs" if t_flop >= t_byte else "read BW",
                            "over_bound": round(ms / max(t_flop, t_byte), 2)}
            self.log(f"MoE prefill M={m}: {ms:.3f} ms eager, {res[f'M{m}']['TFLOPs']} TFLOP/s, "
                     f"{len(touched)} experts touched; bound {max(t_flop, t_byte):.3f} ms "
                     f"({res[f'M{m}']['bound_by']}): x{res[f'M{m}']['over_bound']}")
        self.metrics["moe_prefill_kimi-k3.1-pro"] = res
        del arena

    # 5 -------------------------------------------------------------------------------------------
    def reference_path(self):
        hidden, inter = SHAPES["kimi-k3.1-pro"]
        res = {}
        for fmt in ("q2_g16_s8m4", "q1_g32_s8m4"):
            p = B.random_packed(fmt, inter, hidden, self.dev)
            for m in (1, 512):
                x = torch.randn(m, hidden, dtype=torch.bfloat16, device=self.dev)
                ms = statistics.median(B.event_times(lambda: x @ dequantize(p, torch.bfloat16).T, reps=5))
                res[f"{fmt}_M{m}_ms"] = round(ms, 3)
        self.metrics["reference_dequant_then_matmul_gate_kimi-k3.1-pro"] = res
        self.log(f"reference path {res}")

    def launch_overhead(self):
        hidden, inter = 512, 512
        arena, offsets, fm, ids, wts, _, _ = _one_layer(hidden, inter, self.dev)
        x = torch.randn(1, hidden, dtype=torch.bfloat16, device=self.dev)
        out = torch.empty(1, hidden, dtype=torch.bfloat16, device=self.dev)
        call = lambda: ops.fused_moe(x, ids, wts, arena, offsets, fm, hidden, inter, out=out)  # noqa: E731
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            call()
        torch.cuda.synchronize()
        eager_us = (time.perf_counter() - t) / 200 * 1e6

        def many():
            for _ in range(20):
                call()
        graph_us = B.graph_ms(many, reps=self.args.reps) / 20 * 1e3
        self.metrics["launch_overhead_tiny_moe"] = {
            "shape": [hidden, inter], "eager_wall_us_per_call_2_launches": round(eager_us, 2),
            "graph_us_per_call": round(graph_us, 2)}
        self.log(f"launch overhead: eager {eager_us:.1f} us/call (wall), graph {graph_us:.1f} us/call")

    def gemv_gbps(self):
        res = {}
        for fmt in ("q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "q4_g128_f16", "bf16"):
            res[fmt] = round(B.measure_gemv_gbps(fmt, 16384, 7168, reps=self.args.reps), 1)
        self.metrics["measure_gemv_gbps_16384x7168"] = res
        self.log(f"measure_gemv_gbps {res}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--budget-s", type=float, default=210)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--prewarm", type=int, default=0, help="compile kernel variants in N processes first")
    ap.add_argument("--prewarm-only", action="store_true", help="compile (--prewarm N processes) and exit")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false")
    ap.add_argument("--sweep-rounds", type=int, default=1,
                    help="time every MoE sweep candidate this many times in turn and keep the medians")
    ap.add_argument("--gemlite", choices=("fast", "off"), default="fast")
    ap.add_argument("--sustained-s", type=float, default=2.0,
                    help="seconds each prefill cell and the shipped MoE layer also run back to back; 0: bursts only")
    ap.add_argument("--sections", default="moe,gemlite,gemv_single,prefill,moe_prefill,reference_path,launch_overhead,"
                    "measure_gemv_gbps")
    ap.add_argument("--name", default="kernels", help="benchmark name of the result JSON")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels needs a CUDA GPU")
        return 2
    b = Bench(args)
    b.log(f"GPU {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    if args.prewarm:
        wanted = args.sections.split(",")
        jobs = []
        h, i = SHAPES["kimi-k3.1-pro"]
        if "moe" in wanted:       # one shape compiles for both models (H, I are run-time ints)
            jobs += [("gate_up", (h, i, c)) for c in (GATE_UP_SWEEP if args.sweep else [shipped("moe")]) + [{}]]
            jobs += [("down", (h, i, c)) for c in (DOWN_SWEEP if args.sweep else [shipped("moe")]) + [{}]]
        if "gemv_single" in wanted:
            jobs += [("gemv", ("q2_g32_s8m8", n, k, c)) for c in (GEMV_SWEEP if args.sweep else [shipped("gemv")])
                     for n, k in ((i, h), (h, i))]
            if args.sweep:                                       # q4's own sweep
                jobs += [("gemv", ("q4_g128_f16", n, k, c)) for c in GEMV_SWEEP_Q4 for n, k in ((i, h), (h, i))]
        if "measure_gemv_gbps" in wanted:
            jobs += [("gemv", (f, 16384, 7168, {})) for f in ("q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4",
                                                              "q4_g128_f16", "bf16")]
        if "prefill" in wanted:
            jobs += [("gemm", ("q2_g16_s8m4", i, h, 2048, make("gemm", c, shipped("gemm"))))
                     for c in (GEMM_SWEEP if args.sweep else [])]
            jobs += [("gemm", (f, i, h, 2048, make("gemm", {"gluon": bool(g)}, shipped("gemm")))) for g in (0, 1)
                     for f in PREFILL_FORMATS]
        if "moe_prefill" in wanted:
            jobs += [("moe_grouped", (m, MOE_PREFILL_EXPERTS, c)) for m in (512, 2048)
                     for c in [{}] + (MOE_GROUPED_SWEEP if args.sweep else [])]
        if "gemlite" in wanted and args.gemlite != "off":
            for hidden, inter in SHAPES.values():
                jobs += [("gemlite", (n, k, bits)) for bits in (2, 4) for n, k in ((inter, hidden), (hidden, inter))]
        b.section("prewarm", lambda: prewarm(jobs, args.prewarm, b.log), 60)
        if args.prewarm_only:
            return 0
    b.section("bandwidth", b.bandwidth, 5)
    wanted = args.sections.split(",")
    for name, need in (("moe", 30), ("gemlite", 40), ("gemv_single", 20), ("prefill", 100), ("moe_prefill", 20),
                       ("reference_path", 5),
                       ("launch_overhead", 5), ("measure_gemv_gbps", 10)):
        if name in wanted and not (name == "gemlite" and args.gemlite == "off"):
            b.section(name, getattr(b, "gemv_gbps" if name == "measure_gemv_gbps" else name), need)
    b.metrics["elapsed_s"] = round(time.time() - b.t0, 1)
    cmd = "python benchmarks/bench_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:])
    winners = {k: asdict(v) for k, v in b.tuned.items()}
    path = write_result(args.name, b.metrics, command=cmd, notes="; ".join(b.notes), out_dir=args.out_dir,
                        extra={"tuned": winners})
    b.log(f"wrote {path}")
    if args.out_dir and args.sweep:
        # the winners as a strata_plan/kernels/configs/<gpu>.json file (copy it there to ship it), with their source
        gpu = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        entries = {("moe" if k == "moe_kimi-k3.1-pro" else k): v for k, v in b.tuned.items() if k != "moe_kimi-k2"}
        data = tuned.config_file(gpu, f"sm_{major}{minor}", entries,
                                 f"benchmarks/results/{path.name}", os.environ.get("STRATA_GIT_SHA", "unknown"))
        name = gpu.lower().replace(" ", "-") + ".json"
        shipped_file = tuned.CONFIG_DIR / name          # kinds this run did not sweep keep their shipped entries
        if shipped_file.exists():
            kept = {k: v for k, v in tuned.load_config_file(shipped_file)["configs"].items() if k not in data["configs"]}
            data["configs"] = {**kept, **data["configs"]}
            data["source"]["kept_from_shipped"] = sorted(kept)
        Path(args.out_dir, name).write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
