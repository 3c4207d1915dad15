"""`fused_moe` as the engine calls it: once per layer per token, with skipped pairs, no allocation.

Runs the Triton kernels on CUDA where there is a GPU, else in Triton's interpreter at small shapes.
"""
from __future__ import annotations

import sys

import pytest
import torch

from strata_plan.kernels import fused_moe, ops
from strata_plan.kernels import reference as R

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_kernels_triton import DEVICE, MIX, make_arena, nan_like, rel, route  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def arena():
    hidden, inter = 200, 150
    a, offsets = make_arena(MIX, hidden, inter)
    return a, offsets, hidden, inter


def _skip_some(ids: torch.Tensor) -> torch.Tensor:
    """ids with every third pair (and all of the last token's but one) marked skipped (-1)."""
    s = ids.clone()
    flat = s.view(-1)
    flat[::3] = -1
    s[-1, 1:] = -1
    return s


def test_reference_skips_negative_ids(arena):
    a, offsets, hidden, inter = arena
    x = torch.randn(3, hidden, device=DEVICE)
    ids, wts = route(3, len(MIX), 3)
    sk = _skip_some(ids)
    # a skipped pair is the same as a pair of weight 0 (on any real expert)
    zeroed = torch.where(sk < 0, torch.zeros_like(wts), wts)
    for q8 in (False, True):
        got = R.moe(x, sk, wts, a, offsets, MIX, hidden, inter, q8=q8)
        want = R.moe(x, sk.clamp(min=0), zeroed, a, offsets, MIX, hidden, inter, q8=q8)
        assert torch.equal(got, want)


@pytest.mark.parametrize("m", [2, ops.MOE_DECODE_MAX_M + 3])      # decode kernels, grouped prefill path
def test_fused_moe_skips_negative_ids(arena, m):
    a, offsets, hidden, inter = arena
    x = torch.randn(m, hidden, device=DEVICE)
    ids, wts = route(m, len(MIX), 3)
    sk = _skip_some(ids)
    out = fused_moe(x, sk, wts, a, offsets, MIX, hidden, inter, out=nan_like((m, hidden), torch.float32),
                    backend="triton")
    assert not out.isnan().any()
    exact = R.moe(x, sk, wts, a, offsets, MIX, hidden, inter)
    assert rel(out, exact) < (6e-2 if m <= ops.MOE_DECODE_MAX_M else 3e-2)
    # the same call with the skipped pairs' weights at zero on expert 0: the same output up to float sums
    zeroed = torch.where(sk < 0, torch.zeros_like(wts), wts)
    same = fused_moe(x, sk.clamp(min=0), zeroed, a, offsets, MIX, hidden, inter, backend="triton")
    assert rel(out, same.float()) < 1e-5
    # every pair of a token skipped: a zero row
    all_skipped = torch.full_like(ids, -1)
    z = fused_moe(x, all_skipped, wts, a, offsets, MIX, hidden, inter, out=nan_like((m, hidden), torch.float32),
                  backend="triton")
    assert torch.equal(z, torch.zeros_like(z))


def test_a_token_does_not_depend_on_its_batch(arena):
    # every token has its own activation scales (one per 32 inputs of its own row, `quantize_x_row`) and
    # every pair its own for h: a token's output is the same alone as in a batch. (The error against
    # fp32 math grows with the batch only as a statistic: KERNELS.md, "Accuracy".)
    a, offsets, hidden, inter = arena
    x = torch.randn(4, hidden, device=DEVICE)
    ids, wts = route(4, len(MIX), 3)
    cfg = {"split1": 1, "split2": 1}
    batch = fused_moe(x, ids, wts, a, offsets, MIX, hidden, inter, backend="triton", config=cfg)
    for t in range(4):
        alone = fused_moe(x[t:t + 1], ids[t:t + 1], wts[t:t + 1], a, offsets, MIX, hidden, inter,
                          backend="triton", config=cfg)
        assert torch.equal(alone[0], batch[t]), t


def test_prepared_call_reuses_its_scratch_and_allocates_nothing(arena, monkeypatch):
    a, offsets, hidden, inter = arena
    fm = ops.ExpertFormats.from_names(MIX, DEVICE)
    x = torch.randn(1, hidden, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(1, len(MIX), 3)
    out = torch.empty(1, hidden, dtype=torch.bfloat16, device=DEVICE)
    first = fused_moe(x, ids, wts, a, offsets, fm, hidden, inter, out=out, backend="triton").clone()
    pm = ops.prepare_moe(fm, len(MIX), hidden, inter, DEVICE)
    assert ops.prepare_moe(fm, len(MIX), hidden, inter, DEVICE) is pm          # resolved once
    launch = pm._launches[(1, ids.shape[1], ops._stream_id(x.device))]
    n_launches = len(pm._launches)
    buffers = [t.data_ptr() for t in vars(launch.sc).values()]
    # count every tensor the kernels' Python creates during a warm call (the interpreter's own work on
    # CPU is not the library's: only calls made from strata_plan/kernels count)
    made = []
    kernels_dir = ops.__file__.rsplit("/", 1)[0]
    for name in ("empty", "zeros", "full", "ones", "tensor", "empty_like", "zeros_like", "full_like", "arange"):
        real = getattr(torch, name)

        def counting(*args, _real=real, _name=name, **kwargs):
            if sys._getframe(1).f_code.co_filename.startswith(kernels_dir):
                made.append(_name)
            return _real(*args, **kwargs)
        monkeypatch.setattr(torch, name, counting)
    monkeypatch.setattr(ops, "POISON_SCRATCH", False)
    again = fused_moe(x, ids, wts, a, offsets, fm, hidden, inter, out=out, backend="triton")
    assert made == []
    assert again is out and torch.equal(again, first)
    assert [t.data_ptr() for t in vars(launch.sc).values()] == buffers and len(pm._launches) == n_launches


@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # codes set to 0 below: experts read as the wrong format
def test_formats_as_a_tensor_are_resolved_once(arena, monkeypatch):
    a, offsets, hidden, inter = arena
    codes = ops.ExpertFormats.from_names(MIX, DEVICE).codes.clone()
    calls = []
    real = torch.unique
    monkeypatch.setattr(torch, "unique", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    x = torch.randn(1, hidden, device=DEVICE)
    ids, wts = route(1, len(MIX), 3)
    one = fused_moe(x, ids, wts, a, offsets, codes, hidden, inter, backend="triton")
    two = fused_moe(x, ids, wts, a, offsets, codes, hidden, inter, backend="triton")
    assert len(calls) == 1 and torch.equal(one, two)                   # the mask (a device sync) once
    assert torch.equal(one, fused_moe(x, ids, wts, a, offsets, MIX, hidden, inter, backend="triton"))
    codes.fill_(0)                                                     # changed in place: read again
    fused_moe(x, ids, wts, a, offsets, codes, hidden, inter, backend="triton")
    assert len(calls) == 2


@gpu
@pytest.mark.gpu
def test_decode_call_allocates_nothing_on_the_gpu():
    hidden, inter = 1024, 512
    names = ["q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "q1_g32_s8m4"] * 2
    a, offsets = make_arena(names, hidden, inter)
    fm = ops.ExpertFormats.from_names(names, DEVICE)
    x = torch.randn(1, hidden, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(1, len(names), 8)
    out = torch.empty(1, hidden, dtype=torch.bfloat16, device=DEVICE)
    fused_moe(x, ids, wts, a, offsets, fm, hidden, inter, out=out)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    for _ in range(10):
        fused_moe(x, ids, wts, a, offsets, fm, hidden, inter, out=out)
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    assert after["allocation.all.allocated"] == before["allocation.all.allocated"]
    assert after["allocated_bytes.all.allocated"] == before["allocated_bytes.all.allocated"]
