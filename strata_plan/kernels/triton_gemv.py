"""Decode GEMV (M = 1 .. 8 rows of activations) over one packed matrix, in one launch.

    gemv_kernel   grid (cdiv(N, BN) * SPLIT * M,)   out[m, rows] = W[rows, :] @ x[m]

Program (row tile, K split sp, token m) puts its own K slice of x[m] on the int8 grid (phase A, into
scratch that every program of the same (sp, m) writes with the same values), then runs phase B
(`gemv_rows`, DP4A) over that slice. With SPLIT > 1 each program stores its float32 part, and the last
of the SPLIT programs of a (token, row tile) to finish (an atomic counter, as in the MoE down kernel)
adds the parts in the order sp = 0 .. SPLIT-1 and writes out[m, rows] once: no phase-A launch and no
reduction launch, so a single small matrix costs one launch.

The program id runs over m fastest, so the M programs that read the same rows run side by side and
every weight byte comes from HBM once (the other M - 1 reads hit L2).

    quantize_x_kernel   grid (M,)   x [M, K] -> the int8 grid for whole rows (`ops.pack_activations`)
"""
from __future__ import annotations

from .triton_common import gemv_rows, gemv_rows_bf16, gpu_fence, quantize_x_row, tl, triton


@triton.jit
def quantize_x_kernel(x_p, stride_xm, K, KPAD, xq_p, xdx_p, xsum_p, CHUNK: tl.constexpr):
    # x [M, K] (any float) -> xq int8 [M, KPAD] (int32 [M, KPAD/4]), xdx f32 [M, KPAD/32], xsum f32 [M, 3*KPAD/32]
    m = tl.program_id(0)
    quantize_x_row(x_p + m * stride_xm, K, KPAD, 0, KPAD, xq_p + m * (KPAD // 4), xdx_p + m * (KPAD // 32),
                   xsum_p + m * (3 * KPAD // 32), CHUNK)


@triton.jit
def gemv_kernel(x_p, stride_xm, codes_p, scales_p, mins_p, d_p, dmin_p, xq_p, xdx_p, xsum_p, part_p, cnt_p,
                out_p, stride_om, M, N, K, WSPLIT,
                BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr, MIN_BITS: tl.constexpr,
                SB: tl.constexpr, BN: tl.constexpr, BK16: tl.constexpr, SPLIT: tl.constexpr,
                CHUNK: tl.constexpr, USE_ASM: tl.constexpr,
                CG: tl.constexpr = 0):
    # out [M, N] = x [M, K] @ W[N, K]^T; program's K slice: code words sp*WSPLIT .. (sp+1)*WSPLIT.
    # W packed (codes int32 [N, KP*BITS/32], unit-major) or bf16 (codes_p = weight, SPLIT = 1).
    # Scratch: xq int32 [M, KP/4], xdx [M, KP/32], xsum [M, 3*KP/32]; part f32 [SPLIT, M, NT*BN]; cnt int32 [M, NT] zeros.
    pid = tl.program_id(0)
    m = pid % M                                                      # m fastest: rows shared in L2
    sp = (pid // M) % SPLIT
    nt = pid // (M * SPLIT)
    rows = nt * BN + tl.arange(0, BN)                                # [BN]
    ok = rows < N
    if BITS == 16:
        acc = gemv_rows_bf16(codes_p, K, 0, K, rows, ok, x_p + m * stride_xm, BK16)
        tl.store(out_p + m * stride_om + rows, acc.to(out_p.dtype.element_ty), mask=ok)
    else:
        EPW: tl.constexpr = 32 // BITS
        UNIT: tl.constexpr = SB if SB > 0 else GROUP
        KP = tl.cdiv(K, UNIT) * UNIT
        w_lo = sp * WSPLIT
        w_hi = tl.minimum(w_lo + WSPLIT, KP // EPW)
        xq = xq_p + m * (KP // 4)
        xdx = xdx_p + m * (KP // 32)
        xsum = xsum_p + m * (3 * KP // 32)
        quantize_x_row(x_p + m * stride_xm, K, KP, w_lo * EPW, w_hi * EPW, xq, xdx, xsum, CHUNK)
        tl.debug_barrier()          # phase A's stores are read by every thread of the program below
        acc, _unused = gemv_rows(codes_p, scales_p, mins_p, d_p, dmin_p, codes_p, scales_p, mins_p, d_p, dmin_p,
                                 N, rows, ok, xq, xdx, xsum, KP, w_lo, w_hi,
                                 BITS, GROUP, SCALE_BITS, MIN_BITS, SB, 1, CG, USE_ASM)
        if SPLIT == 1:
            tl.store(out_p + m * stride_om + rows, acc.to(out_p.dtype.element_ty), mask=ok)
        else:
            NTB = tl.cdiv(N, BN) * BN
            tl.store(part_p + (sp * M + m) * NTB + rows, acc)
            # every thread's part is stored and fenced before one thread bumps the counter (release) ...
            gpu_fence(sp, USE_ASM)
            tl.debug_barrier()
            cnt = cnt_p + m * tl.cdiv(N, BN) + nt
            done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
            if done == SPLIT - 1:
                # ... and the last one reads them all back in a fixed order (acquire; .cg: from L2)
                gpu_fence(sp, USE_ASM)
                tot = tl.zeros([BN], tl.float32)
                for s2 in range(SPLIT):
                    tot += tl.load(part_p + (s2 * M + m) * NTB + rows, cache_modifier=".cg")
                tl.store(out_p + m * stride_om + rows, tot.to(out_p.dtype.element_ty), mask=ok)
                tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
