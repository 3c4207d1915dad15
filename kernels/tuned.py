"""Launch configurations: defaults that are right everywhere, and per-GPU winners of the autotune sweep.

`config_for(kind, fmt, m, n, k, device)` returns a dict of block sizes and warps for one launch. A tuned
entry is keyed by the GPU's name (`torch.cuda.get_device_name`, lowercased) and applies to every shape;
an entry "kind:fmt" (e.g. "gemv:q4_g128_f16") overrides it for one format;
`benchmarks/bench_kernels.py` times its candidate lists and writes the winners (`kernels_tuned.json`),
which are copied into `TUNED` by hand, with the run they came from.
"""
from __future__ import annotations

import torch

# Defaults: sound on any recent NVIDIA GPU, and small enough for the interpreter.
DEFAULTS: dict[str, dict] = {
    # decode GEMV: BN rows per program (a warp covers 32 / W4 rows of a K step, W4 = 8 threads per row for
    # 2-bit codes, 4 for 1- and 4-bit: see triton_common.gemv_rows), NS pipeline stages (1: the codes are
    # not staged through shared memory; staging was 1.5-1.8x slower on the H200, kernels-20261202T021427Z),
    # K split over programs to reach THREADS (at most MAXSPLIT); BK16: the K block of plain bf16 matrices
    "gemv": {"BN": 64, "num_warps": 4, "NS": 1, "CHUNK": 1024, "THREADS": 65536, "MAXSPLIT": 8, "BK16": 128},
    # tensor-core GEMM (prefill); BM drops to 16/64 for small M
    "gemm": {"BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    # fused MoE decode: gate/up (BN1 rows of I, JCHUNK experts per program, warps1, NS1 stages, SPLIT1
    # K splits of H: 0 = enough to fill WAVE1 programs an SM) and down (BN2 rows of H, warps2, NS2, SPLIT2
    # K splits of I); CHUNK: inputs packed per step of phase A
    "moe": {"BN1": 64, "JCHUNK": 1, "warps1": 4, "NS1": 1, "SPLIT1": 1, "WAVE1": 4,
            "BN2": 64, "warps2": 4, "NS2": 1, "SPLIT2": 1, "CHUNK": 1024, "BK16": 128},
    # CG1 / CG2 / CG (gate/up, down, GEMV): code-generation candidates of the decode K loop
    # (triton_common.gemv_rows: 1 DP4A chain in one PTX block, 2 rows clamped, 4 loop unrolled twice),
    # MAXNREG1 / MAXNREG2 / MAXNREG a register cap; both absent: none of them
    # GLUON=1 (tuned entries only): the Hopper GEMM of gluon_gemm from GLUON_MIN_M rows, GBT tokens a tile,
    # GNS x stages, GWARPS warps (8 from GWARPS8_MIN_M rows and GWARPS8_MIN_K columns on), K split up to
    # GSPLIT ways where the tiles leave SMs idle
    # fused MoE prefill: grouped GEMMs
    "moe_grouped": {"BM": 64, "BN": 128, "BK": 64, "num_warps": 4, "num_stages": 3},
}

# Winners of the sweep, per GPU name (see KERNELS.md for the run they came from).
TUNED: dict[str, dict[str, dict]] = {
    # MoE: benchmarks/results/kernels-moe-sweep-20261201T200146Z.json (commit 96b364e). Gate/up: 64-row
    # tiles, 4 warps, no staging, no register prefetch, phase A in 4096-input chunks (52.2 us against 55.8
    # with 1024 at kimi-k3.1-pro's shape); one K split at kimi-k3.1-pro (448 programs, about one wave of
    # 4 a SM at 128 registers), two at Kimi-K2 (256 programs: 32.9 against 39.7 us), which SPLIT1=0 with
    # WAVE1=4 picks for both. Down: 32-row tiles, 4 warps, no split (27.8 / 19.3 us).
    # The same winners again in kernels-20261201T205031Z.json (commit da631aa), where the persistent
    # gate/up candidates lost (66-131 us against 52.1).
    # GEMV: benchmarks/results/kernels-20261201T195309Z.json: 64 rows, 4 warps, no staging, no prefetch;
    # 16 K splits (MAXSPLIT) no better than 8 in kernels-20261201T205031Z.json.
    # GEMM: kernels-20261201T205031Z.json: bf16x2 dequantization (DQ=1) at BM 128 / BN 128 / 4 warps / 4
    # stages, 0.342 against 0.421 ms (q2_g16, gate shape, M = 2048); BM 256 lost (0.424 with DQ=1).
    # Code generation: kernels-20261201T233448Z.json (commit 7e07934, 3 interleaved rounds, medians): gate/up
    # CG1=3 (DP4A chain in one PTX block, rows clamped) capped at 128 registers, 52.8 against 55.1 us at
    # kimi-k3.1-pro (31.1 / 32.1 at Kimi-K2); down CG2=7 (the same, loop unrolled twice) capped at 72,
    # 27.1 against 28.0 (18.8 / 19.3). The GEMV's candidates lost (18.0-19.2 against 17.8 us).
    # Lanes along records (CG & 32): kernels-gemlite-20261202T001204Z.json (commit 757ba5a, 3 interleaved
    # rounds): gate/up CG1=35 capped at 128, 45.0 against 52.7 us for CG1=3 (K3.1; Kimi-K2 26.8 / 31.4);
    # down in 64-row tiles with CG2=35 uncapped, 21.9 against 27.1 for 32-row CG2=7 (K2 15.0 / 18.9);
    # GEMV CG=33, 16.7 against 17.6 us (gate + down, q2_g32). Bit 32 (lanes along records) has since
    # been made the only load path (commit after 757ba5a), so the same kernels are CG1=3, CG2=3, CG=1 now.
    # kernels-20261202T011003Z.json (commit 8e21776, 3 interleaved rounds): the activation lanes loaded
    # lane by lane (CG & 32, no shared memory or barrier in the K loop) won the GEMV sweep (gate + down
    # q2_g32 16.7 against 17.5 us: CG=33) and lost or tied in the MoE launches (gate/up 43.6 against 42.7,
    # down 22.2-23.2 against 22.4; unrolled uncapped 30-51 us). Shipped with CG=33, the GEMV lost on every
    # gate shape and at the profiler's 16384 x 7168 (q1 803 against 1111-1166 GB/s, q2_g16 1382 against
    # 1529-1587: kernels-20261202T011615Z.json, commit b040ba6), so the GEMV keeps CG=1. GEMM: scale bytes
    # a step ahead (PFM=1) 0.328 against 0.339 ms (q2_g16 gate, M = 2048); BM 256 with it 0.320, but 4.3x
    # bf16 at M = 512.
    # kernels-moe-sweep-20261202T045314Z.json (commit 0035cee, 3 interleaved rounds): explicit gate/up K
    # splits 2 / 3 / 4 lost to the automatic choice (kimi-k3.1-pro 53.0 / 57.6 / 60.6 us against 45.7; Kimi-K2,
    # whose automatic choice is 2, 27.0 / 31.7 / 33.9 against 27.0), down split 2 ways too (24.0 against 22.3).
    # kernels-moe-sweep-20261202T052930Z.json (commit 42f8e7e, reverted): the L2 prefetch of the unit 1-3 steps
    # ahead lost in gate/up (43.3-48.0 us against 42.6) and tied in down (21.5-24.9 against 22.2).
    "nvidia h200": {"moe": {"BN1": 64, "warps1": 4, "NS1": 1, "SPLIT1": 0, "WAVE1": 4, "CHUNK": 4096,
                            "BN2": 64, "warps2": 4, "NS2": 1, "SPLIT2": 1,
                            "CG1": 3, "MAXNREG1": 128, "CG2": 3},
                    "gemv": {"BN": 64, "num_warps": 4, "NS": 1, "THREADS": 131072, "CG": 1},
                    # q4: 896 programs at both kimi-k3.1-pro shapes (16 K splits of the gate, 8 of the
                    # down), activation lanes as one load (CG 1). kernels-20261202T005042Z.json: gate
                    # 8.94 us with 16 splits against 12.79 with 8; kernels-20261202T011003Z.json (commit
                    # 8e21776): gate + down 18.5 us against 22.3 for the shared config, 19.8 with CG 33
                    "gemv:q4_g128_f16": {"THREADS": 57344, "MAXSPLIT": 16, "CG": 1},
                    # fused MoE prefill (the grouped Triton kernels): the GEMM's bf16x2 dequantization and
                    # scale prefetch, 14.4 / 15.4 ms against 19.7 / 19.1 without at M = 512 / 2048 on a
                    # whole 384-expert kimi-k3.1-pro layer (kernels-moe-prefill-20261202T071035Z.json)
                    "moe_grouped": {"DQ": 1, "PFM": 1},
                    # GEMM: the Gluon kernel (gluon_gemm: weights dequantized into wgmma's register
                    # operand), 256-token tiles, 3 x stages, 4 warps (kernels-gluon-probe-20261202T023343Z.json:
                    # 8 warps sharing x tiles no faster at M=2048, slower at 512); from M=16 on, where it beat
                    # the Triton GEMM (0.098 against 0.108 ms at 16, 0.062 / 0.109 at 256, q2_g16 gate:
                    # kernels-prefill-20261202T024615Z.json). The Triton GEMM's own winners (DQ, PFM) stay for
                    # the shapes TMA cannot take. K split 2 ways where the tiles leave SMs idle (M <= 256 at
                    # kimi-k3.1-pro's gate: 0.042 against 0.062 ms at 256, 0.074 against 0.093 at 32, even at
                    # 16 and 128: kernels-prefill-20261202T040748Z.json); stream-K over every slot lost everywhere
                    # (gate M=2048 1.47x bf16 against 1.40x, M=512 2.03x against 1.56x:
                    # kernels-prefill-20261202T035547Z.json), so GEMMs of whole tiles stay one program a tile;
                    # a K split at two programs an SM (M = 512 gate, 224 programs) lost too (0.0664 against
                    # 0.0629 ms: benchmarks/data/probe-gluon-programs-0035cee-2tiles2.json).
                    # 8 warps (128-row tiles: half the x traffic a multiply-add, one program an SM) from
                    # M = 1024 at K >= 7168 (the gate/up shape): back to back at the power limit, where the
                    # energy a call sets the time, q2_g16 over bf16 1.26-1.28 against 1.31-1.33 at
                    # M = 1024 and 2048 (the warps rows of kernels-prefill-20261202T061142Z .. 061650Z);
                    # 1.38-1.39 against 1.31-1.32 at M = 512 (too few tiles). In short bursts even or
                    # faster (q2_g32 gate M=2048 1.24-1.27 against 1.33). At K = 3584 (down) slower both
                    # ways (q2_g16 M=2048 1.56-1.64 against 1.41 in bursts, 1.38 against 1.35 back to
                    # back): one program an SM leaves the short tiles' prologue and epilogue uncovered
                    "gemm": {"DQ": 1, "PFM": 1, "GLUON": 1, "GLUON_MIN_M": 16, "GBT": 256, "GNS": 3,
                             "GWARPS": 4, "GWARPS8_MIN_M": 1024, "GWARPS8_MIN_K": 7168, "GSPLIT": 2}},
}

def _device_key(device) -> str | None:
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(device).lower()


def config_for(kind: str, fmt: str, m: int, n: int, k: int, device) -> dict:
    """The launch config for one call (a fresh dict; callers may change it)."""
    cfg = dict(DEFAULTS[kind])
    key = _device_key(device)
    if key is not None:
        for gpu, entries in TUNED.items():
            if gpu in key and kind in entries:
                cfg.update(entries[kind])
                cfg.update(entries.get(f"{kind}:{fmt}", {}))      # a format's own winner, if it has one
                break
    if kind == "gemm":
        cfg["BM"] = 16 if m <= 16 else 64 if m <= 64 else cfg["BM"]
        if cfg["BM"] < 128:
            cfg["num_warps"] = 4
    return cfg
