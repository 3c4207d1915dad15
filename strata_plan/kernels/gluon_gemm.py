"""Prefill on Hopper, in Gluon: the packed weights dequantized straight into wgmma's register operand.

    gemm_gluon_kernel   grid (P,)   out^T [BNW, BT] = W [BNW, K] @ x [BT, K]^T, tile by tile
                        BNW = 16 rows a warp (64 a warpgroup), BT tokens (256 on the H200), sm_90 only;
                        P = one program a tile, or fewer that share the tiles' K steps (stream-K)

Why a second GEMM beside `triton_gemm.gemm_kernel`: there the dequantized tile is wgmma's B operand, which
must sit in shared memory, so every K step stores it there and Triton waits for the MMA before the next
store (`warp_group_dot_wait pendings=0`): dequantization and MMA never overlap inside a program. Here the
product is transposed (out^T = W x^T, Machete's choice), so W is the A operand, which wgmma reads from
registers: a thread expands exactly the weights of its own A fragment, with no shared-memory round trip,
while the previous step's wgmma runs (issued async, waited for after the next tile is ready). x^T is the
B operand: TMA copies [BT, BK] tiles of x into NS shared-memory stages (zeros past M and K).

The A fragment of wgmma m64nNk16 (bf16): warp w owns rows 16w .. 16w+15; lane l holds rows l/4 and
l/4 + 8, at K positions 2c, 2c+1, 2c+8, 2c+9 of each 16 (c = l % 4), as bf16 pairs. So pair j = 4e + c
of k16 step t covers the two consecutive weights k = 16t + 2j, 16t + 2j + 1. Codes are stored code
4s + b of a word in byte b, bits BITS*s (formats.py), so a pair (bytes b, b + 1 of lane s) is one byte
permute (PRMT puts them at bits 0 and 16), one shift and one mask away from two bf16 values 128 + q, and
two bf16x2 FMAs give q*S - M for both (`triton_common._bf16_pair_affine`'s arithmetic). The four lanes of
a quad read the same code word (one transaction) and each keeps its own four codes. At 2 and 1 bits a
thread's pairs that take the same bytes share the permute and one shift (`pairs_asm`).

Gluon cannot run in the interpreter, so this path is tested on the GPU only (`tests/test_kernels_gluon.py`,
marker gpu), against the same torch reference as the Triton GEMM, which stays the path on every other
GPU and for shapes TMA cannot take (K not a multiple of 8).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# Names that differ between Triton 3.6 (the GPU machine's) and 3.9 (CI's compile check): the TMA copy to
# shared memory (`async_load` in 3.9), the CTA-wide barrier (`barrier` in 3.9)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

BK = 64     # K per step: four k16 MMA steps; divides every format's scale unit (128 or 512)


@triton.constexpr_function
def shared_pairs(BITS):
    """Pairs a thread expands from one byte permute: its two pairs of a k16 step (j = c and c + 4) take
    the same bytes of the same word at 2-bit (lanes s and s + 2), and at 1-bit so do its pairs of steps
    t and t + 1 (lanes + 4); 4-bit pairs each have their own word."""
    return 2 if BITS == 2 else 4 if BITS == 1 else 1


@triton.constexpr_function
def pair_layout(BNW, T, BITS):
    """[BNW, T, 8, 2] (weight row, k16 step, pair j = 4e + c, weight of the pair) as wgmma's A fragment:
    registers the pair's two weights, then e (and at 1-bit t's low bit: the pairs that share a byte
    permute, `shared_pairs`; at 4-bit e then t make a row's words consecutive, `_load_words`), t, row +
    8; lanes 0-1 c, lanes 2-4 rows 0-7; warps rows 16 and up (64 a warpgroup). Reshaped to [BNW, 16 T]
    it is the A operand's layout itself (up to the order of a thread's registers), which the kernel
    asserts at compile time."""
    tb = [[0, 1 << i, 0, 0] for i in range(T.bit_length() - 1)]
    shared = [[0, 0, 4, 0]] + tb[:1] if BITS == 1 else [[0, 0, 4, 0]]
    rest = [b for b in tb + [[0, 0, 4, 0]] if b not in shared]
    reg = [[0, 0, 0, 1]] + shared + rest + [[8, 0, 0, 0]]
    lane = [[0, 0, 1, 0], [0, 0, 2, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]]
    warp = [[16 << i, 0, 0, 0] for i in range((BNW // 16).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [BNW, T, 8, 2])


@triton.constexpr_function
def row_step_layout(BNW, T):
    """[BNW, T] (weight row, k16 step): `pair_layout` without its pair dimensions, each value held by the
    four lanes of a quad, the k16 steps in consecutive registers (so a row's words load as one vector)."""
    reg = [[0, 1 << i] for i in range(T.bit_length() - 1)] + [[8, 0]]
    lane = [[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]]
    warp = [[16 << i, 0] for i in range((BNW // 16).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [BNW, T])


@triton.constexpr_function
def pair_asm(BITS):
    """PTX for one pair (pack=2: each input comes twice, once per weight of the pair; the first is used):
    $1 the code word, $3 the PRMT selector (its bytes b, b + 1 to bits 0 and 16), $5 the shift to the
    pair's lane, $7 / $9 the bf16 pairs (S, S) and (-M, -M). Masked to the two codes with the bf16 bits
    of 128 above them (LOP3 truth table 0xea: (t & mask) | magic), v * 1 - 128 is exact, then q * S - M
    rounds once: $0 holds both bf16 weights. The 4-bit formats' expansion (`shared_pairs` 1)."""
    mask = ((1 << BITS) - 1) * 0x00010001
    return ("{\n\t.reg .b32 t, one, c;\n\tprmt.b32 t, $1, 0, $3;\n\tshr.u32 t, t, $5;\n\t"
            f"lop3.b32 t, t, {mask:#x}, 0x43004300, 0xea;\n\t"
            "mov.b32 one, 0x3F803F80;\n\tmov.b32 c, 0xC300C300;\n\t"
            "fma.rn.bf16x2 t, t, one, c;\n\tfma.rn.bf16x2 $0, t, $7, $9;\n\t}")


@triton.constexpr_function
def pairs_asm(NP):
    """PTX for NP pairs that share a byte permute (`shared_pairs`; pack = 2 NP, each input comes once per
    weight, pair i reads copy 2i). Inputs: the word, the PRMT selector, then per pair the mask of its
    codes at their place p in the permuted word (p < 4), the bf16 pairs (2^-p, 2^-p) and (-128 2^-p,
    -128 2^-p), (S, S), (-M, -M). Pairs NP/2 and up sit 4 bits higher: one shift serves them all. The
    masked codes with 128's bf16 bits above are 128 + q 2^p exactly, the first FMA gives q exactly, the
    second q * S - M rounded once: $i holds pair i's two bf16 weights."""
    E = 2 * NP
    op = lambda k, i: f"${NP + k * E + 2 * i}"                     # input k's copy for pair i
    body = [f"prmt.b32 t, {op(0, 0)}, 0, {op(1, 0)};", "shr.u32 h, t, 4;"]
    for i in range(NP):
        body += [f"lop3.b32 v, {'h' if i >= NP // 2 else 't'}, {op(2, i)}, 0x43004300, 0xea;",
                 f"fma.rn.bf16x2 v, v, {op(3, i)}, {op(4, i)};", f"fma.rn.bf16x2 ${i}, v, {op(5, i)}, {op(6, i)};"]
    return "{\n\t.reg .b32 t, h, v;\n\t" + "\n\t".join(body) + "\n\t}"


@triton.constexpr_function
def pairs_constraints(NP):
    # NP outputs (two bf16 each), then 2 NP copies of each of `pairs_asm`'s 7 inputs
    return ",".join(["=r"] * NP + ["r"] * (2 * NP * 7))


@triton.constexpr_function
def word_quad_layout(BNW, T):
    """[BNW, 2T, 4] (weight row, word of the step, lane c of the quad) for 4-bit codes: a row's 2T words
    of a K step in consecutive registers (one vector load), the quad's four lanes on the same words.
    Reshaped to [BNW, T, 8] (word 2t + e, c -> t, j = 4e + c) it is `pair_layout` without the weight
    dimension."""
    reg = [[0, 1 << i, 0] for i in range((2 * T).bit_length() - 1)] + [[8, 0, 0]]
    lane = [[0, 0, 1], [0, 0, 2], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warp = [[16 << i, 0, 0] for i in range((BNW // 16).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [BNW, 2 * T, 4])


@gluon.jit
def _pair_bits(x):
    # float32 -> int32 holding round-to-bf16(x) in both halves (one F2FP)
    return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $1, $1;", "=r,f", [x], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _scaled(d, v):
    # d * v for a small non-negative int v, exactly, in one FFMA: d * (2^23 + v) - d * 2^23
    return gl.fma(d[:, None], (v | 0x4B000000).to(gl.float32, bitcast=True), -8388608.0 * d[:, None])


@gluon.jit
def _load_words(codes_p, N, k0, rows, t3, j3, BITS: gl.constexpr, UNIT: gl.constexpr,
                L3: gl.constexpr):
    # the code word of every pair of the K step at k0, int32 [BNW, T, 8] (or [BNW, T, 1] when a word
    # holds a whole k16 step or more: its pairs broadcast it)
    EPW: gl.constexpr = 32 // BITS
    WPU: gl.constexpr = UNIT // EPW
    u = k0 // UNIT
    ru = (u * N + rows).to(gl.int64)                                  # [BNW] (unit, row) record
    w0 = (k0 - u * UNIT) // EPW
    if EPW >= 16:
        LR: gl.constexpr = row_step_layout(ru.shape[0], t3.shape[1])
        t2 = gl.arange(0, t3.shape[1], layout=gl.SliceLayout(0, LR))
        r2 = gl.convert_layout(ru, gl.SliceLayout(1, LR), assert_trivial=True)
        if EPW == 16:       # word t of the step: the 4 words as one 16-byte load
            wi = gl.multiple_of(w0, 4) + t2
        else:
            wi = w0 + t2 // 2
        w = gl.load(codes_p + r2[:, None] * WPU + wi[None, :])                                # [BNW, T]
        return gl.expand_dims(gl.convert_layout(w, gl.SliceLayout(2, L3), assert_trivial=True), 2)
    else:
        # 4-bit: pair j = 4e + c of step t reads word 2t + e, so a row's 2T words of the step are one
        # 32-byte run: loaded as [BNW, 2T, 4] (two 16-byte loads a row), then reshaped to the pairs
        T: gl.constexpr = t3.shape[1]
        LW: gl.constexpr = word_quad_layout(ru.shape[0], T)
        wv = gl.arange(0, 2 * T, layout=gl.SliceLayout(0, gl.SliceLayout(2, LW)))
        cv = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LW)))
        r3 = gl.convert_layout(ru, gl.SliceLayout(1, gl.SliceLayout(2, LW)), assert_trivial=True)
        wi = gl.multiple_of(w0, 2 * T) + wv
        w = gl.load(codes_p + r3[:, None, None] * WPU + wi[None, :, None] + 0 * cv[None, None, :])
        return gl.convert_layout(gl.reshape(w, [ru.shape[0], T, 8]), L3, assert_trivial=True)


@gluon.jit
def _load_scales(scales_p, mins_p, d_p, dmin_p, N, k0, rows, T: gl.constexpr, GROUP: gl.constexpr,
                 SCALE_BITS: gl.constexpr, MIN_BITS: gl.constexpr, UNIT: gl.constexpr, L3: gl.constexpr):
    # (S, S) and (-M, -M) as bf16 pairs of every (row, k16 step) of the step at k0: int32 [BNW, T, 1]
    L2: gl.constexpr = row_step_layout(rows.shape[0], T)
    GPU: gl.constexpr = UNIT // GROUP
    u = k0 // UNIT
    ru = gl.convert_layout((u * N + rows).to(gl.int64), gl.SliceLayout(1, L2), assert_trivial=True)
    t2 = gl.arange(0, T, layout=gl.SliceLayout(0, L2))
    g0 = (k0 - u * UNIT) // GROUP
    if GROUP == 16:     # group t of the step: its 4 scale bytes as one load
        g = (gl.multiple_of(g0, 4) + t2)[None, :]                       # [1, T] group in unit
    else:
        g = (g0 + (16 * t2) // GROUP)[None, :]
    if SCALE_BITS == 16:
        s = gl.load(scales_p + ru[:, None] * GPU + g).to(gl.float32)
        m = -gl.load(mins_p + ru[:, None] * GPU + g).to(gl.float32)
    else:
        sc = gl.load(scales_p + ru[:, None] * GPU + g).to(gl.int32)
        if MIN_BITS == 4:
            mb = gl.load(mins_p + ru[:, None] * (GPU // 2) + g // 2).to(gl.int32)
            mn = (mb >> ((g & 1) * 4)) & 15
        else:
            mn = gl.load(mins_p + ru[:, None] * GPU + g).to(gl.int32)
        d = gl.load(d_p + ru).to(gl.float32)
        dm = gl.load(dmin_p + ru).to(gl.float32)
        s = _scaled(d, sc)
        m = _scaled(-dm, mn)
    s = gl.convert_layout(_pair_bits(s), gl.SliceLayout(2, L3), assert_trivial=True)
    m = gl.convert_layout(_pair_bits(m), gl.SliceLayout(2, L3), assert_trivial=True)
    return gl.expand_dims(s, 2), gl.expand_dims(m, 2)


@gluon.jit
def _load_step(codes_p, scales_p, mins_p, d_p, dmin_p, N, k0, rows, t3, j3, BITS: gl.constexpr, GROUP: gl.constexpr,
               SCALE_BITS: gl.constexpr, MIN_BITS: gl.constexpr, UNIT: gl.constexpr, L3: gl.constexpr):
    # the K step at k0: its code words and its (S, S), (-M, -M) pairs
    w = _load_words(codes_p, N, k0, rows, t3, j3, BITS, UNIT, L3)
    s, m = _load_scales(scales_p, mins_p, d_p, dmin_p, N, k0, rows, t3.shape[1], GROUP, SCALE_BITS, MIN_BITS, UNIT,
                        L3)
    return w, s, m


@gluon.jit
def _load_x(x_desc, bar, dst, m0, k):
    # the x tile [BT, BK] at (m0, k) into one stage, counted on its barrier
    mbarrier.expect(bar, x_desc.block_type.nbytes)
    _tma_load(x_desc, [m0, k], bar, dst)


@gluon.jit
def _dequant(words, s2, nm2, sel, sh, two, BITS: gl.constexpr, A_LAYOUT: gl.constexpr):
    # pairs [BNW, T, 8] (words, scales broadcast) -> bf16 [BNW, 16 T] in wgmma's A layout; `two` is a
    # [1, 1, 1, 2] zero that spreads every input over the pair's two weights (moves no data)
    NP: gl.constexpr = shared_pairs(BITS)
    if NP == 1:
        w = gl.inline_asm_elementwise(pair_asm(BITS), "=r,r,r,r,r,r,r,r,r,r,r",
                                      [gl.expand_dims(words, 3) + two, gl.expand_dims(sel, 3) + two,
                                       gl.expand_dims(sh, 3) + two, gl.expand_dims(s2, 3) + two,
                                       gl.expand_dims(nm2, 3) + two], dtype=gl.bfloat16, is_pure=True, pack=2)
    else:
        # the pair's codes at p = sh mod 4 of the permuted word (the shift by 4 is shared), as masks and
        # the bf16 pairs of 2^-p and -128 2^-p
        hi = (sh >= 4).to(gl.int32)
        p = sh - 4 * hi
        mask = (((1 << BITS) - 1) << p) * 0x00010001
        e = 127 - p                                            # bf16 2^-p: exponent 127 - p, mantissa 0
        scl = (e << 7) * 0x00010001
        off = ((0x100 | (e + 7)) << 7) * 0x00010001           # -128 2^-p: sign, exponent 134 - p
        w = gl.inline_asm_elementwise(pairs_asm(NP), pairs_constraints(NP),
                                      [gl.expand_dims(words, 3) + two, gl.expand_dims(sel, 3) + two,
                                       gl.expand_dims(mask, 3) + two, gl.expand_dims(scl, 3) + two,
                                       gl.expand_dims(off, 3) + two, gl.expand_dims(s2, 3) + two,
                                       gl.expand_dims(nm2, 3) + two], dtype=gl.bfloat16, is_pure=True, pack=2 * NP)
    w = gl.reshape(w, [w.shape[0], w.shape[1] * 16])
    return gl.convert_layout(w, A_LAYOUT, assert_trivial=True)


@gluon.jit
def _gpu_fence(v):
    # fence.acq_rel.gpu in every thread; v: any int32 scalar, returned (orders the fence by data)
    return gl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.b32 $0, $1;", "=r,r", [v], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _owner(u, P, U):
    # the program whose units [q U / P, (q + 1) U / P) hold unit u: the largest q with q U / P <= u
    return ((u + 1) * P - 1) // U


@gluon.jit(do_not_specialize=["M", "K", "P"])      # N specialized: its divisibility by 16 vectorizes the stores
def gemm_gluon_kernel(x_desc, codes_p, scales_p, mins_p, d_p, dmin_p, out_p, stride_om, part_p, cnt_p, M, N, K, P,
                      BITS: gl.constexpr, GROUP: gl.constexpr, SCALE_BITS: gl.constexpr, MIN_BITS: gl.constexpr,
                      SB: gl.constexpr, BT: gl.constexpr, NS: gl.constexpr):
    # out [M, N] = x [M, K] @ W [N, K]^T. Tile t: rows n0 .. n0+BNW of W (16 a warp, 64 a warpgroup; the
    # warpgroups share each x tile), tokens m0 .. m0+BT; t = tm * tiles_n + tn. Work unit: two K steps of a
    # tile (K units are 128 or 512 weights: whole pairs). Program q of P runs units [q U / P, (q+1) U / P)
    # of the U in all, tile by tile (stream-K): with P = tiles that is one whole tile each. A tile whose
    # units span programs q_a .. q_b: q_a runs its head last (the end of its range) and owns it; q_a + 1 ..
    # q_b run their parts first (the start of theirs), store them in part_p [P, BNW, BT] fp32 and count
    # them in cnt_p[t]; the owner waits for the count, adds the parts in program order (equal bits every
    # call), stores the tile and resets the count to 0. All P programs must be resident at once (P at
    # most the SMs' slots), since an owner waits for programs after it.
    NW: gl.constexpr = gl.num_warps()
    BNW: gl.constexpr = 16 * NW
    BKC: gl.constexpr = x_desc.block_type.shape[1]
    T: gl.constexpr = BKC // 16
    UNIT: gl.constexpr = SB if SB > 0 else GROUP
    L4: gl.constexpr = pair_layout(BNW, T, BITS)
    L3: gl.constexpr = gl.SliceLayout(3, L4)
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BT, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    # out^T tiles are stored through a layout with n along lanes, so each store is contiguous
    OUT_L: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, NW], [0, 1])

    two = gl.zeros([1, 1, 1, 2], gl.int32, layout=L4)
    t3 = gl.arange(0, T, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))[None, :, None]    # [1, T, 1]
    j3 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]    # [1, 1, 8]
    kin = (16 * t3 + 2 * j3) % (32 // BITS)            # [1, T, 8]: a pair's first code inside its word
    sh = BITS * (kin // 4)
    sel = 0x4140 + 0x101 * (kin % 4)                   # bytes kin % 4 and kin % 4 + 1 to bits 0 and 16
    pn = gl.arange(0, BNW, layout=gl.SliceLayout(1, OUT_L))
    pm = gl.arange(0, BT, layout=gl.SliceLayout(0, OUT_L))
    # a part [BNW, BT] in the accumulator's own layout: stored and added without a layout conversion
    aoff = (gl.arange(0, BNW, layout=gl.SliceLayout(1, ACC))[:, None] * BT
            + gl.arange(0, BT, layout=gl.SliceLayout(0, ACC))[None, :])

    bars = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for p in gl.static_range(NS):
        mbarrier.init(bars.index(p), count=1)
    kend = gl.cdiv(K, UNIT) * UNIT                     # packed K: padding weights meet TMA's zero x
    nk2 = kend // (2 * BKC)                            # units a tile
    tiles_n = gl.cdiv(N, BNW)
    U = (tiles_n * gl.cdiv(M, BT)).to(gl.int64) * nk2
    q = gl.program_id(0)
    u = q * U // P
    u_hi = (q + 1) * U // P
    g = 0                                              # K steps run so far: the stages' phases go on
    while u < u_hi:
        t = u // nk2
        s_lo = ((u - t * nk2) * 2).to(gl.int32)        # this segment: K steps s_lo .. s_hi of tile t
        s_hi = ((gl.minimum(u_hi, (t + 1) * nk2) - t * nk2) * 2).to(gl.int32)
        nk = s_hi - s_lo
        n0 = (t % tiles_n).to(gl.int32) * BNW
        m0 = (t // tiles_n).to(gl.int32) * BT
        rows = n0 + gl.arange(0, BNW, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
        rows = gl.minimum(rows, N - 1)                 # rows past N read row N - 1 and are not stored
        # x stages allocated for the K loop only, so the epilogue's layout conversion can reuse them
        xs = gl.allocate_shared_memory(x_desc.dtype, [NS] + x_desc.block_type.shape, x_desc.layout)
        for p in gl.static_range(NS - 1):
            if p < nk:
                _load_x(x_desc, bars.index((g + p) % NS), xs.index((g + p) % NS), m0, (s_lo + p) * BKC)

        k0 = s_lo * BKC
        wd, s2, nm2 = _load_step(codes_p, scales_p, mins_p, d_p, dmin_p, N, k0, rows, t3, j3, BITS, GROUP,
                                 SCALE_BITS, MIN_BITS, UNIT, L3)
        wn, sn, nn = _load_step(codes_p, scales_p, mins_p, d_p, dmin_p, N, k0 + BKC, rows, t3, j3, BITS, GROUP,
                                SCALE_BITS, MIN_BITS, UNIT, L3)
        acc = gl.zeros([BNW, BT], gl.float32, layout=ACC)
        # step i is dequantized while step i - 1's wgmma runs, then issued, then step i - 1's is retired
        # (one wgmma in flight); each A tile lives within its own step
        for i0 in range(0, nk, 2):
            for h in gl.static_range(2):
                i = i0 + h
                a = _dequant(wd, s2, nm2, sel, sh, two, BITS, A_L)
                wd = wn
                s2 = sn
                nm2 = nn
                k2 = gl.minimum((s_lo + i + 2) * BKC, kend - BKC)
                wn, sn, nn = _load_step(codes_p, scales_p, mins_p, d_p, dmin_p, N, k2, rows, t3, j3, BITS, GROUP,
                                        SCALE_BITS, MIN_BITS, UNIT, L3)
                st = (g + i) % NS
                mbarrier.wait(bars.index(st), ((g + i) // NS) & 1)
                acc = warpgroup_mma(a, xs.index(st).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                j = i + NS - 1                     # refill the stage step i - 1 used: retired now in
                _cta_barrier()                     # every warpgroup
                if j < nk:
                    _load_x(x_desc, bars.index((g + j) % NS), xs.index((g + j) % NS), m0, (s_lo + j) * BKC)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _cta_barrier()                                 # every warpgroup is done with the stages
        g += nk

        on = n0 + pn
        om = m0 + pm
        ok = (on < N)[:, None] & (om < M)[None, :]
        optr = out_p + om[None, :].to(gl.int64) * stride_om + on[:, None]
        if nk == 2 * nk2:                              # the whole tile: stored as it is
            gl.store(optr, gl.convert_layout(acc.to(out_p.dtype.element_ty), OUT_L), mask=ok)
        elif s_lo == 0:
            # the tile's head, the last segment of this program: it owns the tile, and adds the parts of
            # programs q + 1 .. q_b (their first segments, run first: done by now, or soon) in that order
            need = _owner(t * nk2 + nk2 - 1, P, U) - q
            got = gl.atomic_add(cnt_p + t, 0, sem="acquire", scope="gpu")
            while got < need:
                got = gl.atomic_add(cnt_p + t, 0, sem="acquire", scope="gpu")
            _gpu_fence(nk)
            for qq in range(q + 1, q + 1 + need):
                acc += gl.load(part_p + qq.to(gl.int64) * (BT * BNW) + aoff, cache_modifier=".cg")
            gl.store(optr, gl.convert_layout(acc.to(out_p.dtype.element_ty), OUT_L), mask=ok)
            gl.atomic_xchg(cnt_p + t, 0, sem="relaxed", scope="gpu")
        else:
            # the first segment of this program, not the tile's head: its part, for the tile's owner.
            # Every thread's part is stored and fenced before one thread counts it (release)
            gl.store(part_p + q.to(gl.int64) * (BT * BNW) + aoff, acc)
            _gpu_fence(nk)
            _cta_barrier()
            gl.atomic_add(cnt_p + t, 1, sem="release", scope="gpu")
        u = (t + 1) * nk2
    for p in gl.static_range(NS):
        mbarrier.invalidate(bars.index(p))


def x_descriptor(x: torch.Tensor, bt: int) -> TensorDescriptor:
    """TMA descriptor of x [M, K] bf16 (K a multiple of 8, rows 16-byte aligned) in [bt, BK] tiles."""
    layout = gl.NVMMASharedLayout.get_default_for([bt, BK], gl.bfloat16)
    return TensorDescriptor.from_tensor(x, [bt, BK], layout)


def tiles(m: int, n: int, bt: int = 256, num_warps: int = 4) -> int:
    """Output tiles of `gemm_gluon_kernel`: [16 num_warps rows of W, bt tokens]."""
    return triton.cdiv(n, 16 * num_warps) * triton.cdiv(m, bt)


def gemm_gluon(x: torch.Tensor, mats: list[torch.Tensor], consts: dict, n: int, out: torch.Tensor,
               bt: int = 256, ns: int = 3, num_warps: int = 4, programs: int | None = None,
               part: torch.Tensor | None = None, cnt: torch.Tensor | None = None) -> None:
    """out [M, n] = x @ W^T, W given as `ops._matrix_args` (codes as int32 words, scales, mins, d, dmin).
    programs: None, one a tile; else that many, each taking an equal share of all the tiles' K steps
    (stream-K; s x tiles: a K split s ways), which needs `part` (float32, `part_numel`) and `cnt` (int32
    zeros, one a tile; left at zero)."""
    m, k = x.shape
    nt = tiles(m, n, bt, num_warps)
    if programs is None or programs == nt:
        programs = nt
        # not read (whole tiles only), but typed as the K split's, so both share one build
        part = torch.empty(1, dtype=torch.float32, device=x.device)
        cnt = torch.empty(1, dtype=torch.int32, device=x.device)
    elif (part is None or cnt is None or part.numel() < part_numel(programs, bt, num_warps)
          or cnt.numel() < nt):
        raise ValueError("gemm_gluon: stream-K needs part (part_numel float32) and cnt (a zero a tile)")
    gemm_gluon_kernel[(programs,)](x_descriptor(x, bt), *mats, out, out.stride(0), part, cnt, m, n, k, programs,
                                   BITS=consts["BITS"], GROUP=consts["GROUP"], SCALE_BITS=consts["SCALE_BITS"],
                                   MIN_BITS=consts["MIN_BITS"], SB=consts["SB"], BT=bt, NS=ns,
                                   num_warps=num_warps)


def part_numel(programs: int, bt: int, num_warps: int) -> int:
    """float32 elements of stream-K's parts: one [16 num_warps, bt] tile a program."""
    return programs * bt * 16 * num_warps
