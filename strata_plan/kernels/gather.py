"""Embedding rows gathered in place: the token's row read by a kernel from wherever the table lives.

    gather_rows(arena, offset, ids, out)      # out[t] = table[ids[t]], table [V, H] at arena.data_ptr() + offset

As `fused_moe` reads an expert at `arena_p + offsets[e]`, this reads a table of 2-byte elements (bf16 / fp16
bits) at `arena_p + offset`; an offset of `host_address - arena.data_ptr()` points into registered pinned RAM
(`strata_plan.pinned.HostRegion`), so a decode step's embedding row crosses PCIe inside the step's CUDA graph
with no host work (the token id never leaves the GPU). Under TRITON_INTERPRET=1 (CPU tests) the offset must
stay inside `arena`.
"""
from __future__ import annotations

import torch

from .triton_common import tl, triton

BLOCK = 1024              # elements of a row a program copies


@triton.jit
def gather_rows_kernel(arena_p, offset, ids_p, out_p, H, BLOCK: tl.constexpr):
    # arena_p: uint8 pointer; the table: int16 [V, H] at arena_p + offset (offset an int64 byte offset, may
    #   leave the arena); ids_p: int64 [T]; out_p: int16 [T, H]
    # grid (T, cdiv(H, BLOCK)): program (t, b) copies columns b*BLOCK .. b*BLOCK + BLOCK of row ids[t]
    t = tl.program_id(0)
    b = tl.program_id(1)
    row = tl.load(ids_p + t)
    cols = b * BLOCK + tl.arange(0, BLOCK)                                   # [BLOCK]
    table = (arena_p + offset).to(tl.pointer_type(tl.int16))
    v = tl.load(table + row * H + cols, mask=cols < H)
    tl.store(out_p + t * H + cols, v, mask=cols < H)


def gather_rows(arena: torch.Tensor, offset: int, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [T, H] (a 2-byte dtype, contiguous) = rows ids [T] (int64) of the [V, H] table at byte address
    `arena.data_ptr() + offset`, on arena's device; graph-safe (no allocation, no sync). Returns out."""
    if out.element_size() != 2 or out.dim() != 2 or not out.is_contiguous():
        raise ValueError(f"gather_rows: out must be a contiguous 2-D tensor of a 2-byte dtype, got {out.dtype} "
                         f"{tuple(out.shape)}")
    if ids.dtype != torch.int64 or ids.shape != out.shape[:1]:
        raise ValueError(f"gather_rows: ids must be int64 [{out.shape[0]}], got {ids.dtype} {tuple(ids.shape)}")
    T, H = out.shape
    gather_rows_kernel[(T, triton.cdiv(H, BLOCK))](arena, int(offset), ids, out.view(torch.int16), H, BLOCK=BLOCK)
    return out
