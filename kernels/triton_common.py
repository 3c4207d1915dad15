"""Building blocks shared by the Triton kernels: format constants, the int8 activation grid, the
packed-word dot product (DP4A), and the dequantized tile used by the tensor-core GEMM.

Decode (a few tokens) is bound by instruction issue, not by bytes, if every code is unpacked and
converted to float on its own: at 2 bits a byte holds 4 weights, and shift + mask + convert + FMA per
weight is more work per byte than an H200's SMs can do at 4.8 TB/s. So the decode kernels keep the
activations on an int8 grid (one scale per 32 inputs, `reference.quantize_activations`) and multiply
packed codes by them four at a time with DP4A:

    word      int32, EPW = 32 / BITS codes; byte j holds codes j*S .. j*S + S-1, S = 8 / BITS, low bits first
    lanes_s = (word >> BITS*s) & LANEMASK           -> byte j = code j*S + s of the word, s = 0..S-1
    X_s     = int8 activations at the same positions  (x8[w*EPW + j*S + s], j = 0..3, one byte each)
    isum   += dp4a(lanes_s, X_s)                     -> sum over the word of q * x8, 2 ops per 4 weights

and per group:  out += S * dx * isum - M * sum(x)   (w = S*q - M, x ~ dx * x8).

The activations are packed into the X_s words once ("phase A": `pack_words`) and read by every row.
Under TRITON_INTERPRET=1 (CPU tests) DP4A is emulated with plain integer ops; the arithmetic is the same.
"""
from __future__ import annotations

import os

import torch

# The kernels are interpreted (TRITON_INTERPRET=1) where there is no GPU: the @triton.jit decorators in
# the kernel modules read this variable when they run, so it is set before they are imported.
# STRATA_TRITON_COMPILE_ONLY=1 keeps them compiled on a machine without a GPU (to build for sm_90 there).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" or (
    not torch.cuda.is_available() and os.environ.get("STRATA_TRITON_COMPILE_ONLY") != "1")
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# Triton decides interpreter or compiler for its own library functions (tl.max, tl.sum...) when it is
# first imported: if something imported it before the variable above was set, interpreted kernels fail.
if INTERPRET:
    from triton.runtime.interpreter import InterpretedFunction as _IF
    INTERPRETER_OK = isinstance(tl.standard.max, _IF)
else:
    INTERPRETER_OK = False

from .formats import FORMATS  # noqa: E402

if INTERPRET:
    # Compiled kernels wrap on int32 overflow (DP4A's emulation shifts bytes out on purpose); the
    # interpreter would check every integer op for overflow instead, twice as slow and unlike the GPU.
    from triton.runtime import interpreter as _interp
    _interp.interpreter_builder.options = _interp.InterpreterOptions(sanitize_overflow=False)

USE_ASM = not INTERPRET          # DP4A through inline PTX on the GPU, emulated in the interpreter
XBLOCK = 32                      # activations: one int8 scale per 32 inputs
FORMAT_CODES = tuple(FORMATS)    # run-time format code = index in this tuple (bf16 is the last)
BF16_CODE = FORMAT_CODES.index("bf16")
SEGS = ("codes", "scales", "mins", "d", "dmin")


def format_constants(code: int) -> dict:
    """Compile-time constants of the format with run-time code `code` (kernel keyword arguments)."""
    f = FORMATS[FORMAT_CODES[code]]
    if f.is_bf16:
        return dict(CODE=code, BITS=16, GROUP=1, SCALE_BITS=0, MIN_BITS=0, SB=0)
    return dict(CODE=code, BITS=f.bits, GROUP=f.group, SCALE_BITS=f.scale_bits, MIN_BITS=f.min_bits,
                SB=f.superblock)


def tile_words_limit(code: int) -> int:
    """Largest K tile (in 32-bit code words) of the decode kernels: one scale unit, so a tile never
    straddles two super-blocks (or two fp16 groups), and its d / dmin (S / M) are one value per row."""
    f = FORMATS[FORMAT_CODES[code]]
    epw = 32 // f.bits
    return (f.superblock or f.group) // epw


# ----------------------------------------------------------------------------------------- arithmetic

@triton.jit
def dp4a(a, b, c, USE_ASM: tl.constexpr):
    """c + sum over the 4 bytes of a_j * b_j (signed bytes; a's bytes here are codes < 128)."""
    if USE_ASM:
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        acc = c
        for j in tl.static_range(4):
            acc += ((a >> (8 * j)) & 255) * ((b << (24 - 8 * j)) >> 24)
        return acc


@triton.jit
def u2f(v):
    """Small non-negative int32 (< 2^23) to float32 without the quarter-rate convert: 2^23 + v, minus 2^23."""
    return (v | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def i2f(v):
    """Small signed int32 (|v| < 2^22) to float32: bits of 1.5 * 2^23 + v, minus 1.5 * 2^23."""
    return (v + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def blob_segment(base, table_p, code, mat, seg, ELT: tl.constexpr):
    """Typed pointer to segment `seg` (codes, scales, mins, d, dmin) of matrix `mat` (gate, up, down) of
    the expert blob at `base` (uint8 pointer); table_p: int64 [codes, 3, 5] segment byte offsets.
    ELT: 32 int32 words, 16 fp16, 17 bf16, else bytes."""
    off = tl.load(table_p + (code * 3 + mat) * 5 + seg)
    p = base + tl.multiple_of(off, 256)
    if ELT == 32:
        return p.to(tl.pointer_type(tl.int32))
    elif ELT == 16:
        return p.to(tl.pointer_type(tl.float16))
    elif ELT == 17:
        return p.to(tl.pointer_type(tl.bfloat16))
    else:
        return p


@triton.jit
def gpu_fence(v, USE_ASM: tl.constexpr):
    """fence.acq_rel.gpu in every thread (the interpreter runs programs one at a time: nothing to do).
    v: any int32 scalar; returned unchanged, so the fence can be ordered by data dependence."""
    if USE_ASM:
        return tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.b32 $0, $1;", "=r,r", [v], dtype=tl.int32,
                                         is_pure=False, pack=1)
    else:
        return v


@triton.jit
def mma(a, b, acc, INTERP: tl.constexpr):
    """acc + a @ b with a, b rounded to bf16 (tensor cores, fp32 accumulate). The interpreter's bf16 dot
    is wrong (it multiplies raw bits), so there the bf16 values are widened to fp32 first: exact."""
    a = a.to(tl.bfloat16)
    b = b.to(tl.bfloat16)
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


# ------------------------------------------------------------------------------ phase A: pack the x words

@triton.jit
def pack_words(x4, BITS: tl.constexpr):
    """x4 float32 [NB, WPB, 4, S]: NB blocks of 32 activations, WPB words per block, element
    (b, w, j, s) = x[b*32 + w*EPW + j*S + s]. Returns (X [NB, WPB, S] int32: X_s words; dx [NB];
    xsum [NB, WPB]: the sum of x over each word). BITS only names the layout (x4's last dim is S)."""
    amax = tl.max(tl.max(tl.max(tl.abs(x4), 3), 2), 1)                     # [NB]
    inv = tl.where(amax > 0, 127.0 / amax, 0.0)
    v = x4 * inv[:, None, None, None]
    x8 = tl.where(v >= 0, v + 0.5, v - 0.5).to(tl.int32)                   # round half away from zero
    sh = (tl.arange(0, 4) * 8)[None, None, :, None]
    X = tl.sum((x8 & 255) << sh, 2)          # [NB, WPB, S]: disjoint bytes, so the (wrapping) sum is an OR
    xsum = tl.sum(tl.sum(x4, 3), 2)                                         # [NB, WPB]
    return X, amax / 127.0, xsum


@triton.jit
def store_words(X, dx, xsum, word0, nwords_total, xq_p, xdx_p, xsum_p, BITS: tl.constexpr):
    """Store pack_words' output for words word0 .. word0 + NB*WPB: xq s-major [S, nwords_total]."""
    S: tl.constexpr = 8 // BITS
    EPW: tl.constexpr = 32 // BITS
    WPB: tl.constexpr = 32 // EPW if EPW < 32 else 1
    NB: tl.constexpr = X.shape[0]
    w = word0 + tl.arange(0, NB)[:, None] * WPB + tl.arange(0, WPB)[None, :]        # [NB, WPB]
    s = tl.arange(0, S)[None, None, :]
    tl.store(xq_p + s * nwords_total + w[:, :, None], X)
    tl.store(xsum_p + w, xsum)
    tl.store(xdx_p + (word0 * EPW) // 32 + tl.arange(0, NB), dx)


@triton.jit
def quantize_x_row(x_p, K, KPAD, xq_p, xdx_p, xsum_p, BITS: tl.constexpr, CHUNK: tl.constexpr):
    """Phase A for one activation row x[0:K]: int8 grid + X_s words for BITS-bit codes, written for
    KPAD inputs (a multiple of 32; zeros past K), so the GEMV can read whole padded rows unmasked.

    xq: s-major [S, KPAD/EPW] int32; xdx [KPAD/32]; xsum [KPAD/EPW]. CHUNK inputs per step."""
    S: tl.constexpr = 8 // BITS
    EPW: tl.constexpr = 32 // BITS
    WPB: tl.constexpr = 32 // EPW if EPW < 32 else 1
    NB: tl.constexpr = CHUNK // 32
    nwords = KPAD // EPW
    b = tl.arange(0, NB)[:, None, None, None]
    w = tl.arange(0, WPB)[None, :, None, None]
    j = tl.arange(0, 4)[None, None, :, None]
    s = tl.arange(0, S)[None, None, None, :]
    for c0 in range(0, KPAD, CHUNK):
        offs = c0 + b * 32 + w * EPW + j * S + s                                  # [NB, WPB, 4, S]
        x4 = tl.load(x_p + offs, mask=offs < K, other=0.0).to(tl.float32)
        X, dx, xsum = pack_words(x4, BITS)
        wi = c0 // EPW + tl.arange(0, NB)[:, None] * WPB + tl.arange(0, WPB)[None, :]    # [NB, WPB]
        ok = wi < nwords                                                          # the last chunk may overhang
        si = tl.arange(0, S)[None, None, :]
        tl.store(xq_p + si * nwords + wi[:, :, None], X, mask=ok[:, :, None])
        tl.store(xsum_p + wi, xsum, mask=ok)
        bi = c0 // 32 + tl.arange(0, NB)
        tl.store(xdx_p + bi, dx, mask=bi < KPAD // 32)


# ------------------------------------------------------------------- phase B: one matrix, one row tile

@triton.jit
def _unit_loads(codes_p, scales_p, mins_p, d_p, dmin_p, r3, m3, rows, row_ok, t, u, ROWW, NG, NU,
                BITS: tl.constexpr, GROUP: tl.constexpr, MIN_BITS: tl.constexpr, SB: tl.constexpr,
                W4: tl.constexpr):
    """One scale unit (K step) of the rows r3 [BN, 1, 1]: codes words t .. t + 4*W4 as [BN, W4, 4] int32
    (a thread holds 4 consecutive words of one row: one 16-byte load), and the unit's scales and mins in
    tiles whose last dimension is as contiguous, so every row tile shares the codes' thread layout:
        q2_g16  sc [BN, W4, 4] (a byte per word)   mins [BN, W4, 2] (two 4-bit mins per byte)
        q2_g32  sc [BN, W4, 2] (a byte per 2 words) mins [BN, W4, 2] (a byte per 2 words)
        q1_g32  sc [BN, W4, 4] (a byte per word)   mins [BN, W4, 2] (two 4-bit mins per byte)
        q4_g128 S [BN] fp16, M [BN] fp16 (one group per unit)
    and d, dmin [BN] fp16 (super-block formats; zeros otherwise). Rows past row_ok read as zeros."""
    j3 = tl.arange(0, W4)[None, :, None]
    i4 = tl.arange(0, 4)[None, None, :]
    i2 = tl.arange(0, 2)[None, None, :]
    words = tl.load(codes_p + r3 * ROWW + (t + j3 * 4 + i4), mask=m3, other=0)
    if SB == 0:
        a = tl.load(scales_p + rows * NG + u, mask=row_ok, other=0.0)
        b = tl.load(mins_p + rows * NG + u, mask=row_ok, other=0.0)
        return words, a, b, 0, 0
    else:
        EPW: tl.constexpr = 32 // BITS
        WPG: tl.constexpr = GROUP // EPW                   # words per group: 1 or 2
        g0 = t // WPG                                      # first group of the unit
        if WPG == 1:
            sc = tl.load(scales_p + r3 * NG + (g0 + j3 * 4 + i4), mask=m3, other=0)
        else:
            sc = tl.load(scales_p + r3 * NG + (g0 + j3 * 2 + i2), mask=m3, other=0)
        if MIN_BITS == 4:
            mb = tl.load(mins_p + r3 * (NG // 2) + (g0 // 2 + j3 * 2 + i2), mask=m3, other=0)
        else:
            mb = tl.load(mins_p + r3 * NG + (g0 + j3 * 2 + i2), mask=m3, other=0)
        d = tl.load(d_p + rows * NU + u, mask=row_ok, other=0.0)
        dmin = tl.load(dmin_p + rows * NU + u, mask=row_ok, other=0.0)
        return words, sc, mb, d, dmin


@triton.jit
def _pairs(v):
    """[BN, W4, 4] -> [BN, W4, 2]: sums of elements (0, 1) and (2, 3) of each thread's four (in registers)."""
    return tl.sum(tl.reshape(v, [v.shape[0], v.shape[1], 2, 2]), 3)


@triton.jit
def _unit_fold(acc, isum, sc, mb, d, dmin, xdx_p, xsum_p, t,
               BITS: tl.constexpr, GROUP: tl.constexpr, MIN_BITS: tl.constexpr, SB: tl.constexpr,
               W4: tl.constexpr):
    """acc [BN, W4] += this unit's  sum_g S_g * dx * isum_g - M_g * xsum_g  for each thread's 4 words.

    isum [BN, W4, 4]: sum over each word of q * x8. Group scales multiply the integer sums (sc * isum
    stays below 2^22, so i2f converts it exactly in two ops); each activation block's dx is applied once
    per block; d and dmin once per unit. The min term uses the exact sums of x over each group, read as
    the even and odd words' sums (xsum is per word) so they line up with the two 4-bit mins of a byte."""
    j3 = tl.arange(0, W4)[None, :, None]
    i2 = tl.arange(0, 2)[None, None, :]
    i4 = tl.arange(0, 4)[None, None, :]
    if SB == 0:
        # fp16 S, M per group of 128 (one group per unit, 16 words): dx per 4 words (one thread's four)
        dx = tl.load(xdx_p + t // 4 + j3)                                                    # [1, W4, 1]
        xs = tl.load(xsum_p + t + j3 * 4 + i4)                                               # [1, W4, 4]
        st = tl.sum(i2f(isum) * dx, 2)                                                       # [BN, W4]
        acc = tl.fma(sc.to(tl.float32)[:, None], st, acc)                                    # S [BN]
        acc = tl.fma(-mb.to(tl.float32)[:, None], tl.sum(xs, 2), acc)                       # M [BN]
        return acc
    else:
        xe = tl.load(xsum_p + t + j3 * 4 + i2 * 2)                                           # [1, W4, 2]
        xo = tl.load(xsum_p + t + j3 * 4 + i2 * 2 + 1)
        if BITS == 2:
            dx = tl.load(xdx_p + t // 2 + j3 * 2 + i2)                                       # [1, W4, 2]
            if GROUP == 16:
                a = _pairs(isum * sc.to(tl.int32))                     # a group per word, dx per 2 words
            else:
                a = _pairs(isum) * sc.to(tl.int32)                     # a group (and dx) per 2 words
            st = tl.sum(i2f(a) * dx, 2)
        else:
            dx = tl.load(xdx_p + t + j3 * 4 + i4)                                            # [1, W4, 4]
            st = tl.sum(i2f(isum * sc.to(tl.int32)) * dx, 2)           # group and dx per word
        mbi = mb.to(tl.int32)
        if MIN_BITS == 4:
            mt = tl.sum(u2f(mbi & 15) * xe + u2f(mbi >> 4) * xo, 2)    # byte k: groups 2k (low), 2k+1 (high)
        else:
            mt = tl.sum(u2f(mbi) * (xe + xo), 2)                       # a byte per 2-word group
        acc = tl.fma(d.to(tl.float32)[:, None], st, acc)
        acc = tl.fma(-dmin.to(tl.float32)[:, None], mt, acc)
        return acc


@triton.jit
def gemv_rows(a_codes, a_scales, a_mins, a_d, a_dmin, b_codes, b_scales, b_mins, b_d, b_dmin,
              K, rows, row_ok, xq_p, xdx_p, xsum_p, XW, w_lo, w_hi,
              BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr, MIN_BITS: tl.constexpr,
              SB: tl.constexpr, NMAT: tl.constexpr, NS: tl.constexpr, USE_ASM: tl.constexpr):
    """sum_k w[rows, k] * x[k] over code words w_lo .. w_hi of one packed matrix (a), or of two
    matrices of the same shape and format at once (NMAT=2: gate and up share the activation loads).

    Codes are int32 words [N, KP*BITS/32]; the activations were packed by phase A (xq: X_s words,
    s-major [S, XW]; xsum [XW]; xdx [XW*EPW/32]) for at least KP inputs (zeros past K), so whole
    padded rows are read without column masks. w_lo, w_hi: multiples of the unit's words (WPU).
    rows [BN] int32, row_ok [BN] mask. Returns (float32 [BN], float32 [BN]); b's is 0 for NMAT=1.

    Layout: one K step is one scale unit (a 512-weight super-block, or a 128-weight fp16 group), WPU
    words of each row, tiled [BN, W4, 4]: 4 consecutive words per thread, W4 threads along a row, so a
    warp reads whole 128-byte (2-bit) or 64-byte lines of 32/W4 rows, and each thread keeps its 4 words'
    activations in registers for all of its rows (BN / (32/W4 * warps) of them). The per-row partial
    sums are added across threads once, at the end."""
    S: tl.constexpr = 8 // BITS
    EPW: tl.constexpr = 32 // BITS
    LANEMASK: tl.constexpr = ((1 << BITS) - 1) * 0x01010101
    UNIT: tl.constexpr = SB if SB > 0 else GROUP
    WPU: tl.constexpr = UNIT // EPW                      # words per unit: 32 (2-bit), 16 (1-bit, 4-bit)
    W4: tl.constexpr = WPU // 4
    KP = tl.cdiv(K, UNIT) * UNIT
    ROWW = tl.multiple_of(KP // EPW, 16)                  # code words per row
    NG = KP // GROUP                                      # groups per row
    NU = KP // UNIT                                       # scale units per row
    BN: tl.constexpr = rows.shape[0]
    r3 = rows[:, None, None].to(tl.int64)
    m3 = row_ok[:, None, None]
    j3 = tl.arange(0, W4)[None, :, None]
    i4 = tl.arange(0, 4)[None, None, :]
    acc_a = tl.zeros([BN, W4], tl.float32)
    acc_b = tl.zeros([BN, W4], tl.float32)
    for t in tl.range(w_lo, w_hi, WPU, num_stages=NS):
        u = t // WPU
        wa, sa, ma, da, dma = _unit_loads(a_codes, a_scales, a_mins, a_d, a_dmin, r3, m3, rows, row_ok, t, u,
                                          ROWW, NG, NU, BITS, GROUP, MIN_BITS, SB, W4)
        isa = tl.zeros([BN, W4, 4], tl.int32)
        if NMAT == 2:
            wb, sb, mbb, db, dmb = _unit_loads(b_codes, b_scales, b_mins, b_d, b_dmin, r3, m3, rows, row_ok, t, u,
                                               ROWW, NG, NU, BITS, GROUP, MIN_BITS, SB, W4)
            isb = tl.zeros([BN, W4, 4], tl.int32)
        for s in tl.static_range(S):
            xs = tl.load(xq_p + s * XW + (t + j3 * 4 + i4))                                 # [1, W4, 4]
            isa = dp4a((wa >> (BITS * s)) & LANEMASK, xs, isa, USE_ASM)
            if NMAT == 2:
                isb = dp4a((wb >> (BITS * s)) & LANEMASK, xs, isb, USE_ASM)
        acc_a = _unit_fold(acc_a, isa, sa, ma, da, dma, xdx_p, xsum_p, t, BITS, GROUP, MIN_BITS, SB, W4)
        if NMAT == 2:
            acc_b = _unit_fold(acc_b, isb, sb, mbb, db, dmb, xdx_p, xsum_p, t, BITS, GROUP, MIN_BITS, SB, W4)
    return tl.sum(acc_a, 1), tl.sum(acc_b, 1)


@triton.jit
def gemv_rows_bf16(w_p, K, rows, row_ok, x_p, BK: tl.constexpr):
    """sum_k w[rows, k] * x[k] for a plain bf16 [N, K] matrix and float activations x_p[0:K]."""
    BN: tl.constexpr = rows.shape[0]
    r2 = rows[:, None].to(tl.int64)
    acc = tl.zeros([BN, BK], tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        kok = ks < K
        w = tl.load(w_p + r2 * K + ks[None, :], mask=row_ok[:, None] & kok[None, :], other=0.0)
        x = tl.load(x_p + ks, mask=kok, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    return tl.sum(acc, 1)


# ----------------------------------------------------------------- the GEMM's dequantized [BK, BN] tile

@triton.jit
def dequant_tile(codes_p, scales_p, mins_p, d_p, dmin_p, K, k0, cols, col_ok,
                 BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr, MIN_BITS: tl.constexpr,
                 SB: tl.constexpr, BK: tl.constexpr):
    """W^T[k0:k0+BK, cols] = S * q - M as float32 [BK, BN] (cols [BN] output rows, col_ok their mask).

    k0 is a multiple of BK, and BK divides the scale unit (super-block, or the fp16 group). Codes are
    read once as bytes and spread over their EPB codes in registers; scales once per group."""
    EPB: tl.constexpr = 8 // BITS
    UNIT: tl.constexpr = SB if SB > 0 else GROUP
    GT: tl.constexpr = BK // GROUP if BK > GROUP else 1          # groups in the tile
    GS: tl.constexpr = BK // GT                                  # weights of one group in the tile
    BN: tl.constexpr = cols.shape[0]
    KP = tl.cdiv(K, UNIT) * UNIT
    ROWB = KP // EPB
    NG = KP // GROUP
    c3 = cols[None, None, :].to(tl.int64)
    ok3 = col_ok[None, None, :]
    gi = tl.arange(0, GT)[:, None, None]
    bi = k0 // EPB + gi * (GS // EPB) + tl.arange(0, GS // EPB)[None, :, None]          # [GT, GS/EPB, 1]
    byts = tl.load(codes_p + c3 * ROWB + bi, mask=ok3, other=0).to(tl.int32)           # [GT, GS/EPB, BN]
    sh = (tl.arange(0, EPB) * BITS)[None, None, :, None]
    q = u2f((byts[:, :, None, :] >> sh) & ((1 << BITS) - 1))                           # [GT, GS/EPB, EPB, BN]
    g2 = k0 // GROUP + tl.arange(0, GT)[:, None]                                        # [GT, 1]
    c2 = cols[None, :].to(tl.int64)
    ok2 = col_ok[None, :]
    if SCALE_BITS == 16:
        S = tl.load(scales_p + c2 * NG + g2, mask=ok2, other=0.0).to(tl.float32)          # [GT, BN]
        M = tl.load(mins_p + c2 * NG + g2, mask=ok2, other=0.0).to(tl.float32)
    else:
        NU = KP // SB
        u = k0 // SB
        sc = u2f(tl.load(scales_p + c2 * NG + g2, mask=ok2, other=0).to(tl.int32))
        if MIN_BITS == 4:
            mb = tl.load(mins_p + c2 * (NG // 2) + g2 // 2, mask=ok2, other=0).to(tl.int32)
            mn = u2f((mb >> ((g2 & 1) * 4)) & 15)
        else:
            mn = u2f(tl.load(mins_p + c2 * NG + g2, mask=ok2, other=0).to(tl.int32))
        d = tl.load(d_p + cols * NU + u, mask=col_ok, other=0.0).to(tl.float32)
        dmin = tl.load(dmin_p + cols * NU + u, mask=col_ok, other=0.0).to(tl.float32)
        S = d[None, :] * sc
        M = dmin[None, :] * mn
    w = S[:, None, None, :] * q - M[:, None, None, :]
    return tl.reshape(w, [BK, BN])
