"""The Triton kernels against the plain-torch references.

Runs on CUDA where there is a GPU, else through Triton's interpreter on CPU (strata_plan.kernels sets
TRITON_INTERPRET=1 when no GPU is present; shapes are kept small for it). Every input is drawn fresh each
run, every output and every scratch buffer (`poison_scratch` below) is poisoned before the call.

Tolerances (relative Frobenius norm of the difference):
- decode GEMV vs `reference.linear_q8` on the kernel's own int8 activation grid (float64): 3e-5 with
  float32 output (only the order of float32 sums differs); vs the reference's grid with bf16 output 8e-3
  (bf16 keeps 8 significant bits: rounding alone is ~2e-3; a grid step moved by a differently rounded
  127 / max|x| adds ~1e-3).
- decode kernels vs the exact reference (float activations): 4e-2, since the int8 activations add
  0.5-2% error (KERNELS.md's table; tiny next to the 9-60% of the weights themselves).
- tensor-core GEMM vs the exact reference: 2e-2: x and the dequantized weights are rounded to bf16.
- MoE decode, each launch on its own (`ops.moe_gate_up`, `ops.moe_down`) against the reference on the
  kernel's own int8 grids: h within half a grid step (+ float32 noise); the output to 1e-4 (float32).
- MoE decode end to end vs `reference.moe(q8=True)`: 3e-2 (single formats: or 1.5x the draw's own grid
  error vs the exact MoE, which reaches 5.5% for q4 at 96 x 160): the reference draws its own grid for h, and
  at these small sizes one rounding step of one large h moves the output by up to ~1.5%; vs the exact
  MoE 6e-2 (two int8 grids).
- MoE prefill (grouped GEMMs) vs the exact MoE: 3e-2 (bf16 operands, h stored as bf16).
"""
from __future__ import annotations

import zlib

import pytest
import torch

from strata_plan.kernels import fused_moe, ops, pack_expert, packed_linear, quantize, unpack_expert
from strata_plan.kernels import reference as R
from strata_plan.kernels.formats import FORMATS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter evaluates both sides of tl.where(max > 0, 127 / max, 0)
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ALL = list(FORMATS)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def garbage(t: torch.Tensor) -> torch.Tensor:
    """t filled with NaN (floating point) or 0x7F7F7F7F (integers), in place."""
    return t.fill_(float("nan") if t.dtype.is_floating_point else 0x7F7F7F7F)


def poisoned_scratch(*shape: int, dtype: torch.dtype, device) -> torch.Tensor:
    """`ops.scratch`, its buffer filled with garbage."""
    return garbage(torch.empty(shape, dtype=dtype, device=device))


def poison_moe_scratch(sc: ops.MoEScratch) -> None:
    """`ops.use_scratch`: garbage in every buffer of a decode call's scratch but its counters (which every
    kernel leaves at zero, and the next one needs so)."""
    for name, t in vars(sc).items():
        if name not in ("cnt1", "cnt2"):
            garbage(t)


@pytest.fixture(autouse=True)
def poison_scratch(monkeypatch):
    """Every scratch buffer holds garbage when the kernels get it, fresh or cached (ops' two seams), so a
    kernel that reads an element it did not write shows it in the result."""
    monkeypatch.setattr(ops, "scratch", poisoned_scratch)
    monkeypatch.setattr(ops, "use_scratch", poison_moe_scratch)


def nan_like(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


# --------------------------------------------------------------------------------------- packed_linear

@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("m", [1, 3, 8, 33])
def test_packed_linear(fmt, m):
    n, k = 40, 600                                   # neither a multiple of the row tile nor of a K unit
    torch.manual_seed(zlib.crc32(f"{fmt}-{m}".encode()))   # one draw a case: 1 in 60 unseeded q4_g128_f16 m=1 draws
    p = quantize(torch.randn(n, k), fmt).to(DEVICE)         # exceeds the 4e-2 bound against `exact` (rel up to 0.046)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=DEVICE)
    out = packed_linear(x, p, out=nan_like((m, n), torch.bfloat16), backend="triton")
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    exact = R.linear(x, p)
    if m <= ops.GEMV_MAX_M:
        assert rel(out, R.linear_q8(x, p)) < 8e-3
        assert rel(out, exact) < 4e-2
    else:
        assert rel(out, exact) < 2e-2


@pytest.mark.parametrize("fmt", [f for f in ALL if f != "bf16"])
def test_gemv_is_the_int8_grid_arithmetic_exactly(fmt):
    n, k = 24, 1100
    p = quantize(torch.randn(n, k), fmt).to(DEVICE)
    x = torch.randn(3, k, device=DEVICE)
    # phase A: the kernel's int8 grid is the reference's, up to a rounding step where 127 / max|x| is
    # divided differently (GPU division, the interpreter's numpy); the block scales agree to an ulp
    xq, xdx, xsum = ops.pack_activations(x, p.kp)
    x8 = R.unpack_activation_words(xq, p.kp)
    x8_ref, dx_ref = R.quantize_activations(x, p.kp)
    assert (x8 - x8_ref.to(DEVICE)).abs().max() <= 1 and (x8 != x8_ref.to(DEVICE)).float().mean() < 0.01
    assert rel(xdx, dx_ref) < 1e-6
    xp = torch.zeros(3, p.kp, device=DEVICE)
    xp[:, :k] = x
    s16, s32 = xsum[:, :p.kp // 16], xsum[:, p.kp // 16:]          # exact sums per 16, then per 32 inputs
    assert rel(s16, xp.view(3, -1, 16).sum(-1)) < 1e-6 and rel(s32, xp.view(3, -1, 32).sum(-1)) < 1e-6
    # phase B: on that grid the GEMV is exact up to the order of float32 sums
    out = packed_linear(x, p, out=nan_like((3, n), torch.float32), backend="triton")
    assert rel(out, R.linear_q8(x, p, grid=(x8, xdx))) < 3e-5


@pytest.mark.parametrize("chunk", [256, 1024, 2048])
def test_phase_a_rows_that_are_not_whole_chunks(chunk):
    # 1632 = 51 blocks of 32: whole chunks, then the rest in halving pieces down to one block of 32
    kp, k = 1632, 1600
    x = torch.randn(2, k, device=DEVICE) * torch.rand(2, k, device=DEVICE) ** 4 * 10      # uneven block scales
    xq, xdx, xsum = ops.pack_activations(x, kp, chunk)
    x8 = R.unpack_activation_words(xq, kp)
    x8_ref, dx_ref = R.quantize_activations(x, kp)
    # the same rounding caveat as above: a step apart where 127 / max|x| divides differently
    assert (x8 - x8_ref.to(DEVICE)).abs().max() <= 1 and (x8 != x8_ref.to(DEVICE)).float().mean() < 0.01
    assert rel(xdx, dx_ref) < 1e-6
    xp = torch.zeros(2, kp, device=DEVICE)
    xp[:, :k] = x
    assert rel(xsum[:, :kp // 16], xp.view(2, -1, 16).sum(-1)) < 1e-6
    assert rel(xsum[:, kp // 16:], xp.view(2, -1, 32).sum(-1)) < 1e-6


def test_gemv_split_k_and_one_split_agree():
    p = quantize(torch.randn(50, 2048), "q2_g16_s8m4").to(DEVICE)
    x = torch.randn(2, 2048, device=DEVICE)
    one = packed_linear(x, p, backend="triton", config={"split": 1})
    four = packed_linear(x, p, backend="triton", config={"split": 4})
    assert rel(four, one) < 1e-6 and rel(one, R.linear_q8(x, p)) < 1e-5
    # the last program of each row tile adds the parts in a fixed order and resets its counter
    again = packed_linear(x, p, backend="triton", config={"split": 4})
    assert torch.equal(again, four)


def test_packed_linear_refuses_bad_shapes():
    p = quantize(torch.randn(8, 64), "q2_g16_s8m4").to(DEVICE)
    with pytest.raises(ValueError, match=r"\[M, 64\]"):
        packed_linear(torch.randn(2, 63, device=DEVICE), p)
    with pytest.raises(ValueError, match="out must be"):
        packed_linear(torch.randn(2, 64, device=DEVICE), p, out=torch.empty(2, 7, device=DEVICE))


def test_gemv_code_generation_candidates():
    # the GEMV's K loop with the shipped CG options (1: the DP4A chain in one PTX block, GPU only; 2: rows
    # past N clamped) and a register cap, and with none (rows masked: what the portable defaults run)
    p = quantize(torch.randn(77, 1100), "q1_g32_s8m4").to(DEVICE)
    x = torch.randn(2, 1100, device=DEVICE)
    cfg = ops.config_for("gemv", p.fmt, 2, p.n, p.k, DEVICE)
    plain = packed_linear(x, p, backend="triton", config=cfg)
    assert rel(packed_linear(x, p, backend="triton", config={"dp4a_block": True, "clamp_rows": True, "max_registers": 96}), plain) < 1e-5
    assert rel(packed_linear(x, p, backend="triton", config={"dp4a_block": False, "clamp_rows": False}), plain) < 1e-5   # masked rows


def test_torch_backend_is_the_reference():
    p = quantize(torch.randn(8, 64), "q1_g32_s8m4")
    x = torch.randn(2, 64)
    assert torch.allclose(packed_linear(x, p, backend="torch"), R.linear(x, p))


# ------------------------------------------------------------------------------------------- fused_moe

def make_arena(formats, hidden, inter, scale=0.1):
    """Experts in the given formats laid out in one arena at 4 KiB-multiple offsets (fresh weights)."""
    w = lambda n, k: torch.randn(n, k, device=DEVICE) * scale      # noqa: E731 -- quantized where they live
    blobs = [pack_expert(w(inter, hidden), w(inter, hidden), w(hidden, inter), f) for f in formats]
    offsets, off = [], 0
    for b in blobs:
        offsets.append(off)
        off += b.numel()
    return torch.cat(blobs), torch.tensor(offsets, dtype=torch.int64, device=DEVICE)


MIX = ["q2_g16_s8m4", "q1_g32_s8m4", "q2_g32_s8m8", "q4_g128_f16", "bf16", "q1_g32_s8m4"]


@pytest.fixture(scope="module")
def mixed_arena():
    hidden, inter = 200, 150                          # neither a multiple of a row tile nor of a K unit
    arena, offsets = make_arena(MIX, hidden, inter)
    return arena, offsets, hidden, inter


def route(m, n_experts, topk):
    ids = torch.stack([torch.randperm(n_experts)[:topk] for _ in range(m)]).to(DEVICE)
    wts = torch.softmax(torch.randn(m, topk), -1).to(DEVICE)
    return ids, wts


@pytest.mark.parametrize("m", [1, 3, 8, 33])
def test_fused_moe_any_mix(mixed_arena, m):
    arena, offsets, hidden, inter = mixed_arena
    x = torch.randn(m, hidden, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(m, len(MIX), 3)
    out = fused_moe(x, ids, wts, arena, offsets, MIX, hidden, inter, out=nan_like((m, hidden), torch.bfloat16),
                    backend="triton")
    assert not out.isnan().any()
    exact = R.moe(x, ids, wts, arena, offsets, MIX, hidden, inter)
    if m <= ops.MOE_DECODE_MAX_M:
        assert rel(out, R.moe(x, ids, wts, arena, offsets, MIX, hidden, inter, q8=True)) < 3e-2
        assert rel(out, exact) < 6e-2
    else:
        assert rel(out, exact) < 3e-2


@pytest.mark.parametrize("fmt", ALL)
def test_fused_moe_single_format(fmt):
    hidden, inter = 96, 160
    arena, offsets = make_arena([fmt] * 4, hidden, inter)
    x = torch.randn(2, hidden, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(2, 4, 2)
    out = fused_moe(x, ids, wts, arena, offsets, fmt, hidden, inter, out=nan_like((2, hidden), torch.bfloat16),
                    backend="triton")
    ref_q8 = R.moe(x, ids, wts, arena, offsets, fmt, hidden, inter, q8=True)
    # kernel and reference share x's int8 grid but each rounds its own h to a grid: at these tiny shapes
    # that grid alone moves the output by 1.7-5.5% from the exact MoE (q4 worst; 40 draws on CPU), so the
    # bound is the larger of 3e-2 and 1.5x this draw's own grid error (a wrong scale term is far above)
    grid_err = rel(ref_q8, R.moe(x, ids, wts, arena, offsets, fmt, hidden, inter))
    assert rel(out, ref_q8) < max(3e-2, 1.5 * grid_err)


@pytest.mark.parametrize("m", [1, 3])
def test_moe_launches_on_their_own_grids(mixed_arena, m):
    arena, offsets, hidden, inter = mixed_arena
    check_moe_launches(arena, offsets, hidden, inter, m, rows1=32)


def test_moe_launches_with_k_splits():
    # K split over programs in both launches (the last program of a row tile adds the parts): rows of
    # 1100 and 520 inputs are 3 and 2 units of 512, so SPLIT2=5 also checks that asking for more splits
    # than units clamps; padding past H and I inside the last unit
    hidden, inter = 1100, 520
    split1, split2 = 3, 5
    arena, offsets = make_arena(MIX, hidden, inter)
    check_moe_launches(arena, offsets, hidden, inter, 1, split1=split1, split2=split2, chunk=256)
    # the counters are back at zero after a call, and the parts are added in a fixed order
    cfg = {"split1": split1, "split2": split2}
    x = torch.randn(1, hidden, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(1, len(MIX), 3)
    a = fused_moe(x, ids, wts, arena, offsets, MIX, hidden, inter, backend="triton", config=cfg)
    b = fused_moe(x, ids, wts, arena, offsets, MIX, hidden, inter, backend="triton", config=cfg)
    assert torch.equal(a, b)


def test_moe_launches_with_code_generation_candidates(mixed_arena):
    # CG: the K loop's shipped code-generation options (triton_common.gemv_rows: 1 the DP4A chain in one
    # PTX block, GPU only; 2 rows past N clamped instead of masked) with register caps, checked launch by
    # launch on the kernels' own grids like the portable defaults
    arena, offsets, hidden, inter = mixed_arena
    check_moe_launches(arena, offsets, hidden, inter, 3, dp4a_block1=True, clamp_rows1=True,
                       dp4a_block2=True, clamp_rows2=True, max_registers1=128, max_registers2=72, rows1=32, rows2=32)


def check_moe_launches(arena, offsets, hidden, inter, m, **overrides):
    fm = ops.ExpertFormats.from_names(MIX, DEVICE)
    cfg = overrides
    x = torch.randn(m, hidden, device=DEVICE)
    ids, wts = route(m, len(MIX), 3)
    sc = ops.moe_gate_up(x, ids, arena, offsets, fm, hidden, inter, cfg, fresh=True)
    hp, ip = sc.xq.shape[1] * 4, sc.hq.shape[1] * 4
    silu = torch.nn.functional.silu
    ref = torch.zeros(m, hidden, dtype=torch.float64)
    for t in range(m):
        for j in range(ids.shape[1]):
            p_, e = t * ids.shape[1] + j, int(ids[t, j])
            fmt = MIX[e]
            mats = unpack_expert(arena[int(offsets[e]):], fmt, hidden, inter)
            xt = x[t:t + 1]
            if fmt == "bf16":
                h = silu(R.linear_q8(xt, mats["gate"])) * R.linear_q8(xt, mats["up"])
                assert rel(sc.hf[p_, :inter], h[0]) < 1e-5
                y = R.linear_q8(sc.hf[p_:p_ + 1, :inter], mats["down"])
            else:
                grid = (R.unpack_activation_words(sc.xq[t][None], hp), sc.xdx[t:t + 1])
                h = silu(R.linear_q8(xt, mats["gate"], grid)) * R.linear_q8(xt, mats["up"], grid)   # [1, I] f64
                h8 = R.unpack_activation_words(sc.hq[p_][None], ip)
                step = sc.hdx[p_].repeat_interleave(32)[None].double()
                assert (h8[:, inter:] == 0).all()                     # padding rows of h are zeros
                # within half a grid step of the float64 h, plus float32 noise (sum order, fast sigmoid)
                assert ((h8[:, :inter] * step[:, :inter] - h).abs() <= 0.5 * step[:, :inter] * 1.001
                        + 1e-5 * h.abs().max()).all()
                y = R.linear_q8(h.float(), mats["down"], (h8, sc.hdx[p_:p_ + 1]))
            ref[t] += float(wts[t, j]) * y[0].cpu()
    out = nan_like((m, hidden), torch.float32)
    ops.moe_down(sc, ids, wts, arena, offsets, fm, hidden, inter, out, cfg)
    assert rel(out, ref) < 1e-4


def test_fused_moe_repeated_calls_and_format_codes(mixed_arena):
    # the down kernel's counters must be back at zero after every call; formats may come as ExpertFormats
    arena, offsets, hidden, inter = mixed_arena
    fm = ops.ExpertFormats.from_names(MIX, DEVICE)
    x = torch.randn(2, hidden, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(2, len(MIX), 2)
    a = fused_moe(x, ids, wts, arena, offsets, fm, hidden, inter, backend="triton")
    b = fused_moe(x, ids, wts, arena, offsets, MIX, hidden, inter, backend="triton")
    assert torch.equal(a, b)                         # deterministic: parts are summed in a fixed order


def test_fused_moe_refuses_bad_arguments(mixed_arena):
    arena, offsets, hidden, inter = mixed_arena
    x = torch.randn(2, hidden, device=DEVICE)
    ids, wts = route(2, len(MIX), 2)
    with pytest.raises(ValueError, match="hidden=200"):
        fused_moe(x[:, :-1], ids, wts, arena, offsets, MIX, hidden, inter)
    with pytest.raises(ValueError, match="topk_weights"):
        fused_moe(x, ids, wts[:, :1], arena, offsets, MIX, hidden, inter)
    with pytest.raises(ValueError, match="formats for"):
        fused_moe(x, ids, wts, arena, offsets, MIX[:-1], hidden, inter)
    with pytest.raises(ValueError, match="int64"):
        fused_moe(x, ids, wts, arena, offsets.to(torch.int32), MIX, hidden, inter)


# ------------------------------------------------------------------------------------------ GPU only

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 64])     # 64: the grouped path (no host sync while it sorts the pairs)
def test_fused_moe_in_a_cuda_graph(m):
    hidden, inter = 1024, 512
    arena, offsets = make_arena(["q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "q1_g32_s8m4"], hidden, inter)
    fmt = ops.ExpertFormats.from_names(["q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "q1_g32_s8m4"], DEVICE)
    x = torch.randn(m, hidden, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(m, 4, 4)
    eager = fused_moe(x, ids, wts, arena, offsets, fmt, hidden, inter)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, ids, wts, arena, offsets, fmt, hidden, inter)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert rel(out, fused_moe(x, ids, wts, arena, offsets, fmt, hidden, inter)) < 1e-6
    assert not torch.equal(out, eager)


@gpu
@pytest.mark.gpu
def test_kimi_expert_shape_layer():
    # one real-size layer (hidden 7168, intermediate 2048: Kimi-K2) against the q8 reference
    hidden, inter = 7168, 2048
    mix = ["q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4"] * 3
    arena, offsets = make_arena(mix, hidden, inter, scale=0.02)
    x = torch.randn(2, hidden, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(2, len(mix), 8)
    out = fused_moe(x, ids, wts, arena, offsets, mix, hidden, inter)
    assert rel(out, R.moe(x, ids, wts, arena, offsets, mix, hidden, inter, q8=True)) < 1e-2


def test_fused_moe_prefill_bf16_pair_dequantization(mixed_arena):
    # the grouped MoE prefill kernels with DQ=1 (see the GEMM test below for the rounding; here two
    # matrices in a row and h stored as bf16 between them: 0.7-1.0% apart over 4 draws, 1.3-1.5% from the
    # exact MoE against 1.0-1.2% for the float32 path)
    arena, offsets, hidden, inter = mixed_arena
    m = ops.MOE_DECODE_MAX_M + 5
    x = torch.randn(m, hidden, dtype=torch.bfloat16, device=DEVICE)
    ids, wts = route(m, len(MIX), 3)
    f32 = fused_moe(x, ids, wts, arena, offsets, MIX, hidden, inter, backend="triton",
                    config={"bf16x2_dequant": False, "prefetch_scales": False})
    pairs = fused_moe(x, ids, wts, arena, offsets, MIX, hidden, inter, backend="triton",
                      config={"bf16x2_dequant": True, "prefetch_scales": False})
    assert rel(pairs, f32) < 2e-2 and rel(pairs, R.moe(x, ids, wts, arena, offsets, MIX, hidden, inter)) < 3e-2
    # PFM=1 loads each K tile's scale bytes a step ahead: the same bytes reach the same arithmetic, so
    # the output equals PFM=0's bit for bit (as the GEMM's, `test_gemm_scale_prefetch_is_exact`)
    ahead = fused_moe(x, ids, wts, arena, offsets, MIX, hidden, inter, backend="triton",
                      config={"bf16x2_dequant": True, "prefetch_scales": True})
    assert torch.equal(ahead, pairs)


@pytest.mark.parametrize("fmt", [f for f in ALL if f != "bf16"])
def test_gemm_bf16_pair_dequantization(fmt):
    # DQ=1: two codes a register as bf16 128 + q, then bf16x2 FMAs with S and -M rounded to bf16 (inline
    # PTX on the GPU, its float32 emulation here). Against the float32 path: both end in bf16 weights;
    # S and M rounded to bf16 first add one more bf16 rounding (2^-9 relative) of S*q and of M, shared by
    # a group (so it does not average out): 3-7e-3 apart over 8 draws here (q4's fp16 M the most), and
    # 0.7-1.0% from the exact product against the float32 path's 0.6% (bf16 x and weights alone)
    n, k, m = 72, 1100, 33
    p = quantize(torch.randn(n, k), fmt).to(DEVICE)
    x = torch.randn(m, k, device=DEVICE)
    f32 = packed_linear(x, p, out=nan_like((m, n), torch.float32), backend="triton",
                        config={"bf16x2_dequant": False, "gluon": False})
    pairs = packed_linear(x, p, out=nan_like((m, n), torch.float32), backend="triton",
                          config={"bf16x2_dequant": True, "gluon": False})
    assert rel(pairs, f32) < 1.5e-2 and rel(pairs, R.linear(x, p)) < 2e-2


@pytest.mark.parametrize("fmt", ALL)
def test_gemm_scale_prefetch_is_exact(fmt):
    # PFM=1 loads each K tile's scale bytes a step ahead (the last tile's twice at the end): the same
    # bytes reach the same arithmetic, so the output must equal PFM=0's bit for bit, on both DQ paths
    n, k, m = 40, 1100, 17
    p = quantize(torch.randn(n, k), fmt).to(DEVICE)
    x = torch.randn(m, k, device=DEVICE)
    for dq in ((0, 1) if fmt != "bf16" else (0,)):
        outs = [packed_linear(x, p, out=nan_like((m, n), torch.float32), backend="triton",
                              config={"bf16x2_dequant": bool(dq), "prefetch_scales": bool(pf), "gluon": False})
                for pf in (0, 1)]
        assert torch.equal(outs[0], outs[1]), (fmt, dq)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m,bm", [(512, 128), (2048, 128), (2048, 256)])
def test_prefill_gemm_real_shape(m, bm):
    # bm 256: two warpgroups share each dequantized weight tile (a benchmark sweep candidate)
    p = quantize(torch.randn(3584, 7168, device=DEVICE) * 0.02, "q2_g16_s8m4")
    x = torch.randn(m, 7168, dtype=torch.bfloat16, device=DEVICE)
    cfg = dict(block_m=bm, warps=8 if bm == 256 else 4, stages=3, gluon=False, bf16x2_dequant=False,
               prefetch_scales=False)
    ref = R.linear(x, p)
    assert rel(packed_linear(x, p, config=cfg), ref) < 2e-2
    assert rel(packed_linear(x, p, config={**cfg, "bf16x2_dequant": True}), ref) < 2e-2   # bf16x2 dequantization
    assert rel(packed_linear(x, p, config={**cfg, "bf16x2_dequant": True, "prefetch_scales": True}), ref) < 2e-2


@pytest.mark.gpu
@gpu
def test_sustained_timing_agrees_with_bursts():
    # back to back the clock may fall (power limit), so the call may be slower, never much faster, than in
    # bursts: same work, same kernel; the clock and power come from NVML when it is there
    from strata_plan.kernels import bench as B
    a = torch.randn(2048, 2048, device=DEVICE, dtype=torch.bfloat16)
    burst = B.graph_ms(lambda: torch.matmul(a, a), reps=10)
    run = B.sustained(lambda: torch.matmul(a, a), seconds=0.8)
    assert 0.7 * burst < run["ms"] < 3 * burst, (burst, run)
    try:
        import pynvml
        pynvml.nvmlInit()
        nvml = True
    except Exception:                                   # noqa: BLE001 -- no NVML here: no clocks expected
        nvml = False
    assert (run["sm_mhz"] > 0 and run["watts"] > 0) if nvml else run["sm_mhz"] is None
