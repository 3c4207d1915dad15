"""`fused_moe` as the engine calls it: once per layer per token, with skipped pairs, no allocation, its
decode kernels launched directly from their compiled kernels or through Triton's launcher, alike.

Runs the Triton kernels on CUDA where there is a GPU, else in Triton's interpreter at small shapes.
"""
from __future__ import annotations

import sys

import pytest
import torch

from strata_plan.kernels import fused_moe, ops
from strata_plan.kernels import reference as R

from test_kernels_triton import DEVICE, MIX, make_arena, nan_like, rel, route   # a test module beside this one

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
    call = pm._launches[(1, ids.shape[1], ops._stream_id(x.device))]
    n_launches = len(pm._launches)
    buffers = [t.data_ptr() for t in vars(call.sc).values()]
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
    again = fused_moe(x, ids, wts, a, offsets, fm, hidden, inter, out=out, backend="triton")
    assert made == []
    assert again is out and torch.equal(again, first)
    assert [t.data_ptr() for t in vars(call.sc).values()] == buffers and len(pm._launches) == n_launches


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


GPU_NAMES = ["q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "q1_g32_s8m4"] * 2
GPU_HIDDEN, GPU_INTER = 1024, 512


def _gpu_layer():
    """A small layer on the GPU and one token's inputs: arena, offsets, formats, x, ids, wts, out."""
    a, offsets = make_arena(GPU_NAMES, GPU_HIDDEN, GPU_INTER)
    fm = ops.ExpertFormats.from_names(GPU_NAMES, DEVICE)
    x = torch.randn(1, GPU_HIDDEN, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(1, len(GPU_NAMES), 8)
    return a, offsets, fm, x, ids, wts, torch.empty(1, GPU_HIDDEN, dtype=torch.bfloat16, device=DEVICE)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("direct", [True, False])
def test_decode_call_allocates_nothing_on_the_gpu(direct):
    hidden, inter = GPU_HIDDEN, GPU_INTER
    a, offsets, fm, x, ids, wts, out = _gpu_layer()
    # direct: fused_moe as the engine calls it; plain: a PreparedMoE made with direct=False
    pm = ops.prepare_moe(fm, len(GPU_NAMES), hidden, inter, DEVICE) if direct else \
        ops.PreparedMoE(fm, hidden, inter, DEVICE, direct=False)

    def call():
        if direct:
            return fused_moe(x, ids, wts, a, offsets, fm, hidden, inter, out=out)
        return pm(x, ids, wts, a, offsets, out=out)
    call()
    assert pm.launch_mode(x, ids, wts, a, offsets, out) == ("direct" if direct else "plain")
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    assert after["allocation.all.allocated"] == before["allocation.all.allocated"]
    assert after["allocated_bytes.all.allocated"] == before["allocated_bytes.all.allocated"]


def _misaligned(x: torch.Tensor) -> torch.Tensor:
    """x's values at an address 2 bytes past a 16-byte boundary (another Triton specialization)."""
    buf = torch.empty(x.numel() + 8, dtype=x.dtype, device=x.device)
    y = buf[1:1 + x.numel()].view_as(x)
    y.copy_(x)
    assert y.data_ptr() % 16 != 0
    return y


def _both_paths(arena, names, m, topk, calls=2, misaligned=True):
    """Outputs of a PreparedMoE launching directly and one on Triton's launcher, same inputs with skipped
    pairs: (direct outputs, plain output, the direct one's launch modes after its calls). misaligned: also
    `calls` calls with x at another alignment."""
    a, offsets, hidden, inter = arena
    fm = ops.ExpertFormats.from_names(names, DEVICE)
    x = torch.randn(m, hidden, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(m, len(names), topk)
    sk = _skip_some(ids)
    fast = ops.PreparedMoE(fm, hidden, inter, DEVICE, direct=True)
    plain = ops.PreparedMoE(fm, hidden, inter, DEVICE, direct=False)
    want = plain(x, sk, wts, a, offsets, backend="triton")
    got = [fast(x, sk, wts, a, offsets, backend="triton").clone() for _ in range(calls)]
    modes = {fast.launch_mode(x, sk, wts, a, offsets, want)}
    if misaligned:     # another specialization: compiled through Triton, then launched directly too
        xm = _misaligned(x)
        got += [fast(xm, sk, wts, a, offsets, backend="triton") for _ in range(calls)]
        modes.add(fast.launch_mode(xm, sk, wts, a, offsets, want))
    return got, want, modes


def test_direct_and_plain_launches_agree(arena):
    # on CPU the interpreter compiles nothing: the fast path assembles the same arguments (fixed ones
    # resolved once, live ones per call) and launches them through the interpreter (the specialization
    # keys: test_kernels_launch.py; another alignment of x: the GPU test below)
    got, want, modes = _both_paths(arena, MIX, m=2, topk=3, misaligned=torch.cuda.is_available())
    assert not want.isnan().any()
    for g in got:
        assert torch.equal(g, want)
    assert modes == ({"direct"} if torch.cuda.is_available() else {"plain"})


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4])
def test_direct_launch_matches_plain_on_the_gpu(m):
    hidden, inter = 1024, 512
    names = ["q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "bf16"] * 4
    a, offsets = make_arena(names, hidden, inter)
    got, want, modes = _both_paths((a, offsets, hidden, inter), names, m, topk=8, calls=3)
    assert modes == {"direct"}, "this Triton's compiled kernels are not launched directly: see strata_plan/kernels/launch.py"
    for g in got:
        assert torch.equal(g, want)


@gpu
@pytest.mark.gpu
def test_direct_launch_is_captured_in_a_cuda_graph():
    # the direct launch runs on torch's current stream: inside a capture, that is the capture stream
    a, offsets, fm, x, ids, wts, out = _gpu_layer()
    ids = _skip_some(ids)
    pm = ops.PreparedMoE(fm, GPU_HIDDEN, GPU_INTER, DEVICE, direct=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                       # warm on the capture stream: compiled, then direct
        for _ in range(2):
            pm(x, ids, wts, a, offsets, out=out)
        assert pm.launch_mode(x, ids, wts, a, offsets, out) == "direct"
    torch.cuda.synchronize()
    want = out.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        pm(x, ids, wts, a, offsets, out=out)
    out.zero_()
    x2 = torch.randn_like(x)
    want2 = ops.PreparedMoE(fm, GPU_HIDDEN, GPU_INTER, DEVICE, direct=False)(x2, ids, wts, a, offsets)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    x.copy_(x2)                                      # the graph reads x's buffer: new input, replay again
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want2)
