"""The quantizer and the expert blob packer (plain torch, CPU): layouts, round trips, the quality bar."""
from __future__ import annotations

import importlib

import pytest
import torch

from strata_plan.kernels import PackedMatrix, dequantize, pack_expert, quantize, unpack_expert
from strata_plan.kernels.formats import FORMATS, expert_layout
from strata_plan.kernels.quality import BASELINES, error_table
from strata_plan.kernels.quantizer import fit_groups, group_params, pack_bits, pack_nibbles, unpack_bits, unpack_nibbles
from strata_plan.kernels.reference import relative_output_error, rtn_minmax

PACKED = [f for f in FORMATS if not FORMATS[f].is_bf16]


def test_public_names_are_the_functions():
    import strata_plan.kernels as K
    importlib.import_module("strata_plan.kernels.quantizer")   # importing it must not shadow the function
    assert callable(K.quantize) and callable(K.dequantize) and callable(K.packed_linear) and callable(K.fused_moe)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_segments_match_the_format_layout(fmt):
    n, k = 37, 700                                   # k not a multiple of any group or super-block
    p = quantize(torch.randn(n, k), fmt)
    segs = FORMATS[fmt].segments(n, k)
    assert [s[0] for s in segs] == list(p.segments)
    for name, dtype, shape, nbytes in segs:
        t = p.segments[name]
        assert tuple(t.shape) == shape and str(t.dtype) == f"torch.{dtype}" and t.numel() * t.element_size() == nbytes
    assert p.nbytes == FORMATS[fmt].matrix_bytes(n, k)
    assert dequantize(p).shape == (n, k)


def test_bit_packing_round_trips():
    for bits in (1, 2, 4):
        q = torch.randint(0, 1 << bits, (5, 64), dtype=torch.uint8)
        b = pack_bits(q, bits)
        assert b.shape == (5, 64 * bits // 8)
        assert torch.equal(unpack_bits(b, bits), q)
    # 32-bit words, little end first: code 4*s + j of a word in byte j, bits s*bits .. (lane s)
    q = torch.zeros(1, 16, dtype=torch.uint8)
    q[0, 0], q[0, 1], q[0, 4], q[0, 15] = 1, 2, 3, 3
    assert pack_bits(q, 2).tolist() == [[0x1 | 0x3 << 2, 0x2, 0x0, 0x3 << 6]]
    # two 4-bit mins a byte, the lower-numbered in the low nibble
    v = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    assert pack_nibbles(v).tolist() == [[0x21, 0x0F]] and torch.equal(unpack_nibbles(pack_nibbles(v)), v)


def test_a_representable_q4_matrix_comes_back_exactly():
    # each group holds codes 0 and 15, so min/max round-to-nearest recovers S and M exactly
    n, k, g = 8, 256, 128
    q = torch.randint(0, 16, (n, k // g, g))
    q[..., 0], q[..., 1] = 0, 15
    S = (torch.rand(n, k // g, 1) * 0.1 + 0.01).half().float()
    M = (torch.rand(n, k // g, 1) * 0.5).half().float()
    w = (S * q - M).reshape(n, k)
    back = dequantize(quantize(w, "q4_g128_f16"))
    assert (back - w).abs().max() <= 1e-3 * w.abs().max()


def test_fit_groups_is_never_worse_than_min_max_rounding():
    w = torch.randn(64, 32, 16) ** 3                 # skewed, heavy-tailed groups
    imp = torch.ones(16)
    for levels in (1, 3, 15):
        s, z, q, err = fit_groups(w, imp, levels)
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        sr = (hi - lo) / levels
        qr = torch.round((w - lo) / sr).clamp(0, levels)
        rtn_err = ((sr * qr + lo - w) ** 2).sum(-1)
        assert (err <= rtn_err * (1 + 1e-5) + 1e-12).all()
        assert torch.allclose(err, ((s.unsqueeze(-1) * q + z.unsqueeze(-1) - w) ** 2).sum(-1), rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("fmt", PACKED)
def test_quality_bar_against_round_to_nearest(fmt):
    # fresh weights each run; the margins (see KERNELS.md) are far wider than the run-to-run spread
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    for row in error_table(n=96, k=1024, seed=seed, n_act=32, formats=(fmt,)):
        assert row.passes, f"seed {seed}: {row}"
        # the int8 activation grid of the decode kernels adds little next to the weights' own error
        assert row.decode_error <= row.error * 1.05 + 2e-3, f"seed {seed}: {row}"


def test_importance_spends_precision_where_activations_are_large():
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    n, k = 64, 1024
    w = torch.randn(n, k, generator=g)
    scale = torch.ones(k)
    scale[torch.randperm(k, generator=g)[: k // 16]] = 30.0      # a few loud input features
    x = torch.randn(256, k, generator=g) * scale
    imp = (x ** 2).mean(0)
    for fmt in ("q2_g32_s8m8", "q1_g32_s8m4"):
        plain = relative_output_error(w, dequantize(quantize(w, fmt)), x)
        weighted = relative_output_error(w, dequantize(quantize(w, fmt, importance=imp)), x)
        assert weighted < 0.9 * plain, (fmt, weighted, plain)


def test_group_params_reproduce_dequantize():
    p = quantize(torch.randn(16, 1024), "q2_g16_s8m4")
    S, M = group_params(p)
    q = unpack_bits(p.rows("codes"), 2).float().view(16, -1, 16)
    assert torch.allclose((S.unsqueeze(-1) * q - M.unsqueeze(-1)).reshape(16, -1), dequantize(p))


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_expert_blob_round_trip(fmt):
    h, i = 96, 80
    gate, up, down = torch.randn(i, h), torch.randn(i, h), torch.randn(h, i)
    blob = pack_expert(gate, up, down, fmt)
    layout = expert_layout(fmt, h, i)
    assert blob.dtype == torch.uint8 and blob.numel() == layout.nbytes
    mats = unpack_expert(blob, fmt, h, i)
    lo, hi = blob.data_ptr(), blob.data_ptr() + blob.numel()
    for name, w in (("gate", gate), ("up", up), ("down", down)):
        m = mats[name]
        assert (m.n, m.k) == w.shape
        for t in m.segments.values():                 # views into the blob, not copies
            assert lo <= t.data_ptr() < hi
        assert torch.equal(dequantize(m), dequantize(quantize(w, fmt)))
    # the bytes between segments and past the payload are zero
    used = torch.zeros(layout.nbytes, dtype=torch.bool)
    for s in layout.segments:
        used[s.offset:s.offset + s.nbytes] = True
    assert not blob[~used].any()


def test_expert_importance_per_matrix():
    h, i = 64, 64
    gate, up, down = torch.randn(i, h), torch.randn(i, h), torch.randn(h, i)
    imp_h = torch.rand(h)
    a = pack_expert(gate, up, down, "q2_g32_s8m8", importance=imp_h)
    b = pack_expert(gate, up, down, "q2_g32_s8m8", importance={"gate": imp_h, "up": imp_h})
    assert torch.equal(a, b)


def test_bad_inputs_are_refused():
    w = torch.randn(8, 64)
    with pytest.raises(KeyError, match="unknown packed format"):
        quantize(w, "q3_nope")
    with pytest.raises(ValueError, match="importance must have shape"):
        quantize(w, "q2_g16_s8m4", importance=torch.ones(63))
    with pytest.raises(ValueError, match=">= 0"):
        quantize(w, "q2_g16_s8m4", importance=-torch.ones(64))
    with pytest.raises(ValueError, match="NaN"):
        quantize(torch.full((2, 64), float("nan")), "q2_g16_s8m4")
    with pytest.raises(ValueError, match="2-D float"):
        quantize(torch.ones(64), "q2_g16_s8m4")
    p = quantize(w, "q2_g16_s8m4")
    with pytest.raises(ValueError, match="codes"):
        PackedMatrix("q2_g16_s8m4", 8, 64, codes=p.codes[:, :-1], scales=p.scales, mins=p.mins, d=p.d, dmin=p.dmin)
    with pytest.raises(ValueError, match="gate, up"):
        pack_expert(torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8), "bf16")
    with pytest.raises(ValueError, match="uint8 blob"):
        unpack_expert(torch.zeros(10, dtype=torch.uint8), "q2_g16_s8m4", 64, 64)


def test_baselines_are_the_nearest_lower_bit_rates():
    for fmt, (bits, group) in BASELINES.items():
        assert bits + 32 / group <= FORMATS[fmt].bpw
        assert rtn_minmax(torch.randn(4, 2 * group), bits, group).shape == (4, 2 * group)
