"""The Gluon prefill GEMM (strata_plan/kernels/gluon_gemm.py) against the plain-torch reference.

Gluon kernels cannot run in Triton's interpreter, so on a machine without a GPU only three things are
checked: the constants of the PTX that expands a pair of codes (here, by evaluating its logic op in
Python), the PTX that expands the pairs sharing a byte permute (run instruction by instruction in
Python), and that the kernel compiles for sm_90 (tests/test_kernels_compile.py). Everything else needs an
sm_90 GPU (H100/H200) and skips with that reason elsewhere; the same tests then run there.

Tolerance: 2e-2 relative Frobenius norm against the exact reference, as for the Triton GEMM: x and the
dequantized weights are bf16 operands of the MMA (S and M rounded to bf16 first, then q*S - M rounded once:
0.3-1% on these draws). Outputs are poisoned (NaN) before each call, inputs drawn fresh every run.
"""
from __future__ import annotations

import pytest
import torch

from strata_plan.kernels import ops, packed_linear, quantize
from strata_plan.kernels import reference as R
from strata_plan.kernels.triton_common import FORMAT_CODES, format_constants

PACKED = ["q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4", "q4_g128_f16"]
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
hopper = pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100/H200): Gluon's wgmma path")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def _host(f, *args):
    # a triton.constexpr_function called from Python (3.9 wraps it: the plain function is .fn)
    return f.fn(*args) if hasattr(f, "fn") else f(*args)


def _lop3(lut: int, a: int, b: int, c: int) -> int:
    """PTX lop3.b32: bit i of the result is bit (a_i << 2 | b_i << 1 | c_i) of lut (a = 0xF0 etc.)."""
    return sum(((lut >> ((a >> i & 1) << 2 | (b >> i & 1) << 1 | (c >> i & 1))) & 1) << i for i in range(32))


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_pair_expansion_constants(bits):
    # the LOP3 of the pair PTX must give (t & mask) | 0x43004300 for every t (a wrong truth table passed
    # the compiler and gave 1e35-sized outputs on the H200 once)
    pytest.importorskip("triton.experimental.gluon")
    from strata_plan.kernels.gluon_gemm import pair_asm
    asm = _host(pair_asm, bits)
    line = next(s for s in asm.split("\n") if "lop3.b32" in s)
    _, mask, magic, lut = [v.strip().rstrip(";") for v in line.split("lop3.b32")[1].split(",")][1:]
    mask, magic, lut = int(mask, 16), int(magic, 16), int(lut, 16)
    assert mask == ((1 << bits) - 1) * 0x00010001 and magic == 0x43004300
    g = torch.Generator().manual_seed(0)
    for t in torch.randint(0, 2**31 - 1, (64,), generator=g).tolist() + [0, 2**32 - 1]:
        assert _lop3(lut, t, mask, magic) == (t & mask) | magic


def _bf16(bits: int) -> float:
    return torch.tensor([bits & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).item()


def _bf16_bits(v: float) -> int:
    return torch.tensor([v], dtype=torch.float64).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF


def _run_ptx(asm: str, regs: dict) -> dict:
    """The few PTX instructions of the pair expansion, on Python ints: prmt (default mode), shr.u32,
    lop3.b32, fma.rn.bf16x2 (each half rounded once to bf16 from the exact float64 result)."""
    val = lambda a: regs[a] if a in regs else int(a, 0)
    for line in asm.split("\n"):
        line = line.strip().rstrip(";")
        if not line or line[0] in "{}." or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        d, *a = [v.strip() for v in args.split(",")]
        if op == "prmt.b32":
            src = val(a[0]) | val(a[1]) << 32
            regs[d] = sum(((src >> 8 * (val(a[2]) >> 4 * i & 7)) & 0xFF) << 8 * i for i in range(4))
        elif op == "shr.u32":
            regs[d] = val(a[0]) >> val(a[1])
        elif op == "lop3.b32":
            regs[d] = _lop3(val(a[3]), val(a[0]), val(a[1]), val(a[2]))
        elif op == "fma.rn.bf16x2":
            x, y, z = val(a[0]), val(a[1]), val(a[2])
            regs[d] = sum(_bf16_bits(_bf16(x >> s) * _bf16(y >> s) + _bf16(z >> s)) << s for s in (0, 16))
        else:
            raise AssertionError(f"unexpected PTX {op}")
    return regs


@pytest.mark.parametrize("bits", [1, 2])
def test_shared_pair_expansion(bits):
    # pairs_asm run instruction by instruction in Python, with the per-pair constants the kernel computes
    # (_dequant: codes at p = sh mod 4 of the permuted word, the bf16 pairs of 2^-p and -128 2^-p): every
    # pair gives q * S - M for its own two codes (S and M chosen exact in bf16)
    pytest.importorskip("triton.experimental.gluon")
    from strata_plan.kernels import gluon_gemm as gg
    np_ = _host(gg.shared_pairs, bits)
    asm = _host(gg.pairs_asm, np_)
    g = torch.Generator().manual_seed(bits)
    S, M = 0.375, -1.25
    for word in torch.randint(0, 2**31 - 1, (24,), generator=g).tolist() + [0, 2**32 - 1]:
        for c in range(4):                                  # the thread's lane in its quad
            ins, want = {}, {}
            for i in range(np_):                            # pair i: e = i % 2, and at 1-bit t % 2 = i // 2
                e, t = i % 2, i // 2
                kin = (16 * t + 2 * (4 * e + c)) % (32 // bits)
                sh = bits * (kin // 4)
                sel = 0x4140 + 0x101 * (kin % 4)
                p = sh - 4 * (sh >= 4)
                ex = 127 - p
                consts = [word, sel, ((1 << bits) - 1 << p) * 0x10001, (ex << 7) * 0x10001,
                          ((0x100 | ex + 7) << 7) * 0x10001, _bf16_bits(S) * 0x10001, _bf16_bits(-M) * 0x10001]
                for k, v in enumerate(consts):
                    ins[f"${np_ + k * 2 * np_ + 2 * i}"] = v
                b = kin % 4                                 # codes kin, kin + 1: bytes b, b + 1 of lane sh
                want[i] = [((word >> 8 * (b + h)) >> sh) & ((1 << bits) - 1) for h in (0, 1)]
            out = _run_ptx(asm, dict(ins))
            for i in range(np_):
                got = [_bf16(out[f"${i}"] >> s) for s in (0, 16)]
                assert got == [q * S - M for q in want[i]], (word, c, i)


def test_gluon_needs_a_recent_triton(monkeypatch):
    # Gluon's API moves between Triton releases: older ones run the Triton GEMM instead of failing
    import triton
    pytest.importorskip("triton.experimental.gluon")
    ops.gluon_module.cache_clear()
    try:
        assert ops.gluon_module() is not None           # CI's and the GPU machine's Triton (3.9, 3.6)
        ops.gluon_module.cache_clear()
        monkeypatch.setattr(triton, "__version__", "3.5.1")
        assert ops.gluon_module() is None
    finally:
        ops.gluon_module.cache_clear()


def _gluon(x, p, out, **cfg):
    ops.gluon_module().gemm_gluon(x, ops._matrix_args(p), format_constants(FORMAT_CODES.index(p.fmt)), p.n, out,
                                  **cfg)
    return out


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("fmt", [pytest.param(f, marks=pytest.mark.xdist_group(f)) for f in PACKED])
def test_gluon_gemm(fmt):
    # one build per format (M, N, K are not specialized), so the shapes loop inside one test: M in {1, 3,
    # 8, 33, 300}, N not a multiple of the 64-row tile, K = 600 (padded to whole scale units: the padding
    # weights meet TMA's zeros past K), 1024 and 1536
    for n, k in ((40, 600), (200, 1024), (136, 1536)):
        p = quantize(torch.randn(n, k), fmt).to("cuda")
        for m in (1, 3, 8, 33, 300):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            err = rel(_gluon(x, p, out), R.linear(x, p))
            assert err < 2e-2, (m, n, k, err)


@pytest.mark.gpu
@hopper
@pytest.mark.xdist_group("q2_g16_s8m4")
@pytest.mark.parametrize("cfg", [dict(bt=256, ns=3, num_warps=8), dict(bt=128, ns=4, num_warps=4),
                                 dict(bt=256, ns=2, num_warps=4)])
def test_gluon_gemm_configs(cfg):
    p = quantize(torch.randn(200, 1024), "q2_g16_s8m4").to("cuda")
    x = torch.randn(300, 1024, dtype=torch.bfloat16, device="cuda")
    out = torch.full((300, 200), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert rel(_gluon(x, p, out, **cfg), R.linear(x, p)) < 2e-2


@pytest.mark.gpu
@hopper
@pytest.mark.xdist_group("q1_g32_s8m4")
@pytest.mark.parametrize("programs", [3, 4, 5, 13, 64])
def test_gluon_gemm_stream_k(programs):
    # stream-K: 8 tiles of 8 units (two K steps each) shared by `programs` programs: 3 and 5 take a tile
    # and parts of others, 4 exactly two whole tiles (no parts), 13 and 64 parts only (64: one unit each,
    # 8 parts a tile). fp32 parts (poisoned first) are added by the program that runs the tile's head, in
    # program order, which leaves the tile's counter at zero: a second call gives the same bits
    gg = ops.gluon_module()
    p = quantize(torch.randn(200, 1024), "q1_g32_s8m4").to("cuda")
    x = torch.randn(300, 1024, dtype=torch.bfloat16, device="cuda")
    tiles = 4 * 2                                        # cdiv(200, 64) x cdiv(300, 256)
    part = torch.full((gg.part_numel(programs, 256, 4),), float("nan"), device="cuda")
    cnt = torch.zeros(tiles, dtype=torch.int32, device="cuda")
    cfg = dict(bt=256, ns=3, num_warps=4, programs=programs, part=part, cnt=cnt)
    one = _gluon(x, p, torch.full((300, 200), float("nan"), dtype=torch.bfloat16, device="cuda"), **cfg)
    assert rel(one, R.linear(x, p)) < 2e-2 and not cnt.any()
    two = _gluon(x, p, torch.full((300, 200), float("nan"), dtype=torch.bfloat16, device="cuda"), **cfg)
    assert torch.equal(one, two)
    with pytest.raises(ValueError, match="stream-K needs"):
        _gluon(x, p, one, bt=256, ns=3, num_warps=4, programs=programs)


@pytest.mark.gpu
@hopper
@pytest.mark.xdist_group("q1_g32_s8m4")
def test_packed_linear_takes_the_gluon_path(monkeypatch):
    # with gluon in the config and M at least gluon_min_m, packed_linear runs the Gluon kernel (and only
    # then); a strided x (not what TMA can read) goes to the Triton GEMM
    gluon_gemm = ops.gluon_module()
    calls = []
    real = gluon_gemm.gemm_gluon
    monkeypatch.setattr(gluon_gemm, "gemm_gluon", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    p = quantize(torch.randn(136, 1536), "q1_g32_s8m4").to("cuda")
    cfg = {"gluon": True, "gluon_min_m": 65, "gluon_tokens": 256, "gluon_stages": 3, "gluon_warps": 4,
           "gluon_split": 1, "gluon_warps8_min_m": 1 << 62}
    x = torch.randn(100, 1536, dtype=torch.bfloat16, device="cuda")
    assert rel(packed_linear(x, p, config=cfg), R.linear(x, p)) < 2e-2 and len(calls) == 1
    assert rel(packed_linear(x[:40], p, config=cfg), R.linear(x[:40], p)) < 2e-2 and len(calls) == 1
    wide = torch.randn(100, 1540, dtype=torch.bfloat16, device="cuda")[:, :1536]      # rows not 16-byte aligned
    assert rel(packed_linear(wide, p, config=cfg), R.linear(wide, p)) < 2e-2 and len(calls) == 1
    # gluon_split: 3 x 1 tiles leave SMs idle, so the K is split (4 ways here: 12 programs of 3 units)
    assert rel(packed_linear(x, p, config={**cfg, "gluon_split": 4}), R.linear(x, p)) < 2e-2 and len(calls) == 2
