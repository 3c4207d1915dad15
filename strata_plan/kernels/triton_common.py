"""Building blocks shared by the Triton kernels: format constants, the int8 activation grid, the
packed-word dot product (DP4A), and the dequantized tile used by the tensor-core GEMM.

Decode (a few tokens) is bound by instruction issue, not by bytes, if every code is unpacked and
converted to float on its own: at 2 bits a byte holds 4 weights, and shift + mask + convert + FMA per
weight is more work per byte than an H200's SMs can do at 4.8 TB/s. So the decode kernels keep the
activations on an int8 grid (one scale per 32 inputs, `reference.quantize_activations`) and multiply
packed codes by them four at a time with DP4A:

    word      int32, EPW = 32 / BITS codes; code 4*s + j in byte j, bits BITS*s .. (`quantizer.pack_bits`)
    lanes_s = (word >> BITS*s) & LANEMASK           -> byte j = code 4*s + j of the word, s = 0..S-1
    X_s     = int8 activations of the same inputs     (x8[w*EPW + 4*s + j], j = 0..3: one int32 word)
    isum   += dp4a(lanes_s, X_s)                     -> sum over the word of q * x8, 2 ops per 4 weights

and per group:  out += S * dx * isum - M * sum(x)   (w = S*q - M, x ~ dx * x8), S = 8 / BITS lanes.

A lane's codes are four consecutive inputs, so X_s is activation word w*S + s of the plain int8 row:
phase A (`quantize_x_row`) packs it once for every code width, and every row reads it.
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

from .formats import FORMAT_CODES, FORMATS  # noqa: E402

if INTERPRET:
    # Compiled kernels wrap on int32 overflow (DP4A's emulation shifts bytes out on purpose); the
    # interpreter would check every integer op for overflow instead, twice as slow and unlike the GPU.
    from triton.runtime import interpreter as _interp
    _interp.interpreter_builder.options = _interp.InterpreterOptions(sanitize_overflow=False)

USE_ASM = not INTERPRET          # DP4A through inline PTX on the GPU, emulated in the interpreter
BF16_CODE = FORMAT_CODES.index("bf16")


def format_constants(code: int) -> dict:
    """Compile-time constants of the format with run-time code `code` (kernel keyword arguments)."""
    f = FORMATS[FORMAT_CODES[code]]
    if f.is_bf16:
        return dict(CODE=code, BITS=16, GROUP=1, SCALE_BITS=0, MIN_BITS=0, SB=0)
    return dict(CODE=code, BITS=f.bits, GROUP=f.group, SCALE_BITS=f.scale_bits, MIN_BITS=f.min_bits,
                SB=f.superblock)


def tile_words_limit(code: int) -> int:
    """The decode kernels' K step in 32-bit code words: one scale unit (a super-block, or an fp16
    group), so a step's d / dmin (S / M) are one value per row; K splits are whole steps."""
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
def quantize_store(v, i0, XP, x8_p, xdx_p, xsum_p):
    """Put v float32 [NB, 32] (activations i0 .. i0 + NB*32 of a row padded to XP, i0 a multiple of 32)
    on the int8 grid and store it: x8 int8 at x8_p[i], dx per 32 at xdx_p[i/32], and the exact sums of
    v per 16 inputs at xsum_p[i/16] and per 32 at xsum_p[XP/16 + i/32] (the kernels' min terms)."""
    NB: tl.constexpr = v.shape[0]
    amax = tl.max(tl.abs(v), 1)                                                   # [NB]
    inv = tl.where(amax > 0, 127.0 / amax, 0.0)
    w = v * inv[:, None]
    x8 = tl.where(w >= 0, w + 0.5, w - 0.5).to(tl.int32)                         # round half away from zero
    b = tl.arange(0, NB)
    tl.store(x8_p + i0 + b[:, None] * 32 + tl.arange(0, 32)[None, :], x8.to(tl.int8))
    tl.store(xdx_p + i0 // 32 + b, amax / 127.0)
    s16 = tl.sum(tl.reshape(v, [NB, 2, 16]), 2)                                   # [NB, 2]
    tl.store(xsum_p + i0 // 16 + b[:, None] * 2 + tl.arange(0, 2)[None, :], s16)
    tl.store(xsum_p + XP // 16 + i0 // 32 + b, tl.sum(s16, 1))


@triton.jit
def _quantize_chunk(x_p, K, XP, c0, x8_p, xdx_p, xsum_p, NB: tl.constexpr):
    # inputs c0 .. c0 + NB*32 of the row: one [NB, 32] load, then `quantize_store`
    offs = c0 + tl.arange(0, NB)[:, None] * 32 + tl.arange(0, 32)[None, :]
    v = tl.load(x_p + offs, mask=offs < K, other=0.0).to(tl.float32)
    quantize_store(v, c0, XP, x8_p, xdx_p, xsum_p)


@triton.jit
def quantize_x_row(x_p, K, XP, lo, hi, xq_p, xdx_p, xsum_p, CHUNK: tl.constexpr):
    """Phase A for inputs lo .. hi (multiples of 32) of one activation row x[0:K] padded to XP (zeros
    past K), so the GEMV reads whole padded rows unmasked: xq int8 [XP] (an int32 [XP/4] buffer), xdx
    [XP/32], xsum [XP/16 + XP/32] (`quantize_store`). The same grid serves every code width.

    Whole CHUNKs first, then the rest in halving pieces (CHUNK/2, CHUNK/4 .. 32): every piece is one
    load round trip, and a program waits on a few of them before its first weight load."""
    x8_p = xq_p.to(tl.pointer_type(tl.int8))
    end = lo + (hi - lo) // CHUNK * CHUNK
    for c0 in range(lo, end, CHUNK):
        _quantize_chunk(x_p, K, XP, c0, x8_p, xdx_p, xsum_p, CHUNK // 32)
    tl.static_assert(CHUNK >= 32 and CHUNK <= 16384 and (CHUNK & (CHUNK - 1)) == 0)
    r0 = end
    for i in tl.static_range(1, 10):            # the rest < CHUNK: its binary digits, largest first
        if CHUNK >> i >= 32:
            if hi - r0 >= CHUNK >> i:
                _quantize_chunk(x_p, K, XP, r0, x8_p, xdx_p, xsum_p, (CHUNK >> i) // 32)
                r0 += CHUNK >> i


# ------------------------------------------------------------------- phase B: one matrix, one row tile

@triton.jit
def _ld(ptr, mask, other, CG: tl.constexpr):
    # a load of _unit_loads: rows past N clamped (CG & 2: no mask), or masked to `other`
    if (CG & 2) != 0:
        return tl.load(ptr)
    else:
        return tl.load(ptr, mask=mask, other=other)


@triton.jit
def _ld_rows(p, r2, STRIDE: tl.constexpr, W4: tl.constexpr, PER: tl.constexpr, m2, CG: tl.constexpr):
    # records r2 [BN, 1] of STRIDE elements: their first W4 * PER elements as [BN, W4, PER]. Loaded as
    # [W4, BN, PER] and permuted (free: a layout change): Triton lays lanes along the vector dimension
    # and then along the lower-numbered of two equally contiguous dimensions, so here a warp's lanes run
    # along each record. Loaded as [BN, W4, PER], the lanes would run along rows instead and every warp load
    # fetch 2-8x the 32-byte sectors it needs (Nsight Compute's excess sectors: benchmarks/tools/ncu_excess.py)
    BN: tl.constexpr = r2.shape[0]
    r3 = tl.reshape(r2, [1, BN, 1])
    offs = r3 * STRIDE + tl.arange(0, W4)[:, None, None] * PER + tl.arange(0, PER)[None, None, :]
    v = _ld(p + offs, tl.reshape(m2, [1, BN, 1]), 0, CG)
    return tl.permute(v, (1, 0, 2))


@triton.jit
def _unit_loads(codes_p, scales_p, mins_p, d_p, dmin_p, N, rows, row_ok, u,
                BITS: tl.constexpr, GROUP: tl.constexpr, MIN_BITS: tl.constexpr, SB: tl.constexpr,
                W4: tl.constexpr, CG: tl.constexpr):
    """Scale unit u (K step) of the rows [BN]: codes as [BN, W4, 4] int32 (a thread holds 4 consecutive
    words of one row: one 16-byte load), and the unit's scales and mins in tiles whose last dimension is
    as contiguous, so every row tile shares the codes' thread layout:
        q2_g16  sc [BN, W4, 4] (a byte per word)   mins [BN, W4, 2] (two 4-bit mins per byte)
        q2_g32  sc [BN, W4, 2] (a byte per 2 words) mins [BN, W4, 2] (a byte per 2 words)
        q1_g32  sc [BN, W4, 4] (a byte per word)   mins [BN, W4, 2] (two 4-bit mins per byte)
        q4_g128 S [BN] fp16, M [BN] fp16 (one group per unit)
    and d, dmin [BN] fp16 (super-block formats; zeros otherwise). Storage is unit-major ([NU, N, per
    unit]: formats.py), so consecutive rows of one unit are consecutive bytes in every tensor. Rows past
    row_ok read as zeros, or (CG & 2) as row N - 1 again: clamped, not masked, so no register is zeroed
    before each load; the callers drop those rows either way. Every tile is read with a warp's lanes
    along the records (`_ld_rows`), so a warp's load covers whole 32-byte sectors."""
    EPW: tl.constexpr = 32 // BITS
    UNIT: tl.constexpr = SB if SB > 0 else GROUP
    GPU: tl.constexpr = UNIT // GROUP                      # groups per row and unit
    if (CG & 2) != 0:
        ru = u * N + tl.minimum(rows, N - 1)               # [BN]: (unit, row) record index
    else:
        ru = u * N + rows
    r2 = ru[:, None].to(tl.int64)
    m2 = row_ok[:, None]
    words = _ld_rows(codes_p, r2, UNIT // EPW, W4, 4, m2, CG)
    if SB == 0:
        a = _ld(scales_p + ru, row_ok, 0.0, CG)
        b = _ld(mins_p + ru, row_ok, 0.0, CG)
        return words, a, b, 0, 0
    else:
        if GROUP // EPW == 1:                              # a group per word
            sc = _ld_rows(scales_p, r2, GPU, W4, 4, m2, CG)
        else:
            sc = _ld_rows(scales_p, r2, GPU, W4, 2, m2, CG)
        if MIN_BITS == 4:
            mb = _ld_rows(mins_p, r2, GPU // 2, W4, 2, m2, CG)
        else:
            mb = _ld_rows(mins_p, r2, GPU, W4, 2, m2, CG)
        d = _ld(d_p + ru, row_ok, 0.0, CG)
        dmin = _ld(dmin_p + ru, row_ok, 0.0, CG)
        return words, sc, mb, d, dmin


@triton.jit
def _x_lanes(xq_p, t, W4: tl.constexpr, S: tl.constexpr):
    """The int8 activations of a thread's 4 code words t + 4j .. t + 4j + 3, as S tensors [1, W4, 4]:
    X_s of word c is activation word c*S + s (its four int8s are the inputs of the codes in lane s of
    the code word's four bytes). One contiguous [4*S] int32 load a thread, then split; Triton moves
    the split tiles to the codes' layout through shared memory, with two barriers a step. (S loads of
    4 words each, lane by lane, needs neither, but it loses or ties in the MoE launches and at the gate
    shapes, and is not carried: KERNELS.md.)"""
    j3 = tl.arange(0, W4)[None, :, None]
    x = tl.load(xq_p + (t + j3 * 4) * S + tl.arange(0, 4 * S)[None, None, :])       # [1, W4, 4*S]
    if S == 2:
        a, b = tl.split(tl.reshape(x, [1, W4, 4, 2]))
        return a, b, a, a, a, a, a, a
    elif S == 4:
        x = tl.reshape(x, [1, W4, 4, 2, 2])                # s = 2*h + l
        e, o = tl.split(x)                                 # l = 0, 1: [1, W4, 4, 2] over h
        x0, x2 = tl.split(e)
        x1, x3 = tl.split(o)
        return x0, x1, x2, x3, x0, x0, x0, x0
    else:
        x = tl.reshape(x, [1, W4, 4, 2, 2, 2])             # s = 4*h + 2*m + l
        e, o = tl.split(x)
        e0, e1 = tl.split(e)                               # (l, m) = (0, 0), (0, 1)
        o0, o1 = tl.split(o)
        x0, x4 = tl.split(e0)
        x2, x6 = tl.split(e1)
        x1, x5 = tl.split(o0)
        x3, x7 = tl.split(o1)
        return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _pairs(v):
    """[BN, W4, 4] -> [BN, W4, 2]: sums of elements (0, 1) and (2, 3) of each thread's four (in registers)."""
    return tl.sum(tl.reshape(v, [v.shape[0], v.shape[1], 2, 2]), 3)


@triton.jit
def _unit_fold(acc, isum, sc, mb, d, dmin, xdx_p, xsum_p, XP, t,
               BITS: tl.constexpr, GROUP: tl.constexpr, MIN_BITS: tl.constexpr, SB: tl.constexpr,
               W4: tl.constexpr):
    """acc [BN, W4] += this unit's  sum_g S_g * dx * isum_g - M_g * xsum_g  for each thread's 4 words.

    isum [BN, W4, 4]: sum over each word of q * x8. Group scales multiply the integer sums (sc * isum
    stays below 2^22, so i2f converts it exactly in two ops); each activation block's dx is applied once
    per block; d and dmin once per unit. The min term uses the exact sums of x over each group (xsum:
    per 16 inputs, then per 32), read for the even and odd groups of a thread so they line up with the
    two 4-bit mins of a byte."""
    j3 = tl.arange(0, W4)[None, :, None]
    i2 = tl.arange(0, 2)[None, None, :]
    i4 = tl.arange(0, 4)[None, None, :]
    w0 = t + j3 * 4                                        # first word of each thread's four
    if SB == 0:
        # fp16 S, M per group of 128 (one group per unit, 16 words): dx per 4 words (one thread's four)
        dx = tl.load(xdx_p + w0 // 4)                                                     # [1, W4, 1]
        xs = tl.load(xsum_p + XP // 16 + w0 // 4)                                          # [1, W4, 1]
        st = tl.sum(i2f(isum) * dx, 2)                                                    # [BN, W4]
        acc = tl.fma(sc.to(tl.float32)[:, None], st, acc)                                 # S [BN]
        acc = tl.fma(-mb.to(tl.float32)[:, None], tl.sum(xs, 2), acc)                     # M [BN]
        return acc
    else:
        if BITS == 2:
            dx = tl.load(xdx_p + w0 // 2 + i2)                                            # [1, W4, 2]
            if GROUP == 16:
                a = _pairs(isum * sc.to(tl.int32))                     # a group per word, dx per 2 words
                xe = tl.load(xsum_p + w0 + i2 * 2)                     # sums of 16: words 4j, 4j+2
                xo = tl.load(xsum_p + w0 + i2 * 2 + 1)                 # words 4j+1, 4j+3
            else:
                a = _pairs(isum) * sc.to(tl.int32)                     # a group (and dx) per 2 words
                xe = tl.load(xsum_p + XP // 16 + w0 // 2 + i2)         # sums of 32: the thread's 2 groups
                xo = xe
            st = tl.sum(i2f(a) * dx, 2)
        else:
            dx = tl.load(xdx_p + w0 + i4)                                                 # [1, W4, 4]
            st = tl.sum(i2f(isum * sc.to(tl.int32)) * dx, 2)           # group and dx per word
            xe = tl.load(xsum_p + XP // 16 + w0 + i2 * 2)              # sums of 32: words 4j, 4j+2
            xo = tl.load(xsum_p + XP // 16 + w0 + i2 * 2 + 1)
        mbi = mb.to(tl.int32)
        if MIN_BITS == 4:
            mt = tl.sum(u2f(mbi & 15) * xe + u2f(mbi >> 4) * xo, 2)    # byte k: groups 2k (low), 2k+1 (high)
        else:
            mt = tl.sum(u2f(mbi) * xe, 2)                              # a byte per 2-word group
        acc = tl.fma(d.to(tl.float32)[:, None], st, acc)
        acc = tl.fma(-dmin.to(tl.float32)[:, None], mt, acc)
        return acc


# One PTX block per code word for the DP4A chain of `_lane_dots`: the first DP4A adds to an immediate 0
# (no zeroed register a word), and at 1 bit one shift serves two lanes (s and s + 4: the high lane is
# masked in place, so its DP4A sums 16 * q * x8 into a second accumulator, exact, shifted back once).
_DOTS4 = tl.constexpr(
    "{\n\t.reg .b32 a, v;\n\tand.b32 a, $1, 0x0F0F0F0F;\n\tdp4a.s32.s32 $0, a, $2, 0;\n\t"
    "shr.u32 v, $1, 4;\n\tand.b32 a, v, 0x0F0F0F0F;\n\tdp4a.s32.s32 $0, a, $3, $0;\n\t}")
_DOTS2 = tl.constexpr(
    "{\n\t.reg .b32 a, v;\n\tand.b32 a, $1, 0x03030303;\n\tdp4a.s32.s32 $0, a, $2, 0;\n\t"
    "shr.u32 v, $1, 2;\n\tand.b32 a, v, 0x03030303;\n\tdp4a.s32.s32 $0, a, $3, $0;\n\t"
    "shr.u32 v, $1, 4;\n\tand.b32 a, v, 0x03030303;\n\tdp4a.s32.s32 $0, a, $4, $0;\n\t"
    "shr.u32 v, $1, 6;\n\tand.b32 a, v, 0x03030303;\n\tdp4a.s32.s32 $0, a, $5, $0;\n\t}")
_DOTS1 = tl.constexpr(
    "{\n\t.reg .b32 a, v, h;\n\t"
    "and.b32 a, $1, 0x01010101;\n\tdp4a.s32.s32 $0, a, $2, 0;\n\t"
    "and.b32 a, $1, 0x10101010;\n\tdp4a.s32.s32 h, a, $6, 0;\n\t"
    "shr.u32 v, $1, 1;\n\tand.b32 a, v, 0x01010101;\n\tdp4a.s32.s32 $0, a, $3, $0;\n\t"
    "and.b32 a, v, 0x10101010;\n\tdp4a.s32.s32 h, a, $7, h;\n\t"
    "shr.u32 v, $1, 2;\n\tand.b32 a, v, 0x01010101;\n\tdp4a.s32.s32 $0, a, $4, $0;\n\t"
    "and.b32 a, v, 0x10101010;\n\tdp4a.s32.s32 h, a, $8, h;\n\t"
    "shr.u32 v, $1, 3;\n\tand.b32 a, v, 0x01010101;\n\tdp4a.s32.s32 $0, a, $5, $0;\n\t"
    "and.b32 a, v, 0x10101010;\n\tdp4a.s32.s32 h, a, $9, h;\n\t"
    "shr.s32 h, h, 4;\n\tadd.s32 $0, $0, h;\n\t}")


@triton.jit
def _lane_dots(w, x0, x1, x2, x3, x4, x5, x6, x7, BITS: tl.constexpr, CG: tl.constexpr, USE_ASM: tl.constexpr):
    """Sum over each code word of q * x8: one DP4A per lane (S = 8 / BITS lanes of 4 codes). CG & 1: the
    chain as one PTX block a word (`_DOTS*`)."""
    LANEMASK: tl.constexpr = ((1 << BITS) - 1) * 0x01010101
    if USE_ASM and (CG & 1) != 0:
        if BITS == 4:
            return tl.inline_asm_elementwise(_DOTS4, "=r,r,r,r", [w, x0, x1], dtype=tl.int32, is_pure=True, pack=1)
        elif BITS == 2:
            return tl.inline_asm_elementwise(_DOTS2, "=r,r,r,r,r,r", [w, x0, x1, x2, x3],
                                             dtype=tl.int32, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise(_DOTS1, "=r,r,r,r,r,r,r,r,r,r", [w, x0, x1, x2, x3, x4, x5, x6, x7],
                                             dtype=tl.int32, is_pure=True, pack=1)
    else:
        isum = dp4a(w & LANEMASK, x0, tl.zeros_like(w), USE_ASM)
        isum = dp4a((w >> BITS) & LANEMASK, x1, isum, USE_ASM)
        if BITS <= 2:
            isum = dp4a((w >> 2 * BITS) & LANEMASK, x2, isum, USE_ASM)
            isum = dp4a((w >> 3 * BITS) & LANEMASK, x3, isum, USE_ASM)
        if BITS == 1:
            isum = dp4a((w >> 4) & LANEMASK, x4, isum, USE_ASM)
            isum = dp4a((w >> 5) & LANEMASK, x5, isum, USE_ASM)
            isum = dp4a((w >> 6) & LANEMASK, x6, isum, USE_ASM)
            isum = dp4a((w >> 7) & LANEMASK, x7, isum, USE_ASM)
        return isum


@triton.jit
def _unit_dot(acc, loads, x0, x1, x2, x3, x4, x5, x6, x7,
              xdx_p, xsum_p, XP, t, BITS: tl.constexpr, GROUP: tl.constexpr, MIN_BITS: tl.constexpr,
              SB: tl.constexpr, W4: tl.constexpr, CG: tl.constexpr, USE_ASM: tl.constexpr):
    # acc [BN, W4] += one unit of one matrix, from its loads (words, sc, mb, d, dmin)
    words, sc, mb, d, dmin = loads
    isum = _lane_dots(words, x0, x1, x2, x3, x4, x5, x6, x7, BITS, CG, USE_ASM)
    return _unit_fold(acc, isum, sc, mb, d, dmin, xdx_p, xsum_p, XP, t, BITS, GROUP, MIN_BITS, SB, W4)


@triton.jit
def gemv_rows(a_codes, a_scales, a_mins, a_d, a_dmin, b_codes, b_scales, b_mins, b_d, b_dmin,
              N, rows, row_ok, xq_p, xdx_p, xsum_p, XP, w_lo, w_hi,
              BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr, MIN_BITS: tl.constexpr,
              SB: tl.constexpr, NMAT: tl.constexpr, CG: tl.constexpr, USE_ASM: tl.constexpr):
    """sum_k w[rows, k] * x[k] over code words w_lo .. w_hi of one packed matrix (a), or of two
    matrices of the same shape and format at once (NMAT=2: gate and up share the activation loads).

    The matrices are [N, K], stored unit-major (formats.py; codes as int32 words); the activations were
    put on the int8 grid by phase A (`quantize_x_row`: xq int8 as int32 words, xdx, xsum) for XP >= KP inputs (zeros past K), so whole padded rows are read without column masks.
    w_lo < w_hi: multiples of the unit's words (WPU). rows [BN] int32, row_ok [BN] mask. Returns
    (float32 [BN], float32 [BN]); b's is 0 for NMAT=1.

    Layout: one K step is one scale unit (a 512-weight super-block, or a 128-weight fp16 group), WPU
    words of each row, tiled [BN, W4, 4]: 4 consecutive words per thread, W4 threads along a row, so a
    warp reads whole 128-byte (2-bit) or 64-byte lines of 32/W4 rows, and each thread keeps its 4 words'
    activations in registers for all of its rows (BN / (32/W4 * warps) of them). The per-row partial
    sums are added across threads once, at the end.

    One pipeline stage, loop not unrolled: staging the codes through shared memory (cp.async), register
    prefetch of the next step and unrolling all lose on the H200 and are not carried (KERNELS.md).

    CG: code-generation options (the H200's are in configs/): CG & 1 the DP4A chain as one PTX block a
    word, CG & 2 rows past N clamped instead of masked."""
    S: tl.constexpr = 8 // BITS
    EPW: tl.constexpr = 32 // BITS
    UNIT: tl.constexpr = SB if SB > 0 else GROUP
    WPU: tl.constexpr = UNIT // EPW                      # words per unit: 32 (2-bit), 16 (1-bit, 4-bit)
    W4: tl.constexpr = WPU // 4
    BN: tl.constexpr = rows.shape[0]
    acc_a = tl.zeros([BN, W4], tl.float32)
    acc_b = tl.zeros([BN, W4], tl.float32)
    for t in tl.range(w_lo, w_hi, WPU, num_stages=1, loop_unroll_factor=1):
        x0, x1, x2, x3, x4, x5, x6, x7 = _x_lanes(xq_p, t, W4, S)
        la = _unit_loads(a_codes, a_scales, a_mins, a_d, a_dmin, N, rows, row_ok, t // WPU,
                         BITS, GROUP, MIN_BITS, SB, W4, CG)
        acc_a = _unit_dot(acc_a, la, x0, x1, x2, x3, x4, x5, x6, x7,
                          xdx_p, xsum_p, XP, t, BITS, GROUP, MIN_BITS, SB, W4, CG, USE_ASM)
        if NMAT == 2:
            lb = _unit_loads(b_codes, b_scales, b_mins, b_d, b_dmin, N, rows, row_ok, t // WPU,
                             BITS, GROUP, MIN_BITS, SB, W4, CG)
            acc_b = _unit_dot(acc_b, lb, x0, x1, x2, x3, x4, x5, x6,
                              x7, xdx_p, xsum_p, XP, t, BITS, GROUP, MIN_BITS, SB, W4, CG, USE_ASM)
    return tl.sum(acc_a, 1), tl.sum(acc_b, 1)


@triton.jit
def gemv_rows_bf16(w_p, K, k_lo, k_hi, rows, row_ok, x_p, BK: tl.constexpr):
    """sum over k in k_lo .. min(k_hi, K) of w[rows, k] * x[k] for a plain bf16 [N, K] matrix and float
    activations x_p[0:K] (k_lo a multiple of BK)."""
    BN: tl.constexpr = rows.shape[0]
    r2 = rows[:, None].to(tl.int64)
    acc = tl.zeros([BN, BK], tl.float32)
    for k0 in range(k_lo, tl.minimum(k_hi, K), BK):
        ks = k0 + tl.arange(0, BK)
        kok = ks < K
        w = tl.load(w_p + r2 * K + ks[None, :], mask=row_ok[:, None] & kok[None, :], other=0.0)
        x = tl.load(x_p + ks, mask=kok, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    return tl.sum(acc, 1)


# ----------------------------------------------------------------- the GEMM's dequantized [BK, BN] tile

@triton.jit
def tile_words(codes_p, N, k0, cols, col_ok, BITS: tl.constexpr, GROUP: tl.constexpr, SB: tl.constexpr,
               BK: tl.constexpr):
    """The code words of the K tile k0 .. k0+BK of the rows cols of a unit-major [N, K] matrix (formats.py),
    int32 [GT, GS/EPW, BN]: GT groups in the tile, GS weights of a group in it."""
    EPW: tl.constexpr = 32 // BITS
    UNIT: tl.constexpr = SB if SB > 0 else GROUP
    WPU: tl.constexpr = UNIT // EPW                              # code words per row and unit
    GT: tl.constexpr = BK // GROUP if BK > GROUP else 1          # groups in the tile
    GS: tl.constexpr = BK // GT                                  # weights of one group in the tile
    u = k0 // UNIT
    kin = k0 - u * UNIT                                          # offset of the tile inside its unit
    ru = (u * N + cols).to(tl.int64)                             # [BN]: (unit, row) record index
    wi = kin // EPW + tl.arange(0, GT)[:, None, None] * (GS // EPW) + tl.arange(0, GS // EPW)[None, :, None]
    return tl.load(codes_p + ru[None, None, :] * WPU + wi, mask=col_ok[None, None, :], other=0)


@triton.jit
def tile_meta(scales_p, mins_p, d_p, dmin_p, N, k0, cols, col_ok,
              GROUP: tl.constexpr, SCALE_BITS: tl.constexpr, MIN_BITS: tl.constexpr, SB: tl.constexpr,
              BK: tl.constexpr):
    """The K tile's scale bytes as loaded, nothing computed from them yet (`tile_scales` does), so a K
    loop can load the next tile's while it works on this one: these loads are under 4 bytes a thread,
    too small for Triton's cp.async pipelining, and each waits out a whole memory latency where it is
    used. Returns (scale codes [GT, BN], min bytes [GT, BN], d [BN], dmin [BN]) for super-block formats,
    (S, M fp16 [GT, BN], S, M) for fp16 groups."""
    UNIT: tl.constexpr = SB if SB > 0 else GROUP
    GPU: tl.constexpr = UNIT // GROUP                            # groups per row and unit
    GT: tl.constexpr = BK // GROUP if BK > GROUP else 1
    u = k0 // UNIT
    ru = (u * N + cols).to(tl.int64)
    g2 = (k0 - u * UNIT) // GROUP + tl.arange(0, GT)[:, None]   # [GT, 1] group in unit
    r2 = ru[None, :]
    ok2 = col_ok[None, :]
    if SCALE_BITS == 16:
        a = tl.load(scales_p + r2 * GPU + g2, mask=ok2, other=0.0)
        b = tl.load(mins_p + r2 * GPU + g2, mask=ok2, other=0.0)
        return a, b, a, b
    else:
        a = tl.load(scales_p + r2 * GPU + g2, mask=ok2, other=0)
        if MIN_BITS == 4:
            b = tl.load(mins_p + r2 * (GPU // 2) + g2 // 2, mask=ok2, other=0)
        else:
            b = tl.load(mins_p + r2 * GPU + g2, mask=ok2, other=0)
        d = tl.load(d_p + ru, mask=col_ok, other=0.0)
        dmin = tl.load(dmin_p + ru, mask=col_ok, other=0.0)
        return a, b, d, dmin


@triton.jit
def tile_scales(a, b, d, dmin, k0, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr, MIN_BITS: tl.constexpr,
                SB: tl.constexpr):
    """Each group's scale S and min M as float32 [GT, BN] from `tile_meta`'s bytes: fp16 directly, or
    d * scale and dmin * min."""
    if SCALE_BITS == 16:
        return a.to(tl.float32), b.to(tl.float32)
    else:
        sc = u2f(a.to(tl.int32))
        if MIN_BITS == 4:
            UNIT: tl.constexpr = SB if SB > 0 else GROUP
            g2 = (k0 % UNIT) // GROUP + tl.arange(0, a.shape[0])[:, None]
            mn = u2f((b.to(tl.int32) >> ((g2 & 1) * 4)) & 15)    # two 4-bit mins a byte, even group low
        else:
            mn = u2f(b.to(tl.int32))
        return d.to(tl.float32)[None, :] * sc, dmin.to(tl.float32)[None, :] * mn


@triton.jit
def dequant_tile(words, S_, M, BITS: tl.constexpr, BK: tl.constexpr):
    """W^T[k0:k0+BK, cols] = S * q - M as float32 [BK, BN] from a tile's code words [GT, GS/EPW, BN]
    (`tile_words`) and its groups' S and M [GT, BN] (`tile_scales`).

    k0 is a multiple of BK, and BK divides the scale unit (super-block, or the fp16 group). Codes are
    read once as 32-bit words and spread over their EPW codes in registers (code 4*s + j of a word in
    byte j, lane s: `quantizer.pack_bits`); scales once per group."""
    S: tl.constexpr = 8 // BITS
    BN: tl.constexpr = words.shape[2]
    sh = ((tl.arange(0, S) * BITS)[:, None] + (tl.arange(0, 4) * 8)[None, :])[None, None, :, :, None]
    q = u2f((words[:, :, None, None, :] >> sh) & ((1 << BITS) - 1))                   # [GT, GS/EPW, S, 4, BN]
    w = S_[:, None, None, None, :] * q - M[:, None, None, None, :]
    return tl.reshape(w, [BK, BN])


@triton.jit
def _bf16_pair_affine(v, s2, nm2, USE_ASM: tl.constexpr):
    """v int32 holding two bf16 bit patterns 128 + q (q < 128, so exact); s2, nm2 int32 holding the
    bf16 pairs (S, S) and (-M, -M). Returns (lo, hi) bf16: q*S - M for each half, rounded once
    (fma.rn.bf16x2 twice: v*1 - 128 is exact, then q*S - M). The interpreter computes the same in
    float32 (exact there) and rounds to bf16."""
    if USE_ASM:
        return tl.inline_asm_elementwise(
            "{\n\t.reg .b32 one, c, t;\n\tmov.b32 one, 0x3F803F80;\n\tmov.b32 c, 0xC300C300;\n\t"
            "fma.rn.bf16x2 t, $2, one, c;\n\tfma.rn.bf16x2 t, t, $3, $4;\n\tmov.b32 {$0, $1}, t;\n\t}",
            "=h,=h,r,r,r", [v, s2, nm2], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)
    else:
        lo = ((v & 0xFFFF) << 16).to(tl.float32, bitcast=True) - 128.0
        hi = (v & -65536).to(tl.float32, bitcast=True) - 128.0
        s = (s2 & -65536).to(tl.float32, bitcast=True)
        nm = (nm2 & -65536).to(tl.float32, bitcast=True)
        return (lo * s + nm).to(tl.bfloat16), (hi * s + nm).to(tl.bfloat16)


@triton.jit
def _bf16_pair_bits(x):
    """float32 x -> int32 holding round-to-bf16(x) in both halves."""
    b = x.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return b | (b << 16)


@triton.jit
def dequant_tile_bf16(words, S_, M, BITS: tl.constexpr, BK: tl.constexpr, USE_ASM: tl.constexpr):
    """`dequant_tile` as bf16 [BK, BN], two codes at a time: (word >> BITS*s + 8h) & (mask at bits 0
    and 16) | 0x43004300 puts codes 4s+h and 4s+h+2 of a word into one register as the bf16 values
    128 + q, and two bf16x2 FMAs (`_bf16_pair_affine`) give S*q - M for both: about 2 instructions a
    weight where the float32 path spends 8-9. S and M are rounded to bf16 first (the weights are bf16
    for the MMA anyway; this adds up to one more bf16 rounding of S*q and of M)."""
    S: tl.constexpr = 8 // BITS
    PAIR: tl.constexpr = ((1 << BITS) - 1) * 0x00010001
    BN: tl.constexpr = words.shape[2]
    sh = ((tl.arange(0, S) * BITS)[:, None] + (tl.arange(0, 2) * 8)[None, :])[None, None, :, :, None]
    v = ((words[:, :, None, None, :] >> sh) & PAIR) | 0x43004300                     # [GT, GS/EPW, S, 2, BN]
    s2 = _bf16_pair_bits(S_)[:, None, None, None, :]
    nm2 = _bf16_pair_bits(-M)[:, None, None, None, :]
    lo, hi = _bf16_pair_affine(v, s2, nm2, USE_ASM)                                   # j = h, j = h + 2
    w = tl.permute(tl.join(lo, hi), (0, 1, 2, 5, 3, 4))                               # [GT, GS/EPW, S, 2, 2, BN]
    return tl.reshape(w, [BK, BN])
