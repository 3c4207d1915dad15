"""Prefill: dequantize-in-registers + tensor-core GEMM, for one matrix and for the MoE's experts.

    gemm_kernel          grid (cdiv(M, BM) * cdiv(N, BN),)   out = x @ W^T, W packed (or bf16)
    grouped_gate_up      grid (blocks, cdiv(I, BN))           h[pair] = silu(x W_gate^T) * (x W_up^T)
    grouped_down         grid (blocks, cdiv(H, BN))           y[pair] = w_pair * h[pair] @ W_down^T

Each packed K tile [BK, BN] is read as bytes, expanded to bf16 in registers (`dequant_tile`) and fed to
tl.dot; only the packed bytes cross HBM. The MoE path sorts (token, expert) pairs by expert and cuts each
expert's pairs into blocks of BM rows (`moe_grouped`), so one weight tile serves up to BM tokens.
"""
from __future__ import annotations

import torch

from .triton_common import (INTERPRET, blob_segment, dequant_tile, dequant_tile_bf16, mma, tile_meta, tile_scales,
                            tile_words, tl, triton)


@triton.jit
def _b_tile(codes_p, ma, mb, md, mdm, N, K, k0, cols, col_ok,
            BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr, MIN_BITS: tl.constexpr,
            SB: tl.constexpr, BK: tl.constexpr, DQ: tl.constexpr, INTERP: tl.constexpr):
    # W^T[k0:k0+BK, cols] as bf16 [BK, BN] from the tile's scale bytes (ma, mb, md, mdm: `tile_meta`);
    # for bf16 weights codes_p is the [N, K] weight. DQ=1: two codes a register through bf16x2 FMAs
    # (`dequant_tile_bf16`); DQ=0: float32, one code at a time
    if BITS == 16:
        ks = k0 + tl.arange(0, BK)
        return tl.load(codes_p + cols[None, :].to(tl.int64) * K + ks[:, None],
                       mask=(ks < K)[:, None] & col_ok[None, :], other=0.0)
    else:
        words = tile_words(codes_p, N, k0, cols, col_ok, BITS, GROUP, SB, BK)           # [GT, GS/EPW, BN]
        S_, M = tile_scales(ma, mb, md, mdm, k0, GROUP, SCALE_BITS, MIN_BITS, SB)        # [GT, BN]
        if DQ:          # inline PTX on the GPU, its float32 emulation in the interpreter
            return dequant_tile_bf16(words, S_, M, BITS, BK, not INTERP)
        else:
            return dequant_tile(words, S_, M, BITS, BK).to(tl.bfloat16)


@triton.jit
def _meta(scales_p, mins_p, d_p, dmin_p, N, k0, cols, col_ok, BITS: tl.constexpr, GROUP: tl.constexpr,
          SCALE_BITS: tl.constexpr, MIN_BITS: tl.constexpr, SB: tl.constexpr, BK: tl.constexpr):
    # `tile_meta` for packed weights; placeholders for bf16 (no scales)
    if BITS == 16:
        z = tl.zeros([1], tl.int32)
        return z, z, z, z
    else:
        return tile_meta(scales_p, mins_p, d_p, dmin_p, N, k0, cols, col_ok, GROUP, SCALE_BITS, MIN_BITS, SB, BK)


@triton.jit
def _k_extent(K, BITS: tl.constexpr, GROUP: tl.constexpr, SB: tl.constexpr):
    # inputs the K loop covers: K itself for bf16, K padded to the scale unit for packed weights
    if BITS == 16:
        return K
    else:
        UNIT: tl.constexpr = SB if SB > 0 else GROUP
        return tl.cdiv(K, UNIT) * UNIT


@triton.jit
def gemm_kernel(x_p, stride_xm, codes_p, scales_p, mins_p, d_p, dmin_p, out_p, stride_om, M, N, K,
                BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr, MIN_BITS: tl.constexpr,
                SB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                EVEN_K: tl.constexpr, INTERP: tl.constexpr, DQ: tl.constexpr, PFM: tl.constexpr):
    # out [M, N] = x [M, K] @ W [N, K]^T, tiles [BM, BN], programs grouped GROUP_M tiles tall for L2 reuse;
    # DQ: the dequantization path (`_b_tile`); PFM=1: each K tile's scale bytes loaded a step ahead
    pid = tl.program_id(0)
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    per_group = GROUP_M * npn
    first_m = (pid // per_group) * GROUP_M
    gm = tl.minimum(npm - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % gm
    pid_n = (pid % per_group) // gm
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros([BM, BN], tl.float32)
    kend = _k_extent(K, BITS, GROUP, SB)
    ma, mb, md, mdm = _meta(scales_p, mins_p, d_p, dmin_p, N, 0, rn, n_ok, BITS, GROUP, SCALE_BITS, MIN_BITS, SB, BK)
    for k0 in range(0, kend, BK):
        ks = k0 + tl.arange(0, BK)
        if EVEN_K:      # K % BK == 0: no mask along K, so the loads vectorize
            a = tl.load(x_p + rm[:, None].to(tl.int64) * stride_xm + ks[None, :], mask=m_ok[:, None], other=0.0)
        else:
            a = tl.load(x_p + rm[:, None].to(tl.int64) * stride_xm + ks[None, :],
                        mask=m_ok[:, None] & (ks < K)[None, :], other=0.0)                    # [BM, BK]
        if PFM:         # this tile's scale bytes came a step ago; load the next tile's (the last again at the end)
            ca, cb, cd, cdm = ma, mb, md, mdm
            ma, mb, md, mdm = _meta(scales_p, mins_p, d_p, dmin_p, N, tl.minimum(k0 + BK, kend - BK), rn, n_ok,
                                    BITS, GROUP, SCALE_BITS, MIN_BITS, SB, BK)
        else:
            ca, cb, cd, cdm = _meta(scales_p, mins_p, d_p, dmin_p, N, k0, rn, n_ok, BITS, GROUP, SCALE_BITS,
                                    MIN_BITS, SB, BK)
        b = _b_tile(codes_p, ca, cb, cd, cdm, N, K, k0, rn, n_ok,
                    BITS, GROUP, SCALE_BITS, MIN_BITS, SB, BK, DQ, INTERP)                     # [BK, BN]
        acc = mma(a, b, acc, INTERP)
    tl.store(out_p + rm[:, None].to(tl.int64) * stride_om + rn[None, :], acc.to(out_p.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


# ------------------------------------------------------------------------------------ grouped MoE path

@triton.jit
def _expert_dot(a_p, a_stride, a_rows, a_ok, base, table_p, mat, N, K, cols, col_ok, acc,
                CODE: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, SCALE_BITS: tl.constexpr,
                MIN_BITS: tl.constexpr, SB: tl.constexpr, BK: tl.constexpr, DQ: tl.constexpr, PFM: tl.constexpr,
                INTERP: tl.constexpr):
    # acc [BM, BN] += A[a_rows, :K] @ W_mat^T[:, cols] for matrix `mat` of the expert blob at base
    if BITS == 16:
        codes = blob_segment(base, table_p, CODE, mat, 0, 17)
    else:
        codes = blob_segment(base, table_p, CODE, mat, 0, 32)
    scales = blob_segment(base, table_p, CODE, mat, 1, SCALE_BITS)
    mins = blob_segment(base, table_p, CODE, mat, 2, MIN_BITS)
    d = blob_segment(base, table_p, CODE, mat, 3, 16)
    dmin = blob_segment(base, table_p, CODE, mat, 4, 16)
    kend = _k_extent(K, BITS, GROUP, SB)
    ma, mb, md, mdm = _meta(scales, mins, d, dmin, N, 0, cols, col_ok, BITS, GROUP, SCALE_BITS, MIN_BITS, SB, BK)
    for k0 in range(0, kend, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_p + a_rows[:, None].to(tl.int64) * a_stride + ks[None, :],
                    mask=a_ok[:, None] & (ks < K)[None, :], other=0.0)
        if PFM:         # as in gemm_kernel
            ca, cb, cd, cdm = ma, mb, md, mdm
            ma, mb, md, mdm = _meta(scales, mins, d, dmin, N, tl.minimum(k0 + BK, kend - BK), cols, col_ok,
                                    BITS, GROUP, SCALE_BITS, MIN_BITS, SB, BK)
        else:
            ca, cb, cd, cdm = _meta(scales, mins, d, dmin, N, k0, cols, col_ok, BITS, GROUP, SCALE_BITS, MIN_BITS,
                                    SB, BK)
        b = _b_tile(codes, ca, cb, cd, cdm, N, K, k0, cols, col_ok, BITS, GROUP, SCALE_BITS, MIN_BITS, SB, BK,
                    DQ, INTERP)
        acc = mma(a, b, acc, INTERP)
    return acc


@triton.jit
def _expert_dot_any(a_p, a_stride, a_rows, a_ok, base, table_p, mat, N, K, cols, col_ok, code,
                    BM: tl.constexpr, BN: tl.constexpr, FMASK: tl.constexpr, BK: tl.constexpr, DQ: tl.constexpr,
                    PFM: tl.constexpr, INTERP: tl.constexpr):
    # dispatch on the expert's run-time format code (branches only for codes in FMASK)
    acc = tl.zeros([BM, BN], tl.float32)
    if (FMASK & 1) != 0:
        if code == 0:
            acc = _expert_dot(a_p, a_stride, a_rows, a_ok, base, table_p, mat, N, K, cols, col_ok, acc,
                              0, 2, 16, 8, 4, 512, BK, DQ, PFM, INTERP)
    if (FMASK & 2) != 0:
        if code == 1:
            acc = _expert_dot(a_p, a_stride, a_rows, a_ok, base, table_p, mat, N, K, cols, col_ok, acc,
                              1, 2, 32, 8, 8, 512, BK, DQ, PFM, INTERP)
    if (FMASK & 4) != 0:
        if code == 2:
            acc = _expert_dot(a_p, a_stride, a_rows, a_ok, base, table_p, mat, N, K, cols, col_ok, acc,
                              2, 1, 32, 8, 4, 512, BK, DQ, PFM, INTERP)
    if (FMASK & 8) != 0:
        if code == 3:
            acc = _expert_dot(a_p, a_stride, a_rows, a_ok, base, table_p, mat, N, K, cols, col_ok, acc,
                              3, 4, 128, 16, 16, 0, BK, DQ, PFM, INTERP)
    if (FMASK & 16) != 0:
        if code == 4:
            acc = _expert_dot(a_p, a_stride, a_rows, a_ok, base, table_p, mat, N, K, cols, col_ok, acc,
                              4, 16, 1, 0, 0, 0, BK, DQ, PFM, INTERP)
    return acc


@triton.jit
def grouped_gate_up(x_p, stride_xm, order_p, blk_e_p, blk_start_p, blk_cnt_p, codes_p, offs_p, arena_p,
                    table_p, h_p, H, I, TOPK: tl.constexpr, FMASK: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DQ: tl.constexpr, PFM: tl.constexpr,
                    INTERP: tl.constexpr):
    # h [P, I] (bf16) for the block's pairs: rows of x gathered by token = pair // TOPK
    b = tl.program_id(0)
    e = tl.load(blk_e_p + b)
    if e >= 0:
        start = tl.load(blk_start_p + b)
        cnt = tl.load(blk_cnt_p + b)
        r = tl.arange(0, BM)
        r_ok = r < cnt
        pair = tl.load(order_p + start + r, mask=r_ok, other=0)
        tok = pair // TOPK
        code = tl.load(codes_p + e)
        base = arena_p + tl.multiple_of(tl.load(offs_p + e), 256)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        c_ok = cols < I
        g = _expert_dot_any(x_p, stride_xm, tok, r_ok, base, table_p, 0, I, H, cols, c_ok, code, BM, BN, FMASK, BK,
                            DQ, PFM, INTERP)
        u = _expert_dot_any(x_p, stride_xm, tok, r_ok, base, table_p, 1, I, H, cols, c_ok, code, BM, BN, FMASK, BK,
                            DQ, PFM, INTERP)
        h = g * tl.sigmoid(g) * u
        tl.store(h_p + pair[:, None].to(tl.int64) * I + cols[None, :], h.to(tl.bfloat16),
                 mask=r_ok[:, None] & c_ok[None, :])


@triton.jit
def grouped_down(h_p, wts_p, order_p, blk_e_p, blk_start_p, blk_cnt_p, codes_p, offs_p, arena_p, table_p,
                 y_p, H, I, FMASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 DQ: tl.constexpr, PFM: tl.constexpr, INTERP: tl.constexpr):
    # y [P, H] (float32) = topk weight of the pair * h[pair] @ W_down^T
    b = tl.program_id(0)
    e = tl.load(blk_e_p + b)
    if e >= 0:
        start = tl.load(blk_start_p + b)
        cnt = tl.load(blk_cnt_p + b)
        r = tl.arange(0, BM)
        r_ok = r < cnt
        pair = tl.load(order_p + start + r, mask=r_ok, other=0)
        code = tl.load(codes_p + e)
        base = arena_p + tl.multiple_of(tl.load(offs_p + e), 256)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        c_ok = cols < H
        y = _expert_dot_any(h_p, I, pair, r_ok, base, table_p, 2, H, I, cols, c_ok, code, BM, BN, FMASK, BK,
                            DQ, PFM, INTERP)
        wt = tl.load(wts_p + pair, mask=r_ok, other=0.0).to(tl.float32)
        tl.store(y_p + pair[:, None].to(tl.int64) * H + cols[None, :], y * wt[:, None],
                 mask=r_ok[:, None] & c_ok[None, :])


def _blocks(ids: torch.Tensor, n_experts: int, bm: int):
    """Sort (token, expert) pairs by expert and cut each expert's run into blocks of at most bm pairs.

    No host sync: the block count is bounded by cdiv(P, bm) + min(E, P); unused blocks have expert -1.
    Skipped pairs (id < 0) sort last, into a bucket past the experts that gets no block."""
    flat = ids.reshape(-1).to(torch.int64)
    flat = torch.where(flat < 0, n_experts, flat)
    p = flat.numel()
    order = torch.argsort(flat, stable=True).to(torch.int32)
    # scatter_add, not bincount: torch's CUDA bincount reads the largest id back to the host (a sync)
    counts = torch.zeros(n_experts + 1, dtype=torch.int64, device=ids.device).scatter_add_(
        0, flat, torch.ones_like(flat))[:n_experts]
    nblk = (counts + bm - 1) // bm
    blk_end = torch.cumsum(nblk, 0)
    pair_start = torch.cumsum(counts, 0) - counts
    nmax = (p + bm - 1) // bm + min(n_experts, p)
    b = torch.arange(nmax, device=ids.device)
    e = torch.searchsorted(blk_end, b, right=True)
    valid = e < n_experts
    ec = e.clamp(max=n_experts - 1)
    local = b - (blk_end[ec] - nblk[ec])
    start = pair_start[ec] + local * bm
    cnt = (counts[ec] - local * bm).clamp(0, bm)
    blk_e = torch.where(valid, ec, -1).to(torch.int32)
    return order, blk_e, start.to(torch.int32), cnt.to(torch.int32)


def moe_grouped(x, ids, wts, arena, offsets, codes, fmask, table, hidden, inter, out, cfg, scratch) -> None:
    """The MoE call for many tokens: grouped gate/up, grouped down, then the sum over each token's k.
    `scratch(*shape, dtype=, device=)` allocates the intermediates (ops.scratch)."""
    m, topk = ids.shape
    # rows per block: about the pairs an expert gets on average (no host sync to count them exactly)
    bm = max(16, min(cfg.block_m, triton.next_power_of_2(triton.cdiv(m * topk, offsets.numel()))))
    bk = cfg.block_k
    if fmask & 0b1111:
        bk = min(bk, 128)              # K tiles divide every packed format's scale unit
    order, blk_e, start, cnt = _blocks(ids, offsets.numel(), bm)
    h = scratch(m * topk, inter, dtype=torch.bfloat16, device=x.device)
    y = scratch(m * topk, hidden, dtype=torch.float32, device=x.device)
    nb = blk_e.numel()
    dq, pfm = int(cfg.bf16x2_dequant), int(cfg.prefetch_scales)
    grouped_gate_up[(nb, triton.cdiv(inter, cfg.block_n))](
        x, x.stride(0), order, blk_e, start, cnt, codes, offsets, arena, table, h, hidden, inter,
        TOPK=topk, FMASK=fmask, BM=bm, BN=cfg.block_n, BK=bk, DQ=dq, PFM=pfm, INTERP=INTERPRET,
        num_warps=cfg.warps, num_stages=cfg.stages)
    grouped_down[(nb, triton.cdiv(hidden, cfg.block_n))](
        h, wts, order, blk_e, start, cnt, codes, offsets, arena, table, y, hidden, inter,
        FMASK=fmask, BM=bm, BN=cfg.block_n, BK=bk, DQ=dq, PFM=pfm, INTERP=INTERPRET,
        num_warps=cfg.warps, num_stages=cfg.stages)
    y.masked_fill_((ids < 0).reshape(-1, 1), 0.0)               # skipped pairs: no block wrote their rows
    torch.sum(y.view(m, topk, hidden), dim=1, out=out) if out.dtype == torch.float32 else \
        out.copy_(y.view(m, topk, hidden).sum(1))
