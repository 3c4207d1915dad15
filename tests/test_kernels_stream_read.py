"""The zero-copy read probe (`kernels.stream_read`): its checksum against a plain-torch one on the same bytes.

On CPU the kernel runs in Triton's interpreter (conftest sets TRITON_INTERPRET=1 without a GPU); every input is
drawn fresh each run. The reads cover several blocks per program and a partial last block, so the grid-stride
loop and the mask are both exercised; one changed byte just inside the range must change the checksum, one just
outside must not. On a GPU the kernel reads a registered `HostRegion` in place, at an offset from a device arena.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from strata_plan.kernels.stream_read import (ALIGN, BLOCK, checksum, programs_for, reference_checksum,
                                             stream_read)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def fresh_bytes(n: int, device: str = DEVICE) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8).to(device)


@pytest.mark.parametrize("offset, nbytes", [(4096, 16 * (9 * BLOCK + 37)),      # 10 blocks over 4 programs
                                            (ALIGN, ALIGN),                     # one pair
                                            (0, 16 * BLOCK)])                    # one whole block
def test_checksum_matches_torch(offset, nbytes):
    arena = fresh_bytes(offset + nbytes + 4096)
    partials = stream_read(arena, offset, nbytes)
    assert partials.dtype == torch.int64 and partials.numel() == programs_for(arena.device, nbytes)
    assert checksum(partials) == reference_checksum(arena[offset:offset + nbytes])


def test_checksum_covers_exactly_the_range():
    offset, nbytes = 2048, 16 * (2 * BLOCK + 5)
    arena = fresh_bytes(offset + nbytes + 64)
    before = checksum(stream_read(arena, offset, nbytes))
    arena[offset + nbytes] += 1                        # just past the end: not read
    arena[offset - 1] += 1                             # just before the start: not read
    assert checksum(stream_read(arena, offset, nbytes)) == before
    last = offset + nbytes - 1                         # the last byte read: the high byte of the last word
    v = int(arena[last])
    arena[last] = (v + 1) % 256
    after = checksum(stream_read(arena, offset, nbytes))
    assert after == (before + (((v + 1) % 256 - v) << 56)) % (1 << 64)
    assert after == reference_checksum(arena[offset:offset + nbytes])


def test_out_sets_the_programs_and_every_partial_is_written():
    arena = fresh_bytes(16 * 3 * BLOCK)
    out = torch.full((7,), 0x7F7F7F7F7F7F7F7F, dtype=torch.int64, device=DEVICE)     # more programs than blocks
    assert stream_read(arena, 0, arena.numel(), out=out) is out
    assert out[3:].eq(0).all()                         # programs without a block store 0, not the garbage
    assert checksum(out) == reference_checksum(arena)


@pytest.mark.parametrize("offset, nbytes", [(8, 16), (0, 24), (0, 0)])
def test_misaligned_reads_are_refused(offset, nbytes):
    with pytest.raises(ValueError, match="multiples of 16"):
        stream_read(fresh_bytes(1024), offset, nbytes)


def test_reference_checksum_wraps_like_int64():
    words = torch.tensor([-1, 2, (1 << 63) - 1, -(1 << 63)], dtype=torch.int64)
    assert reference_checksum(words.view(torch.uint8)) == (-1 + 2 + (1 << 63) - 1 - (1 << 63)) % (1 << 64)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_loads_are_16_bytes_wide_on_sm90():
    """Compiled for the H200 (no GPU needed), the loop's loads are 128-bit vector loads."""
    code = ("import re\n"
            "from strata_plan.kernels.compile_check import _compile, P\n"
            "from strata_plan.kernels import stream_read as sr\n"
            "k = _compile(sr.stream_read_kernel, {'arena_p': P['u8'], 'offset': 'i64', 'n_pairs': 'i64', "
            "'out_p': P['i64']}, dict(BLOCK=sr.BLOCK), 90, num_warps=sr.NUM_WARPS)\n"
            "print(sorted(set(re.findall(r'ld\\.global[.\\w]*', k.asm['ptx']))))\n")
    env = {**os.environ, "STRATA_TRITON_COMPILE_ONLY": "1"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "['ld.global.v2.b64']"


@gpu
@pytest.mark.gpu
def test_reads_registered_host_memory_in_place():
    from strata_plan.pinned import HostRegion
    nbytes = 24 << 20
    with HostRegion(nbytes, "cuda") as region:
        region.tensor.copy_(fresh_bytes(nbytes, "cpu"))
        arena = torch.empty(256, dtype=torch.uint8, device="cuda")
        offset = region.device_ptr - arena.data_ptr() + 4096
        partials = stream_read(arena, offset, nbytes - 8192)
        torch.cuda.synchronize()
        assert checksum(partials) == reference_checksum(region.tensor[4096:nbytes - 4096])
        del partials
