"""The fused MoE expert call for decode: two launches per layer, any mix of expert formats.

Experts live as blobs in one uint8 arena (`formats.expert_layout`); expert e starts at offsets[e] and
has run-time format code codes[e] (`triton_common.FORMAT_CODES`). Each program reads its experts' codes
and branches to the code of that format; FMASK (a compile-time bit mask of the codes present) leaves
out the branches of formats not in the call. `table` [5, 3, 5] int64 holds, per format code, the byte
offset of each matrix's segments (codes, scales, mins, d, dmin) inside a blob.

  gate_up_kernel  grid (cdiv(I, BN), M, cdiv(TOPK, JCHUNK))
      phase A: x[m] -> the int8 grid, one for every code width (scratch xq, xdx, xsum)
      phase B: for each of its JCHUNK experts: g, u = W_gate x, W_up x on rows n0 .. n0+BN of I;
               h = silu(g) * u, put straight on the int8 grid for that expert's down matrix
               (scratch hq, hdx, hsum; bf16 experts keep h as float32 in hf)
  down_kernel     grid (cdiv(H, BN), M, TOPK)
      part[m, j, rows] = w[m, j] * W_down[e_j][rows, :] @ h[m, j]; the last program of each (m, rows)
      to finish (an atomic counter) sums the TOPK parts in a fixed order and writes out[m, rows] once

Scratch: xq int8 [M, HP] (held as int32 [M, HP/4]), xdx f32 [M, HP/32], xsum f32 [M, 3*HP/32] (sums per
16 inputs, then per 32: `triton_common.quantize_store`); hq, hdx, hsum the same for h over IP, one row
per pair; hf f32 [P, IP]; P = M * TOPK,
HP = cdiv(H, 512) * 512, IP = cdiv(I, 512) * 512: padded to every format's scale unit and written in
full (zeros past H and I), so the GEMV reads whole padded rows unmasked. The gate/up grid covers IP.
"""
from __future__ import annotations

from .triton_common import (blob_segment, gemv_rows, gemv_rows_bf16, gpu_fence, quantize_store, quantize_x_row,
                            tl, triton)

# The kernels' branches spell out each format's constants; they must match the registry (checked in ops).
KERNEL_FORMATS = {
    "q2_g16_s8m4": (0, 2, 16, 8, 4, 512),
    "q2_g32_s8m8": (1, 2, 32, 8, 8, 512),
    "q1_g32_s8m4": (2, 1, 32, 8, 4, 512),
    "q4_g128_f16": (3, 4, 128, 16, 16, 0),
    "bf16": (4, 16, 0, 0, 0, 0),
}


@triton.jit
def _matrix_rows(base, table_p, mat_a, mat_b, N, K, rows, ok, xq_p, xdx_p, xsum_p, XP,
                 CODE: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr,
                 MIN_BITS: tl.constexpr, SB: tl.constexpr, NMAT: tl.constexpr, NS: tl.constexpr,
                 PF: tl.constexpr, USE_ASM: tl.constexpr):
    # [N, K] matrices mat_a (and mat_b if NMAT=2) of an expert blob against the int8 grid: (f32 [BN], f32 [BN])
    EPW: tl.constexpr = 32 // BITS
    UNIT: tl.constexpr = SB if SB > 0 else GROUP
    KP = tl.cdiv(K, UNIT) * UNIT
    return gemv_rows(blob_segment(base, table_p, CODE, mat_a, 0, 32),
                     blob_segment(base, table_p, CODE, mat_a, 1, SCALE_BITS),
                     blob_segment(base, table_p, CODE, mat_a, 2, MIN_BITS),
                     blob_segment(base, table_p, CODE, mat_a, 3, 16),
                     blob_segment(base, table_p, CODE, mat_a, 4, 16),
                     blob_segment(base, table_p, CODE, mat_b, 0, 32),
                     blob_segment(base, table_p, CODE, mat_b, 1, SCALE_BITS),
                     blob_segment(base, table_p, CODE, mat_b, 2, MIN_BITS),
                     blob_segment(base, table_p, CODE, mat_b, 3, 16),
                     blob_segment(base, table_p, CODE, mat_b, 4, 16),
                     N, rows, ok, xq_p, xdx_p, xsum_p, XP, 0, KP // EPW,
                     BITS, GROUP, SCALE_BITS, MIN_BITS, SB, NMAT, NS, PF, USE_ASM)


@triton.jit
def _gate_up_packed(base, table_p, H, I, n0, rows, ok, xq_p, xdx_p, xsum_p, hq_p, hdx_p, hsum_p, IP,
                    CODE: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr,
                    MIN_BITS: tl.constexpr, SB: tl.constexpr, NS: tl.constexpr, PF: tl.constexpr,
                    USE_ASM: tl.constexpr):
    # gate and up rows n0..n0+BN of one packed expert (one pass over K), SiLU-gated, on the int8 grid for down
    BN: tl.constexpr = rows.shape[0]
    HP = tl.cdiv(H, 512) * 512
    if n0 < I:
        g, u = _matrix_rows(base, table_p, 0, 1, I, H, rows, ok, xq_p, xdx_p, xsum_p, HP,
                            CODE, BITS, GROUP, SCALE_BITS, MIN_BITS, SB, 2, NS, PF, USE_ASM)
        h = tl.where(ok, g * tl.sigmoid(g) * u, 0.0)                                  # [BN]
    else:
        h = tl.zeros([BN], tl.float32)                                                # padding past I
    quantize_store(tl.reshape(h, [BN // 32, 32]), n0, IP, hq_p.to(tl.pointer_type(tl.int8)), hdx_p, hsum_p)


@triton.jit
def _gate_up_bf16(base, table_p, H, rows, ok, x_row_p, hf_p, BK: tl.constexpr):
    g = gemv_rows_bf16(blob_segment(base, table_p, 4, 0, 0, 17), H, rows, ok, x_row_p, BK)
    u = gemv_rows_bf16(blob_segment(base, table_p, 4, 1, 0, 17), H, rows, ok, x_row_p, BK)
    tl.store(hf_p + rows, g * tl.sigmoid(g) * u, mask=ok)


@triton.jit
def gate_up_kernel(x_p, stride_xm, ids_p, codes_p, offs_p, arena_p, table_p,
                   xq_p, xdx_p, xsum_p, hq_p, hdx_p, hsum_p, hf_p, H, I,
                   TOPK: tl.constexpr, FMASK: tl.constexpr, JCHUNK: tl.constexpr, BN: tl.constexpr,
                   BK16: tl.constexpr, CHUNK: tl.constexpr, NS: tl.constexpr, PF: tl.constexpr,
                   USE_ASM: tl.constexpr):
    nt = tl.program_id(0)
    m = tl.program_id(1)
    jc = tl.program_id(2)
    HP = tl.cdiv(H, 512) * 512
    IP = tl.cdiv(I, 512) * 512
    x_row = x_p + m * stride_xm
    xq = xq_p + m * (HP // 4)
    xdx = xdx_p + m * (HP // 32)
    xsum = xsum_p + m * (3 * HP // 32)
    # phase A: x[m] on the int8 grid (every program computes the same values: programs run in any order)
    if (FMASK & 15) != 0:
        quantize_x_row(x_row, H, HP, 0, HP, xq, xdx, xsum, CHUNK)
    tl.debug_barrier()          # phase A's stores are read by every thread of the program below
    n0 = nt * BN
    rows = n0 + tl.arange(0, BN)
    ok = rows < I
    for jj in range(JCHUNK):
        j = jc * JCHUNK + jj
        if j < TOPK:
            p = m * TOPK + j
            e = tl.load(ids_p + p)
            code = tl.load(codes_p + e)
            base = arena_p + tl.multiple_of(tl.load(offs_p + e), 256)
            hq = hq_p + p * (IP // 4)
            hdx = hdx_p + p * (IP // 32)
            hsum = hsum_p + p * (3 * IP // 32)
            if (FMASK & 1) != 0:
                if code == 0:
                    _gate_up_packed(base, table_p, H, I, n0, rows, ok, xq, xdx, xsum, hq, hdx, hsum, IP,
                                    0, 2, 16, 8, 4, 512, NS, PF, USE_ASM)
            if (FMASK & 2) != 0:
                if code == 1:
                    _gate_up_packed(base, table_p, H, I, n0, rows, ok, xq, xdx, xsum, hq, hdx, hsum, IP,
                                    1, 2, 32, 8, 8, 512, NS, PF, USE_ASM)
            if (FMASK & 4) != 0:
                if code == 2:
                    _gate_up_packed(base, table_p, H, I, n0, rows, ok, xq, xdx, xsum, hq, hdx, hsum, IP,
                                    2, 1, 32, 8, 4, 512, NS, PF, USE_ASM)
            if (FMASK & 8) != 0:
                if code == 3:
                    _gate_up_packed(base, table_p, H, I, n0, rows, ok, xq, xdx, xsum, hq, hdx, hsum, IP,
                                    3, 4, 128, 16, 16, 0, NS, PF, USE_ASM)
            if (FMASK & 16) != 0:
                if code == 4:
                    _gate_up_bf16(base, table_p, H, rows, ok, x_row, hf_p + p * IP, BK16)


@triton.jit
def down_kernel(ids_p, wts_p, codes_p, offs_p, arena_p, table_p, hq_p, hdx_p, hsum_p, hf_p,
                part_p, cnt_p, out_p, stride_om, H, I,
                TOPK: tl.constexpr, FMASK: tl.constexpr, BN: tl.constexpr, BK16: tl.constexpr,
                NS: tl.constexpr, PF: tl.constexpr, USE_ASM: tl.constexpr):
    # program (row tile nt, token m, expert slot j): part[m, j, rows] = w[m, j] * W_down[e] @ h[m, j].
    # The last of the TOPK programs of (m, nt) to finish (counter cnt[m, nt]) adds the TOPK parts in
    # order j = 0 .. TOPK-1 (deterministic), writes out[m, rows] and resets the counter for the next call.
    nt = tl.program_id(0)
    m = tl.program_id(1)
    j = tl.program_id(2)
    NT = tl.num_programs(0)
    HT = NT * BN
    IP = tl.cdiv(I, 512) * 512
    rows = nt * BN + tl.arange(0, BN)
    ok = rows < H
    p = m * TOPK + j
    e = tl.load(ids_p + p)
    code = tl.load(codes_p + e)
    wt = tl.load(wts_p + p).to(tl.float32)
    base = arena_p + tl.multiple_of(tl.load(offs_p + e), 256)
    hq = hq_p + p * (IP // 4)
    hdx = hdx_p + p * (IP // 32)
    hsum = hsum_p + p * (3 * IP // 32)
    part = tl.zeros([BN], tl.float32)
    if (FMASK & 1) != 0:
        if code == 0:
            part, _u0 = _matrix_rows(base, table_p, 2, 2, H, I, rows, ok, hq, hdx, hsum, IP,
                                     0, 2, 16, 8, 4, 512, 1, NS, PF, USE_ASM)
    if (FMASK & 2) != 0:
        if code == 1:
            part, _u1 = _matrix_rows(base, table_p, 2, 2, H, I, rows, ok, hq, hdx, hsum, IP,
                                     1, 2, 32, 8, 8, 512, 1, NS, PF, USE_ASM)
    if (FMASK & 4) != 0:
        if code == 2:
            part, _u2 = _matrix_rows(base, table_p, 2, 2, H, I, rows, ok, hq, hdx, hsum, IP,
                                     2, 1, 32, 8, 4, 512, 1, NS, PF, USE_ASM)
    if (FMASK & 8) != 0:
        if code == 3:
            part, _u3 = _matrix_rows(base, table_p, 2, 2, H, I, rows, ok, hq, hdx, hsum, IP,
                                     3, 4, 128, 16, 16, 0, 1, NS, PF, USE_ASM)
    if (FMASK & 16) != 0:
        if code == 4:
            part = gemv_rows_bf16(blob_segment(base, table_p, 4, 2, 0, 17), I, rows, ok, hf_p + p * IP, BK16)
    tl.store(part_p + p.to(tl.int64) * HT + rows, wt * part)
    # every thread's part is stored and fenced before one thread bumps the counter (release) ...
    gpu_fence(p, USE_ASM)
    tl.debug_barrier()
    cnt = cnt_p + m * NT + nt
    done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if done == TOPK - 1:
        # ... and the last one reads them all back (acquire; .cg: from L2, never a stale L1 line)
        gpu_fence(p, USE_ASM)
        acc = tl.zeros([BN], tl.float32)
        for jj in range(TOPK):
            acc += tl.load(part_p + (m * TOPK + jj).to(tl.int64) * HT + rows, cache_modifier=".cg")
        tl.store(out_p + m * stride_om + rows, acc.to(out_p.dtype.element_ty), mask=ok)
        tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
