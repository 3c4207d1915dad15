"""Decode GEMV (M = 1 .. 8 rows of activations) over one packed matrix: two launches.

    quantize_x_kernel   grid (M,)                 x [M, K] -> the int8 grid           (phase A)
    gemv_kernel         grid (cdiv(N, BN) * M,)   out[m, rows] = W[rows, :] @ x[m]    (phase B, DP4A)

The program id runs over m fastest, so the M programs that read the same rows run side by side and
every weight byte comes from HBM once (the other M - 1 reads hit L2).
"""
from __future__ import annotations

from .triton_common import gemv_rows, gemv_rows_bf16, quantize_x_row, tl, triton


@triton.jit
def quantize_x_kernel(x_p, stride_xm, K, KPAD, xq_p, xdx_p, xsum_p, CHUNK: tl.constexpr):
    # x [M, K] (any float) -> xq int8 [M, KPAD] (int32 [M, KPAD/4]), xdx f32 [M, KPAD/32], xsum f32 [M, 3*KPAD/32]
    m = tl.program_id(0)
    quantize_x_row(x_p + m * stride_xm, K, KPAD, xq_p + m * (KPAD // 4), xdx_p + m * (KPAD // 32),
                   xsum_p + m * (3 * KPAD // 32), CHUNK)


@triton.jit
def gemv_kernel(x_p, stride_xm, codes_p, scales_p, mins_p, d_p, dmin_p, xq_p, xdx_p, xsum_p,
                out_p, stride_om, M, N, K, WSPLIT,
                BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr, MIN_BITS: tl.constexpr,
                SB: tl.constexpr, BN: tl.constexpr, BK16: tl.constexpr, SPLIT: tl.constexpr, NS: tl.constexpr,
                USE_ASM: tl.constexpr):
    # out [SPLIT, M, N] (+)= x [M, K] @ W[N, K]^T over code words sp*WSPLIT .. (sp+1)*WSPLIT; with SPLIT = 1
    # out is the [M, N] result itself. W packed (codes int32 [N, KP*BITS/32]) or bf16 (codes_p = weight).
    pid = tl.program_id(0)
    m = pid % M                                                      # m fastest: rows shared in L2
    sp = (pid // M) % SPLIT
    rows = (pid // (M * SPLIT)) * BN + tl.arange(0, BN)              # [BN]
    ok = rows < N
    if BITS == 16:
        acc = gemv_rows_bf16(codes_p, K, rows, ok, x_p + m * stride_xm, BK16)
    else:
        EPW: tl.constexpr = 32 // BITS
        UNIT: tl.constexpr = SB if SB > 0 else GROUP
        KP = tl.cdiv(K, UNIT) * UNIT
        w_lo = sp * WSPLIT
        w_hi = tl.minimum(w_lo + WSPLIT, KP // EPW)
        acc, _unused = gemv_rows(codes_p, scales_p, mins_p, d_p, dmin_p, codes_p, scales_p, mins_p, d_p, dmin_p,
                                 N, rows, ok, xq_p + m * (KP // 4), xdx_p + m * (KP // 32), xsum_p + m * (3 * KP // 32),
                                 KP, w_lo, w_hi, BITS, GROUP, SCALE_BITS, MIN_BITS, SB, 1, NS, USE_ASM)
    tl.store(out_p + (sp * M + m) * stride_om + rows, acc.to(out_p.dtype.element_ty), mask=ok)
