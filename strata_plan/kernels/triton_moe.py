"""The fused MoE expert call for decode: two launches per layer, any mix of expert formats.

Experts live as blobs in one uint8 arena (`formats.expert_layout`); expert e starts at offsets[e] and
has run-time format code codes[e] (`triton_common.FORMAT_CODES`). Each program reads its experts' codes
and branches to the code of that format; FMASK (a compile-time bit mask of the codes present) leaves
out the branches of formats not in the call. `table` [5, 3, 5] int64 holds, per format code, the byte
offset of each matrix's segments (codes, scales, mins, d, dmin) inside a blob.

  gate_up_kernel  grid (cdiv(I, BN), M, TOPK * SPLIT)
      phase A: x[m] -> the int8 grid, one for every code width (scratch xq, xdx, xsum), over the
               program's K split of H
      phase B: for its expert: g, u = W_gate x, W_up x on rows n0 .. n0+BN of I;
               h = silu(g) * u, put straight on the int8 grid for that expert's down matrix
               (scratch hq, hdx, hsum; bf16 experts keep h as float32 in hf). With SPLIT > 1 K
               splits, the last program of each (pair, rows) to finish adds the partial g, u first.
  down_kernel     grid (cdiv(H, BN), M, TOPK * SPLIT)
      part[m, j, s, rows] = w[m, j] * W_down[e_j][rows, split s] @ h[m, j]; the last program of each
      (m, rows) to finish (an atomic counter) sums the parts in a fixed order and writes out[m, rows]

Skipped pairs: an expert id < 0 in topk_ids contributes nothing (the engine runs a prefill chunk in waves
of the experts resident at once). Its gate/up programs read no weights and leave h = 0 on the grid; its
down programs store a zero part (the counters still count them, so every row tile is written).
K splits are about filling the GPU, not about bytes. At batch 1 the gate/up grid is at most one wave
of programs, and at Kimi-K2's I = 2048 it does not even fill the SMs. Splits gain 21% at K2 (gate/up
32.9 against 39.7 us on the H200: benchmarks/bench_kernels.py, KERNELS.md), a loss where the grid
already fills the GPU. A persistent variant (resident programs taking (pair, row tile) items from a
counter, against the 2x cost spread between 2-bit and 1-bit experts' rows) is slower at every setting
and not carried (KERNELS.md lists the losing candidates).

Scratch: xq int8 [M, HP] (held as int32 [M, HP/4]), xdx f32 [M, HP/32], xsum f32 [M, 3*HP/32] (sums per
16 inputs, then per 32: `triton_common.quantize_store`); hq, hdx, hsum the same for h over IP, one row
per pair; hf f32 [P, IP]; P = M * TOPK,
HP = cdiv(H, 512) * 512, IP = cdiv(I, 512) * 512: padded to every format's scale unit and written in
full (zeros past H and I), so the GEMV reads whole padded rows unmasked. The gate/up grid covers IP.
"""
from __future__ import annotations

from .triton_common import blob_segment, gemv_rows, gemv_rows_bf16, gpu_fence, quantize_store, quantize_x_row, tl, triton

# The kernels' branches spell out each format's constants; they must match the registry (checked in ops).
KERNEL_FORMATS = {
    "q2_g16_s8m4": (0, 2, 16, 8, 4, 512),
    "q2_g32_s8m8": (1, 2, 32, 8, 8, 512),
    "q1_g32_s8m4": (2, 1, 32, 8, 4, 512),
    "q4_g128_f16": (3, 4, 128, 16, 16, 0),
    "bf16": (4, 16, 0, 0, 0, 0),
}


@triton.jit
def _matrix_rows(base, table_p, mat_a, mat_b, N, K, k_lo, k_hi, rows, ok, xq_p, xdx_p, xsum_p, XP,
                 CODE: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr,
                 MIN_BITS: tl.constexpr, SB: tl.constexpr, NMAT: tl.constexpr, CG: tl.constexpr,
                 USE_ASM: tl.constexpr):
    # inputs k_lo .. k_hi (multiples of 512) of the [N, K] matrices mat_a (and mat_b if NMAT=2) of an expert
    # blob against the int8 grid: (f32 [BN], f32 [BN]); zeros where the range starts past the matrix's K
    EPW: tl.constexpr = 32 // BITS
    UNIT: tl.constexpr = SB if SB > 0 else GROUP
    BN: tl.constexpr = rows.shape[0]
    KP = tl.cdiv(K, UNIT) * UNIT
    w_lo = k_lo // EPW
    w_hi = tl.minimum(k_hi, KP) // EPW
    a = tl.zeros([BN], tl.float32)
    b = tl.zeros([BN], tl.float32)
    if w_lo < w_hi:
        a, b = gemv_rows(blob_segment(base, table_p, CODE, mat_a, 0, 32),
                         blob_segment(base, table_p, CODE, mat_a, 1, SCALE_BITS),
                         blob_segment(base, table_p, CODE, mat_a, 2, MIN_BITS),
                         blob_segment(base, table_p, CODE, mat_a, 3, 16),
                         blob_segment(base, table_p, CODE, mat_a, 4, 16),
                         blob_segment(base, table_p, CODE, mat_b, 0, 32),
                         blob_segment(base, table_p, CODE, mat_b, 1, SCALE_BITS),
                         blob_segment(base, table_p, CODE, mat_b, 2, MIN_BITS),
                         blob_segment(base, table_p, CODE, mat_b, 3, 16),
                         blob_segment(base, table_p, CODE, mat_b, 4, 16),
                         N, rows, ok, xq_p, xdx_p, xsum_p, XP, w_lo, w_hi,
                         BITS, GROUP, SCALE_BITS, MIN_BITS, SB, NMAT, CG, USE_ASM)
    return a, b


@triton.jit
def _packed_rows_any(base, table_p, code, mat_a, mat_b, N, K, k_lo, k_hi, rows, ok, xq_p, xdx_p, xsum_p, XP,
                     FMASK: tl.constexpr, NMAT: tl.constexpr, CG: tl.constexpr, USE_ASM: tl.constexpr):
    # `_matrix_rows` for the packed expert of run-time format code `code` (branches only for the codes in
    # FMASK; zeros for bf16, which the callers read themselves, and for a skipped pair's code -1)
    BN: tl.constexpr = rows.shape[0]
    a = tl.zeros([BN], tl.float32)
    b = tl.zeros([BN], tl.float32)
    if (FMASK & 1) != 0:
        if code == 0:
            a, b = _matrix_rows(base, table_p, mat_a, mat_b, N, K, k_lo, k_hi, rows, ok, xq_p, xdx_p, xsum_p, XP,
                                0, 2, 16, 8, 4, 512, NMAT, CG, USE_ASM)
    if (FMASK & 2) != 0:
        if code == 1:
            a, b = _matrix_rows(base, table_p, mat_a, mat_b, N, K, k_lo, k_hi, rows, ok, xq_p, xdx_p, xsum_p, XP,
                                1, 2, 32, 8, 8, 512, NMAT, CG, USE_ASM)
    if (FMASK & 4) != 0:
        if code == 2:
            a, b = _matrix_rows(base, table_p, mat_a, mat_b, N, K, k_lo, k_hi, rows, ok, xq_p, xdx_p, xsum_p, XP,
                                2, 1, 32, 8, 4, 512, NMAT, CG, USE_ASM)
    if (FMASK & 8) != 0:
        if code == 3:
            a, b = _matrix_rows(base, table_p, mat_a, mat_b, N, K, k_lo, k_hi, rows, ok, xq_p, xdx_p, xsum_p, XP,
                                3, 4, 128, 16, 16, 0, NMAT, CG, USE_ASM)
    return a, b


@triton.jit
def _split_sum(v, w, part_p, n_parts, idx, IP, cnt, USE_ASM: tl.constexpr):
    """K-split reduction of one row tile: store this program's parts v, w (f32 [BN] each) as part
    `idx` (of n_parts, rows [0, IP) each), then count it at cnt. Returns (last, v_sum, w_sum): the
    program that arrives last gets last = True and the sums of all parts in a fixed order (so repeated
    calls are bit-identical), and resets the counter for the next call; the others get False."""
    BN: tl.constexpr = v.shape[0]
    r = tl.arange(0, BN)
    tl.store(part_p + idx.to(tl.int64) * 2 * IP + r, v)
    tl.store(part_p + idx.to(tl.int64) * 2 * IP + IP + r, w)
    # every thread's part is stored and fenced before one thread bumps the counter (release) ...
    gpu_fence(idx, USE_ASM)
    tl.debug_barrier()
    done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    last = done == n_parts - 1
    sv = tl.zeros([BN], tl.float32)
    sw = tl.zeros([BN], tl.float32)
    if last:
        # ... and the last one reads them all back (acquire; .cg: from L2, never a stale L1 line)
        gpu_fence(idx, USE_ASM)
        for q in range(n_parts):
            sv += tl.load(part_p + q * 2 * IP + r, cache_modifier=".cg")
            sw += tl.load(part_p + q * 2 * IP + IP + r, cache_modifier=".cg")
        tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
    return last, sv, sw


@triton.jit
def _gate_up_pair(x_row, ids_p, codes_p, offs_p, arena_p, table_p, xq, xdx, xsum, hq_p, hdx_p, hsum_p, hf_p,
                  gpart_p, cnt_p, H, I, p, nt, NT, s, k_lo, k_hi,
                  FMASK: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, BK16: tl.constexpr,
                  CG: tl.constexpr, USE_ASM: tl.constexpr):
    # one work item: gate and up rows nt*BN .. of pair p's expert over inputs k_lo .. k_hi (x on the grid
    # at xq, xdx, xsum), then h = silu(g) * u packed for down (with SPLIT > 1, by the last of the splits)
    HP = tl.cdiv(H, 512) * 512
    IP = tl.cdiv(I, 512) * 512
    n0 = nt * BN
    rows = n0 + tl.arange(0, BN)
    ok = rows < I
    e = tl.load(ids_p + p)
    code = tl.where(e >= 0, tl.load(codes_p + tl.maximum(e, 0)), -1)    # -1: a skipped pair, no branch
    base = arena_p + tl.multiple_of(tl.load(offs_p + tl.maximum(e, 0)), 256)
    g = tl.zeros([BN], tl.float32)
    u = tl.zeros([BN], tl.float32)
    if n0 < I:                                            # rows past I (padding) stay zero
        g, u = _packed_rows_any(base, table_p, code, 0, 1, I, H, k_lo, k_hi, rows, ok, xq, xdx, xsum, HP,
                                FMASK, 2, CG, USE_ASM)
        if (FMASK & 16) != 0:
            if code == 4:
                g = gemv_rows_bf16(blob_segment(base, table_p, 4, 0, 0, 17), H, k_lo, k_hi, rows, ok, x_row, BK16)
                u = gemv_rows_bf16(blob_segment(base, table_p, 4, 1, 0, 17), H, k_lo, k_hi, rows, ok, x_row, BK16)
    last = True
    if SPLIT > 1:
        last, g, u = _split_sum(g, u, gpart_p + p.to(tl.int64) * SPLIT * 2 * IP + n0, SPLIT, s, IP,
                                cnt_p + p * NT + nt, USE_ASM)
    if last:
        h = tl.where(ok, g * tl.sigmoid(g) * u, 0.0)                                  # [BN]
        if (FMASK & 16) != 0:
            if code == 4:
                tl.store(hf_p + p * IP + rows, h, mask=ok)                            # bf16 down reads float h
        if (FMASK & 15) != 0:
            if code != 4:                                                          # h on the int8 grid for down
                quantize_store(tl.reshape(h, [BN // 32, 32]), n0, IP,
                               (hq_p + p * (IP // 4)).to(tl.pointer_type(tl.int8)),
                               hdx_p + p * (IP // 32), hsum_p + p * (3 * IP // 32))


@triton.jit
def gate_up_kernel(x_p, stride_xm, ids_p, codes_p, offs_p, arena_p, table_p,
                   xq_p, xdx_p, xsum_p, hq_p, hdx_p, hsum_p, hf_p, gpart_p, cnt_p, M, H, I, KU,
                   TOPK: tl.constexpr, FMASK: tl.constexpr, BN: tl.constexpr,
                   SPLIT: tl.constexpr, BK16: tl.constexpr, CHUNK: tl.constexpr,
                   USE_ASM: tl.constexpr, CG: tl.constexpr = 0):
    # grid (NT, M, TOPK * SPLIT): program (row tile nt, token m, z = s * TOPK + j) does rows nt*BN .. of I
    #   for expert j of the token, over inputs s*KU*512 .. (s+1)*KU*512 of H (K split s of SPLIT). With
    #   SPLIT > 1 the partial g, u go to gpart f32 [P, SPLIT, 2, IP] and the last of the SPLIT programs of
    #   (pair, nt) to finish (counter cnt[p * NT + nt]) adds them.
    # CG: code-generation options of the K loop (triton_common.gemv_rows; the tuned ones in configs/)
    HP = tl.cdiv(H, 512) * 512
    IP = tl.cdiv(I, 512) * 512
    NT = IP // BN
    nt = tl.program_id(0)
    m = tl.program_id(1)
    j = tl.program_id(2) % TOPK
    s = tl.program_id(2) // TOPK
    k_lo = s * KU * 512
    k_hi = tl.minimum(k_lo + KU * 512, HP)
    x_row = x_p + m * stride_xm
    xq = xq_p + m * (HP // 4)
    xdx = xdx_p + m * (HP // 32)
    xsum = xsum_p + m * (3 * HP // 32)
    # phase A: this K split of x[m] on the int8 grid (programs of one split compute the same values)
    if (FMASK & 15) != 0:
        quantize_x_row(x_row, H, HP, k_lo, k_hi, xq, xdx, xsum, CHUNK)
    tl.debug_barrier()      # phase A's stores are read by every thread of the program below
    _gate_up_pair(x_row, ids_p, codes_p, offs_p, arena_p, table_p, xq, xdx, xsum, hq_p, hdx_p, hsum_p,
                  hf_p, gpart_p, cnt_p, H, I, m * TOPK + j, nt, NT, s, k_lo, k_hi,
                  FMASK, BN, SPLIT, BK16, CG, USE_ASM)


@triton.jit
def down_kernel(ids_p, wts_p, codes_p, offs_p, arena_p, table_p, hq_p, hdx_p, hsum_p, hf_p,
                part_p, cnt_p, out_p, stride_om, H, I, KU,
                TOPK: tl.constexpr, FMASK: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr,
                BK16: tl.constexpr, USE_ASM: tl.constexpr, CG: tl.constexpr = 0):
    # program (row tile nt, token m, z = s * TOPK + j): part = w[m, j] * W_down[e_j][rows, K split s] @ h[m, j]
    # over inputs s*KU*512 .. (s+1)*KU*512 of I. The last of the TOPK * SPLIT programs of (m, nt) to finish
    # (counter cnt[m, nt]) adds the parts in a fixed order, writes out[m, rows] once and resets the counter.
    nt = tl.program_id(0)
    m = tl.program_id(1)
    j = tl.program_id(2) % TOPK
    s = tl.program_id(2) // TOPK
    NT = tl.num_programs(0)
    HT = NT * BN
    IP = tl.cdiv(I, 512) * 512
    k_lo = s * KU * 512
    k_hi = tl.minimum(k_lo + KU * 512, IP)
    rows = nt * BN + tl.arange(0, BN)
    ok = rows < H
    p = m * TOPK + j
    e = tl.load(ids_p + p)
    code = tl.where(e >= 0, tl.load(codes_p + tl.maximum(e, 0)), -1)    # -1: a skipped pair, a zero part
    wt = tl.where(e >= 0, tl.load(wts_p + p).to(tl.float32), 0.0)
    base = arena_p + tl.multiple_of(tl.load(offs_p + tl.maximum(e, 0)), 256)
    hq = hq_p + p * (IP // 4)
    hdx = hdx_p + p * (IP // 32)
    hsum = hsum_p + p * (3 * IP // 32)
    part, _unused = _packed_rows_any(base, table_p, code, 2, 2, H, I, k_lo, k_hi, rows, ok, hq, hdx, hsum, IP,
                                     FMASK, 1, CG, USE_ASM)
    if (FMASK & 16) != 0:
        if code == 4:
            part = gemv_rows_bf16(blob_segment(base, table_p, 4, 2, 0, 17), I, k_lo, k_hi, rows, ok,
                                  hf_p + p * IP, BK16)
    tl.store(part_p + (p * SPLIT + s).to(tl.int64) * HT + rows, wt * part)
    # every thread's part is stored and fenced before one thread bumps the counter (release) ...
    gpu_fence(p, USE_ASM)
    tl.debug_barrier()
    cnt = cnt_p + m * NT + nt
    done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if done == TOPK * SPLIT - 1:
        # ... and the last one reads them all back (acquire; .cg: from L2, never a stale L1 line)
        gpu_fence(p, USE_ASM)
        acc = tl.zeros([BN], tl.float32)
        for q in range(TOPK * SPLIT):
            acc += tl.load(part_p + (m * TOPK * SPLIT + q).to(tl.int64) * HT + rows, cache_modifier=".cg")
        tl.store(out_p + m * stride_om + rows, acc.to(out_p.dtype.element_ty), mask=ok)
        tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
