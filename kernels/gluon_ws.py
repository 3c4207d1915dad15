"""Prefill on Hopper, warp-specialized (a candidate beside `gluon_gemm`; not on the library's path).

    gemm_ws_kernel   grid (tiles,)   out^T [BNW, BT] = W [BNW, K] @ x [BT, K]^T, one tile a program

Why: in `gemm_gluon_kernel` the same warps expand a K step's weights and issue its wgmma, so the MMA
waits whenever the expansion runs late (in short bursts the whole takes ~1.36x the longer of the two
alone: KERNELS.md). Here the work is split by warps, Machete's / CUTLASS's producer-consumer shape:

  expand partition (XW warps)  loads each K step's code words and scales (the next step's while it
        expands this one), expands them to bf16 (`gluon_gemm.expand`, the same arithmetic) into one of NA
        shared-memory A tiles [BNW, BK]
  MMA partition (BNW / 16 warps, the default)   waits for step i's A tile and x stage, issues its wgmma
        (A and B both from shared memory), retires step i - 1's, hands its A tile back and refills its x
        stage by TMA with step i - 1 + NS (so x needs no empty barrier: the stage's reader refills it)

Barriers, one per stage, each completed once a use: a_ready (the expand partition's arrival after its
stores and an async-proxy fence), x_ready (TMA's byte count), a_empty (the MMA partition's arrival once
the wgmma that read the tile has retired). A tile's n-th fill waits for a_empty's phase n - 1 (the first
fill passes at once). (A separate x-loading warp would make 13 warps: setmaxnreg works by warpgroups.)
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .gluon_gemm import _cta_barrier, _load_step, _load_x, expand, pair_constants, pair_layout, x_descriptor


@gluon.jit
def _mma_partition(x_desc, a_s, xs, a_ready, a_empty, x_ready, m0, nk, BNW: gl.constexpr, BT: gl.constexpr,
                   NA: gl.constexpr, NS: gl.constexpr):
    NW: gl.constexpr = gl.num_warps()
    BKC: gl.constexpr = x_desc.block_type.shape[1]
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BT, 16])
    acc = gl.zeros([BNW, BT], gl.float32, layout=ACC)
    for p in gl.static_range(NS):
        if p < nk:
            _load_x(x_desc, x_ready.index(p), xs.index(p), m0, p * BKC)
    for i in range(nk):
        mbarrier.wait(a_ready.index(i % NA), (i // NA) & 1)
        mbarrier.wait(x_ready.index(i % NS), (i // NS) & 1)
        acc = warpgroup_mma(a_s.index(i % NA), xs.index(i % NS).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        _cta_barrier()                                 # every warpgroup has retired step i - 1
        if i > 0:
            mbarrier.arrive(a_empty.index((i - 1) % NA))          # its A tile back to the expand warps
            j = i - 1 + NS                                        # and its x stage refilled, NS steps on
            if j < nk:
                _load_x(x_desc, x_ready.index(j % NS), xs.index(j % NS), m0, j * BKC)
    return (warpgroup_mma_wait(num_outstanding=0, deps=(acc,)),)     # a tuple: the region's results


@gluon.jit
def _expand_partition(codes_p, scales_p, mins_p, d_p, dmin_p, a_s, a_ready, a_empty, N, n0, nk, kend,
                      BITS: gl.constexpr, GROUP: gl.constexpr, SCALE_BITS: gl.constexpr, MIN_BITS: gl.constexpr,
                      UNIT: gl.constexpr, BNW: gl.constexpr, BKC: gl.constexpr, NA: gl.constexpr):
    NWP: gl.constexpr = gl.num_warps()
    T: gl.constexpr = BKC // 16
    L4: gl.constexpr = pair_layout(BNW, T, BITS, NWP)
    L3: gl.constexpr = gl.SliceLayout(3, L4)
    two, t3, j3, sel, sh = pair_constants(L4, T, BITS)
    rows = n0 + gl.arange(0, BNW, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    rows = gl.minimum(rows, N - 1)                     # rows past N read row N - 1 and are not stored
    wn, sn, nn = _load_step(codes_p, scales_p, mins_p, d_p, dmin_p, N, 0, rows, t3, j3, BITS, GROUP, SCALE_BITS,
                            MIN_BITS, UNIT, L3, NWP)
    for i in range(nk):
        wd = wn
        s2 = sn
        nm2 = nn
        k2 = gl.minimum((i + 1) * BKC, kend - BKC)     # the next step's bytes in flight during this one
        wn, sn, nn = _load_step(codes_p, scales_p, mins_p, d_p, dmin_p, N, k2, rows, t3, j3, BITS, GROUP,
                                SCALE_BITS, MIN_BITS, UNIT, L3, NWP)
        a = expand(wd, s2, nm2, sel, sh, two, BITS)
        mbarrier.wait(a_empty.index(i % NA), ((i // NA) & 1) ^ 1)
        a_s.index(i % NA).store(a)
        fence_async_shared()
        _cta_barrier()                                 # every expand warp's stores are in
        mbarrier.arrive(a_ready.index(i % NA))


@gluon.jit(do_not_specialize=["M", "K"])
def gemm_ws_kernel(x_desc, codes_p, scales_p, mins_p, d_p, dmin_p, out_p, stride_om, M, N, K,
                   BITS: gl.constexpr, GROUP: gl.constexpr, SCALE_BITS: gl.constexpr, MIN_BITS: gl.constexpr,
                   SB: gl.constexpr, BT: gl.constexpr, NS: gl.constexpr, NA: gl.constexpr, REGS: gl.constexpr,
                   XW: gl.constexpr = 4):
    # out [M, N] = x [M, K] @ W [N, K]^T; tile t: rows n0 .. n0 + BNW of W (16 an MMA warp), tokens
    # m0 .. m0 + BT; t = tm * tiles_n + tn. XW warps expand (more warps than 16-row slices share a K step:
    # `gluon_gemm.row_bases`), REGS: their registers a thread.
    NW: gl.constexpr = gl.num_warps()
    BNW: gl.constexpr = 16 * NW
    BKC: gl.constexpr = x_desc.block_type.shape[1]
    UNIT: gl.constexpr = SB if SB > 0 else GROUP
    A_S: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    OUT_L: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, NW], [0, 1])
    tiles_n = gl.cdiv(N, BNW)
    t = gl.program_id(0)
    n0 = (t % tiles_n) * BNW
    m0 = (t // tiles_n) * BT
    kend = gl.cdiv(K, UNIT) * UNIT                     # packed K: padding weights meet TMA's zero x
    nk = kend // BKC

    xs = gl.allocate_shared_memory(x_desc.dtype, [NS, BT, BKC], x_desc.layout)
    a_s = gl.allocate_shared_memory(gl.bfloat16, [NA, BNW, BKC], A_S)
    x_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    a_ready = gl.allocate_shared_memory(gl.int64, [NA, 1], mbarrier.MBarrierLayout())
    a_empty = gl.allocate_shared_memory(gl.int64, [NA, 1], mbarrier.MBarrierLayout())
    for p in gl.static_range(NS):
        mbarrier.init(x_ready.index(p), count=1)
    for p in gl.static_range(NA):
        mbarrier.init(a_ready.index(p), count=1)
        mbarrier.init(a_empty.index(p), count=1)

    res = gl.warp_specialize([
        (_mma_partition, (x_desc, a_s, xs, a_ready, a_empty, x_ready, m0, nk, BNW, BT, NA, NS)),
        (_expand_partition, (codes_p, scales_p, mins_p, d_p, dmin_p, a_s, a_ready, a_empty, N, n0, nk, kend,
                             BITS, GROUP, SCALE_BITS, MIN_BITS, UNIT, BNW, BKC, NA)),
    ], [XW], [REGS])
    acc = res[0]

    pn = gl.arange(0, BNW, layout=gl.SliceLayout(1, OUT_L))
    pm = gl.arange(0, BT, layout=gl.SliceLayout(0, OUT_L))
    on = n0 + pn
    om = m0 + pm
    ok = (on < N)[:, None] & (om < M)[None, :]
    optr = out_p + om[None, :].to(gl.int64) * stride_om + on[:, None]
    gl.store(optr, gl.convert_layout(acc.to(out_p.dtype.element_ty), OUT_L), mask=ok)


def gemm_ws(x: torch.Tensor, mats: list[torch.Tensor], consts: dict, n: int, out: torch.Tensor,
            bt: int = 256, ns: int = 3, na: int = 2, num_warps: int = 8, regs: int = 152, xw: int = 4) -> None:
    """out [M, n] = x @ W^T with `gemm_ws_kernel`; W as `ops._matrix_args`, consts its format's."""
    m, k = x.shape
    tiles = triton.cdiv(n, 16 * num_warps) * triton.cdiv(m, bt)
    gemm_ws_kernel[(tiles,)](x_descriptor(x, bt), *mats, out, out.stride(0), m, n, k,
                             BITS=consts["BITS"], GROUP=consts["GROUP"], SCALE_BITS=consts["SCALE_BITS"],
                             MIN_BITS=consts["MIN_BITS"], SB=consts["SB"], BT=bt, NS=ns, NA=na, REGS=regs, XW=xw,
                             num_warps=num_warps)
