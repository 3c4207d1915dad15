"""A probe that reads bytes in place, as `fused_moe` reads an expert blob: at `arena.data_ptr() + offset`.

    partials = stream_read(arena, offset, nbytes)     # int64 [P]: each program's wrapping sum of its words
    checksum(partials) == reference_checksum(bytes)   # the same sum, mod 2^64, of the bytes read

`fused_moe` computes `base = arena_p + offsets[e]`; an offset `host_address - arena.data_ptr()` makes that
address point into registered pinned host memory (`strata_plan.pinned.HostRegion`), which the GPU then reads
over PCIe without a copy (zero-copy). This kernel does the same with nothing else around it, so the rate it
reaches is the rate of such reads (the profiler's `zero_copy` curve).

The bytes are read as int64 word pairs (16-byte loads: a pair's two words are contiguous and share their
mask, so the compiler emits one 128-bit load for each), in blocks of BLOCK pairs; program p of P reads blocks
p, p + P, p + 2P, ... (a grid-stride loop) and writes the wrapping int64 sum of its words to partials[p], so
the loads cannot be dropped and the result checks which bytes were read. Under TRITON_INTERPRET=1 (CPU
tests) it runs in Triton's interpreter on CPU tensors; the arithmetic is the same.
"""
from __future__ import annotations

import torch

from .triton_common import INTERPRET, tl, triton

BLOCK = 1024               # word pairs a program reads per step: 16 KiB
NUM_WARPS = 8
PROGRAMS_PER_SM = 4        # programs a streaming multiprocessor gets: enough loads in flight to cover PCIe latency
INTERPRETED_PROGRAMS = 4   # programs when interpreted (CPU: one at a time)
WORD = 8                   # bytes of an int64 word
ALIGN = 16                 # bytes of one load: the address and the length must be multiples of it
MOD = 1 << 64


@triton.jit
def stream_read_kernel(arena_p, offset, n_pairs, out_p, BLOCK: tl.constexpr):
    # arena_p: uint8 pointer; the bytes read are int64 words [2 * n_pairs] at arena_p + offset (16-byte
    #   aligned; offset an int64 byte offset that may leave the arena, e.g. into registered host memory)
    # grid (P,): program p reads pair blocks p, p + P, ... of BLOCK pairs [BLOCK, 2] and stores the wrapping
    #   int64 sum of its words at out_p[p] (int64 [P]); a program with no block stores 0
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    words = (arena_p + offset).to(tl.pointer_type(tl.int64))
    n_blocks = tl.cdiv(n_pairs, BLOCK)
    lane = tl.arange(0, 2)[None, :]                                          # [1, 2]: a pair's two words
    acc = tl.zeros([BLOCK, 2], tl.int64)
    for b in range(pid, n_blocks, nprog):
        pair = tl.cast(b, tl.int64) * BLOCK + tl.arange(0, BLOCK)[:, None]     # [BLOCK, 1]
        acc += tl.load(words + pair * 2 + lane, mask=pair < n_pairs, other=0)    # [BLOCK, 2]
    tl.store(out_p + pid, tl.sum(tl.sum(acc, 1), 0))


def programs_for(device: torch.device, nbytes: int) -> int:
    """Programs of a read of `nbytes` on `device`: PROGRAMS_PER_SM per SM (INTERPRETED_PROGRAMS on CPU), and
    no more than the read has blocks."""
    blocks = max(1, -(-nbytes // (ALIGN * BLOCK)))
    if device.type == "cuda":
        return min(blocks, PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count)
    return min(blocks, INTERPRETED_PROGRAMS)


def stream_read(arena: torch.Tensor, offset: int, nbytes: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Read `nbytes` at byte address `arena.data_ptr() + offset` on arena's device; returns the per-program
    partial sums, int64 [P] on that device (`checksum` turns them into the checksum of the bytes). `out`:
    int64 [P] to write them to (P programs; reused across calls it keeps the call allocation-free), else
    `programs_for` of them. nbytes, offset and arena's address must be multiples of 16 (the JIT then knows
    every pair's address is, and emits 16-byte loads); the bytes must stay alive and be readable by the
    device (for a CUDA arena: device memory, or host memory registered with the GPU)."""
    offset, nbytes = int(offset), int(nbytes)
    if nbytes <= 0 or nbytes % ALIGN or offset % ALIGN or arena.data_ptr() % ALIGN:
        raise ValueError(f"stream_read needs a positive length, an offset and an arena address that are multiples of "
                         f"{ALIGN} bytes, got {nbytes} bytes at offset {offset} from 0x{arena.data_ptr():x}")
    if arena.device.type != "cuda" and not INTERPRET:
        raise ValueError("stream_read on a CPU tensor needs Triton's interpreter (TRITON_INTERPRET=1)")
    if out is None:
        out = torch.empty(programs_for(arena.device, nbytes), dtype=torch.int64, device=arena.device)
    elif out.dtype != torch.int64 or out.dim() != 1 or out.device != arena.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous int64 [P] tensor on {arena.device}")
    stream_read_kernel[(out.numel(),)](arena, offset, nbytes // ALIGN, out, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out


def checksum(partials: torch.Tensor) -> int:
    """The sum of `stream_read`'s partials mod 2^64: the sum of the int64 words read, wrapped (0 .. 2^64 - 1)."""
    return sum(int(v) for v in partials.cpu().tolist()) % MOD


def reference_checksum(data: torch.Tensor, chunk: int = 64 << 20) -> int:
    """The checksum `stream_read` computes, on the CPU with torch: the sum of `data`'s bytes (uint8, length a
    multiple of 8) as little-endian int64 words, mod 2^64. Exact: each word's low and high 32-bit halves are
    summed apart (no overflow below 2^31 words), `chunk` bytes at a time."""
    flat = data.detach().reshape(-1)
    if flat.dtype != torch.uint8 or flat.numel() % WORD:
        raise ValueError("reference_checksum needs uint8 bytes, a multiple of 8 of them")
    total = 0
    for i in range(0, flat.numel(), chunk):
        w = flat[i:i + chunk].cpu().view(torch.int64)
        lo = int(torch.bitwise_and(w, 0xFFFFFFFF).sum())
        hi = int(torch.bitwise_right_shift(w, 32).sum())          # arithmetic shift: the signed high half
        total += lo + (hi << 32)
    return total % MOD
