"""Quantizer: float weights to the packed formats of `formats.py`, and the plain-torch way back.

    quantize(w [N, K], fmt, importance [K] | None, rtn=False) -> PackedMatrix     (rtn: the min/max baseline)
    dequantize(p) -> float32 [N, K]
    pack_expert(gate, up, down, fmt) -> one uint8 expert blob, exactly expert_layout(...).nbytes long
    unpack_expert(blob, fmt, hidden, intermediate) -> {"gate"|"up"|"down": PackedMatrix}, views into blob

Every format stores w = S * q - M per group of weights along K, q in [0, 2^bits - 1]. The fit, per group:
  1. candidate grids (round-to-nearest over min..max, stretched and shrunk), each refitted by weighted
     least squares for (S, M) given its codes; the best is refined by alternating rounding and refitting
     (Lloyd's algorithm on a uniform grid; for 1 bit it is exactly 2-means);
  2. the group's S and M are stored: as fp16 (q4_g128_f16), or as unsigned 8/4-bit multiples of fp16
     super-block scales d and dmin (the other formats). That step is refined too: codes are re-rounded
     against the stored S and M, (S, M) refitted and re-quantized, and (d, dmin) refitted by least
     squares over the super-block; each super-block keeps whichever round had the lowest error.
`importance` (e.g. the mean square of each input feature's activations) weights every squared error, so
the fit spends its precision where activations are large. Plain round-to-nearest with min/max scales is
always one of the candidates, so for equal storage the result is never worse than it in weighted error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from .formats import MATRICES, PackedFormat, expert_layout, get_format, matrix_shapes

_DTYPES = {"uint8": torch.uint8, "float16": torch.float16, "bfloat16": torch.bfloat16}
_SEG_NAMES = ("codes", "scales", "mins", "d", "dmin", "weight")
_ROW_CHUNK = 512          # rows quantized at once; bounds the temporaries to a few hundred MB at K = 7168


@dataclass(frozen=True, eq=False)
class PackedMatrix:
    """One packed [n, k] weight matrix: its stored tensors, exactly as `formats.py` lays them out."""

    fmt: str
    n: int
    k: int
    codes: torch.Tensor | None = None     # uint8 [nu, n, unit * bits / 8]   (unit-major: formats.py)
    scales: torch.Tensor | None = None    # uint8 or fp16 [nu, n, unit / group]
    mins: torch.Tensor | None = None      # uint8 [nu, n, unit / group] (or / 2 for 4-bit mins) or fp16
    d: torch.Tensor | None = None         # fp16 [nu, n, 1]
    dmin: torch.Tensor | None = None      # fp16 [nu, n, 1]
    weight: torch.Tensor | None = None    # bf16 [n, k], the bf16 format only

    def __post_init__(self) -> None:
        expected = {name: (dtype, shape) for name, dtype, shape, _ in self.format.segments(self.n, self.k)}
        for name in _SEG_NAMES:
            t = getattr(self, name)
            if name not in expected:
                if t is not None:
                    raise ValueError(f"{self.fmt} has no {name} segment")
                continue
            dtype, shape = expected[name]
            if t is None or t.dtype != _DTYPES[dtype] or tuple(t.shape) != shape:
                got = None if t is None else (t.dtype, tuple(t.shape))
                raise ValueError(f"{self.fmt} [{self.n}, {self.k}] {name}: expected {dtype} {shape}, got {got}")

    @property
    def format(self) -> PackedFormat:
        return get_format(self.fmt)

    @property
    def kp(self) -> int:
        """K padded to the format's alignment (the codes cover kp inputs; inputs past k are zero)."""
        a = self.format.k_align
        return (self.k + a - 1) // a * a

    @property
    def segments(self) -> dict[str, torch.Tensor]:
        """The stored tensors by name, in storage order."""
        return {name: getattr(self, name) for name, *_ in self.format.segments(self.n, self.k)}

    @property
    def nbytes(self) -> int:
        return self.format.matrix_bytes(self.n, self.k)

    def rows(self, name: str) -> torch.Tensor:
        """Stored tensor `name` as row-major [n, kp-long values] (a copy: storage is unit-major)."""
        return from_unit_major(getattr(self, name))

    @property
    def device(self) -> torch.device:
        return next(iter(self.segments.values())).device

    def to(self, device: torch.device | str) -> "PackedMatrix":
        moved = {name: t.to(device) for name, t in self.segments.items()}
        return PackedMatrix(self.fmt, self.n, self.k, **moved)


def to_unit_major(t: torch.Tensor, nu: int) -> torch.Tensor:
    """Row-major [n, L] (L = nu * P values along K) to the stored unit-major [nu, n, P]."""
    return t.reshape(t.shape[0], nu, -1).transpose(0, 1).contiguous()


def from_unit_major(t: torch.Tensor) -> torch.Tensor:
    """Stored unit-major [nu, n, P] back to row-major [n, nu * P]."""
    return t.transpose(0, 1).reshape(t.shape[1], -1)


# --------------------------------------------------------------------------------------------- fitting

def _lsq(w: torch.Tensor, imp: torch.Tensor, q: torch.Tensor, s_old: torch.Tensor):
    """Weighted least squares for (s, z) in w ~ s * q + z over the last dim; s stays >= 0.

    Where every code is equal (no slope to fit) or the fit gives s < 0, s keeps `s_old`."""
    a = imp.sum(-1).expand(q.shape[:-1])
    b = (imp * q).sum(-1)
    c = (imp * q * q).sum(-1)
    dsum = (imp * w).sum(-1)
    e = (imp * q * w).sum(-1)
    det = a * c - b * b
    ok = det > 1e-12 * (a * c).clamp_min(1e-30)
    s = torch.where(ok, (a * e - b * dsum) / torch.where(ok, det, 1.0), s_old)
    s = torch.where(s >= 0, s, s_old)
    z = (dsum - s * b) / a.clamp_min(1e-30)
    return s, z


def _round_codes(w: torch.Tensor, s: torch.Tensor, z: torch.Tensor, levels: int) -> torch.Tensor:
    """Nearest code for each weight given a grid w = s * q + z (s, z broadcast over the last dim)."""
    inv = torch.where(s > 0, 1.0 / s.clamp_min(1e-30), 0.0)
    return torch.round((w - z.unsqueeze(-1)) * inv.unsqueeze(-1)).clamp_(0, levels)


def _sq_err(w, imp, s, z, q) -> torch.Tensor:
    return (imp * (s.unsqueeze(-1) * q + z.unsqueeze(-1) - w) ** 2).sum(-1)


def fit_groups(w: torch.Tensor, imp: torch.Tensor, levels: int, refine: int = 4):
    """Best (s >= 0, z) per group for w ~ s * q + z, q in 0..levels. w [..., g], imp broadcastable to w.

    Returns s, z, codes q (float) and the weighted squared error per group."""
    wmin, wmax = w.amin(-1), w.amax(-1)
    rng = (wmax - wmin).clamp_min(1e-30)
    # candidate 0: plain min/max round-to-nearest
    s0 = (wmax - wmin) / levels
    q0 = _round_codes(w, s0, wmin, levels)
    best = (s0, wmin, q0, _sq_err(w, imp, s0, wmin, q0))

    def keep_better(best, q_start):
        """Refit (s, z) to the codes q_start, re-round, and keep it in the groups where it is better."""
        s, z = _lsq(w, imp, q_start, best[0])
        q = _round_codes(w, s, z, levels)
        e = _sq_err(w, imp, s, z, q)
        better = e < best[3]
        return (torch.where(better, s, best[0]), torch.where(better, z, best[1]),
                torch.where(better.unsqueeze(-1), q, best[2]), torch.minimum(e, best[3]))

    steps = torch.linspace(-0.5, 1.5, 11).tolist() if levels > 1 else torch.linspace(-0.4, 2.0, 13).tolist()
    for delta in steps:                      # grids stretched and shrunk around min..max
        iscale = (levels + delta) / rng
        best = keep_better(best, torch.round((w - wmin.unsqueeze(-1)) * iscale.unsqueeze(-1)).clamp_(0, levels))
    for _ in range(refine):                  # Lloyd: round, refit, repeat
        best = keep_better(best, best[2])
    return best


# -------------------------------------------------------------------------------------------- encoders

def _f16(x: torch.Tensor) -> torch.Tensor:
    """Round to fp16 (saturating), returned as float32."""
    return x.clamp(-65504.0, 65504.0).to(torch.float16).float()


def _encode_fp16(w: torch.Tensor, imp: torch.Tensor, fmt: PackedFormat, rtn: bool = False):
    """q4_g128_f16-style: fp16 S and M per group. w [R, G, g] -> (q, S, M) with S, M [R, G] fp16. rtn: the
    min/max round-to-nearest baseline alone."""
    levels = (1 << fmt.bits) - 1
    wmin, wmax = w.amin(-1), w.amax(-1)
    # the baseline everyone compares with: min/max round-to-nearest with fp16 scale and zero
    rtn_s, rtn_m = _f16((wmax - wmin) / levels), _f16(-wmin)
    best_q = _round_codes(w, rtn_s, -rtn_m, levels)
    best_s, best_m = rtn_s, rtn_m
    if rtn:
        return best_q, best_s.to(torch.float16), best_m.to(torch.float16)
    best_e = _sq_err(w, imp, best_s, -best_m, best_q)
    s, z, q, _ = fit_groups(w, imp, levels)
    for _ in range(3):
        s16, m16 = _f16(s), _f16(-z)
        q = _round_codes(w, s16, -m16, levels)
        e = _sq_err(w, imp, s16, -m16, q)
        better = e < best_e
        best_s, best_m, best_e = torch.where(better, s16, best_s), torch.where(better, m16, best_m), torch.minimum(e, best_e)
        best_q = torch.where(better.unsqueeze(-1), q, best_q)
        s, z = _lsq(w, imp, q, s16)
    return best_q, best_s.to(torch.float16), best_m.to(torch.float16)


def _quant_unsigned(x: torch.Tensor, scale: torch.Tensor, top: int) -> torch.Tensor:
    """round(x / scale) clamped to 0..top; scale broadcast over the last dim, zero scale gives zero."""
    inv = torch.where(scale != 0, 1.0 / torch.where(scale != 0, scale, 1.0), 0.0)
    return torch.round(x * inv.unsqueeze(-1)).clamp_(0, top)


def _superblock_scales(s: torch.Tensor, m: torch.Tensor, sc_top: int, mn_top: int):
    """Super-block step: S [R, B, gpb] >= 0 and M [R, B, gpb] to fp16 d, dmin [R, B] and integer sc, mn.

    M = dmin * mn with unsigned mn, so one sign per super-block: dmin follows the sign of the largest
    |M|, and groups whose M has the other sign store 0 (their range then reaches zero)."""
    d = _f16(s.amax(-1) / sc_top)
    m_pos, m_neg = m.amax(-1), m.amin(-1)
    dmin = _f16(torch.where(m_pos >= -m_neg, m_pos, m_neg) / mn_top)
    return d, dmin, _quant_unsigned(s, d, sc_top), _quant_unsigned(m, dmin, mn_top)


def _encode_superblock(w: torch.Tensor, imp: torch.Tensor, fmt: PackedFormat, rtn: bool = False):
    """Super-block formats. w [R, B, gpb, g] (B super-blocks of gpb groups of g weights). rtn: plain round-to-
    nearest with each group's min/max scale (stored in the super-block step), no fit and no refinement.

    Returns q [R, B, gpb, g], sc [R, B, gpb], mn [R, B, gpb] (integers as float), d, dmin [R, B] fp16."""
    levels, sc_top, mn_top = (1 << fmt.bits) - 1, (1 << fmt.scale_bits) - 1, (1 << fmt.min_bits) - 1
    if rtn:
        s, z = (w.amax(-1) - w.amin(-1)) / levels, w.amin(-1)
    else:
        s, z, q, _ = fit_groups(w, imp, levels)
    d, dmin, sc, mn = _superblock_scales(s, -z, sc_top, mn_top)
    if rtn:
        S, M = d.unsqueeze(-1) * sc, dmin.unsqueeze(-1) * mn
        return _round_codes(w, S, -M, levels), sc, mn, d.to(torch.float16), dmin.to(torch.float16)
    best = None
    for it in range(4):
        S, M = d.unsqueeze(-1) * sc, dmin.unsqueeze(-1) * mn
        q = _round_codes(w, S, -M, levels)
        err = _sq_err(w, imp, S, -M, q).sum(-1)                  # [R, B]
        if best is None:
            best = [err, q, sc, mn, d, dmin]
        else:
            better = err < best[0]
            best[0] = torch.minimum(err, best[0])
            for i, (new, dims) in enumerate(((q, 2), (sc, 1), (mn, 1), (d, 0), (dmin, 0)), start=1):
                best[i] = torch.where(better.view(*better.shape, *([1] * dims)), new, best[i])
        if it == 3:
            break
        # refit each group's (S, M) to its codes, store them against the current (d, dmin) ...
        s_new, z_new = _lsq(w, imp, q, S)
        sc = _quant_unsigned(s_new, d, sc_top)
        mn = _quant_unsigned(-z_new, dmin, mn_top)
        # ... then refit (d, dmin) over the super-block: w ~ d * (sc q) - dmin * mn, linear in both
        a_, b_ = (sc.unsqueeze(-1) * q), (-mn.unsqueeze(-1)).expand_as(q)
        ii = imp.expand_as(w)
        saa = (ii * a_ * a_).sum((-1, -2)); sbb = (ii * b_ * b_).sum((-1, -2)); sab = (ii * a_ * b_).sum((-1, -2))
        saw = (ii * a_ * w).sum((-1, -2)); sbw = (ii * b_ * w).sum((-1, -2))
        det = saa * sbb - sab * sab
        ok = det > 1e-12 * (saa * sbb).clamp_min(1e-30)
        dd = torch.where(ok, (saw * sbb - sbw * sab) / torch.where(ok, det, 1.0), d)
        dm = torch.where(ok, (sbw * saa - saw * sab) / torch.where(ok, det, 1.0), dmin)
        d, dmin = _f16(torch.where(dd > 0, dd, d)), _f16(dm)
    _, q, sc, mn, d, dmin = best
    return q, sc, mn, d.to(torch.float16), dmin.to(torch.float16)


# ------------------------------------------------------------------------------------------ bit packing

def pack_bits(q: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [..., L] (L a multiple of 32 / bits) to bytes, in 32-bit little-endian words of
    S * 4 codes (S = 8 / bits): code 4*s + j of a word sits in byte j, bits s*bits .. s*bits + bits - 1.
    So `(word >> bits*s) & mask` in every byte gives four consecutive codes, which the decode kernels
    multiply by four consecutive int8 activations (one 32-bit word of them) with DP4A."""
    per = 8 // bits
    q = q.to(torch.int64).reshape(*q.shape[:-1], q.shape[-1] // (4 * per), per, 4)     # [..., W, s, j]
    shifts = (torch.arange(per, device=q.device) * bits)[:, None] + torch.arange(4, device=q.device) * 8
    words = (q << shifts).sum((-2, -1))                                                 # [..., W]
    byts = (words.unsqueeze(-1) >> (torch.arange(4, device=q.device) * 8)) & 255        # little-endian
    return byts.reshape(*q.shape[:-3], -1).to(torch.uint8)


def pack_nibbles(v: torch.Tensor) -> torch.Tensor:
    """4-bit values [..., L] (L even) to bytes, two a byte: element 2i in the low nibble of byte i."""
    v = v.to(torch.int32).reshape(*v.shape[:-1], v.shape[-1] // 2, 2)
    return (v[..., 0] | (v[..., 1] << 4)).to(torch.uint8)


def unpack_nibbles(b: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_nibbles`."""
    b = b.to(torch.int32)
    return torch.stack((b & 15, b >> 4), -1).reshape(*b.shape[:-1], 2 * b.shape[-1]).to(torch.uint8)


def unpack_bits(b: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `pack_bits`: bytes [..., L] to codes [..., L * 8 / bits] (uint8)."""
    per = 8 // bits
    byts = b.to(torch.int32).reshape(*b.shape[:-1], b.shape[-1] // 4, 1, 4)            # [..., W, 1, j]
    shifts = (torch.arange(per, device=b.device, dtype=torch.int32) * bits)[:, None]    # [s, 1]
    q = (byts >> shifts) & ((1 << bits) - 1)                                            # [..., W, s, j]
    return q.reshape(*b.shape[:-1], b.shape[-1] * per).to(torch.uint8)


# ------------------------------------------------------------------------------------------ public API

def _check_inputs(w: torch.Tensor, fmt: str, importance: torch.Tensor | None) -> PackedFormat:
    f = get_format(fmt)
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"quantize: weight must be a 2-D float tensor [N, K], got {tuple(w.shape)} {w.dtype}")
    if not torch.isfinite(w).all():
        raise ValueError("quantize: weight has NaN or inf entries")
    if importance is not None:
        if importance.shape != (w.shape[1],):
            raise ValueError(f"quantize: importance must have shape [K] = [{w.shape[1]}], got {tuple(importance.shape)}")
        if not torch.isfinite(importance).all() or (importance < 0).any():
            raise ValueError("quantize: importance must be finite and >= 0 (e.g. mean squared activations)")
    return f


def _importance(importance: torch.Tensor | None, k: int, kp: int, device) -> torch.Tensor:
    """Per-input weights for the squared error: mean 1, a small floor so every fit stays well posed."""
    imp = torch.ones(kp, device=device)
    if importance is not None:
        i = importance.to(device=device, dtype=torch.float32)
        imp[:k] = i / i.mean().clamp_min(1e-30)
    imp[k:] = 0.0
    return imp + 1e-3


def quantize(w: torch.Tensor, fmt: str, importance: torch.Tensor | None = None, rtn: bool = False) -> PackedMatrix:
    """Quantize w [N, K] (an nn.Linear weight: N outputs, K inputs) to packed format `fmt`. rtn: the baseline
    instead of the fit, plain round-to-nearest with group-wise min/max scaling (importance unused)."""
    f = _check_inputs(w, fmt, importance)
    n, k = w.shape
    if f.is_bf16:
        return PackedMatrix(fmt, n, k, weight=w.to(torch.bfloat16).contiguous())
    kp = (k + f.k_align - 1) // f.k_align * f.k_align
    imp = _importance(importance, k, kp, w.device)
    groups = kp // f.group
    parts: dict[str, list[torch.Tensor]] = {name: [] for name, *_ in f.segments(n, k)}
    for r0 in range(0, n, _ROW_CHUNK):
        rows = torch.zeros(min(_ROW_CHUNK, n - r0), kp, device=w.device)
        rows[:, :k] = w[r0:r0 + _ROW_CHUNK].float()
        r = rows.shape[0]
        if f.superblock:
            gpb = f.superblock // f.group
            q, sc, mn, d, dmin = _encode_superblock(rows.view(r, -1, gpb, f.group),
                                                    imp.view(-1, gpb, f.group), f, rtn)
            parts["scales"].append(sc.reshape(r, groups).to(torch.uint8))
            mn = mn.reshape(r, groups).to(torch.uint8)
            parts["mins"].append(pack_nibbles(mn) if f.min_bits == 4 else mn)
            parts["d"].append(d)
            parts["dmin"].append(dmin)
        else:
            q, s16, m16 = _encode_fp16(rows.view(r, groups, f.group), imp.view(groups, f.group), f, rtn)
            parts["scales"].append(s16)
            parts["mins"].append(m16)
        parts["codes"].append(pack_bits(q.reshape(r, kp).to(torch.uint8), f.bits))
    nu = kp // f.k_align
    return PackedMatrix(fmt, n, k, **{name: to_unit_major(torch.cat(ts), nu) for name, ts in parts.items()})


def group_params(p: PackedMatrix) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group scale S and min M (float32 [n, kp / group]) of a quantized matrix: w = S * q - M."""
    f = p.format
    if f.superblock:
        gpb = f.superblock // f.group
        mn = unpack_nibbles(p.rows("mins")) if f.min_bits == 4 else p.rows("mins")
        S = p.rows("d").float().repeat_interleave(gpb, 1) * p.rows("scales").float()
        M = p.rows("dmin").float().repeat_interleave(gpb, 1) * mn.float()
        return S, M
    return p.rows("scales").float(), p.rows("mins").float()


def dequantize(p: PackedMatrix, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The reference dequantizer: w = S * q - M, in plain torch, [n, k] in `dtype`."""
    if p.format.is_bf16:
        return p.weight.to(dtype)
    f = p.format
    q = unpack_bits(p.rows("codes"), f.bits).float().view(p.n, -1, f.group)
    S, M = group_params(p)
    w = S.unsqueeze(-1) * q - M.unsqueeze(-1)
    return w.reshape(p.n, -1)[:, :p.k].to(dtype)


def _matrix_importance(importance, name: str, k: int):
    if importance is None:
        return None
    if isinstance(importance, Mapping):
        return importance.get(name)
    return importance if name in ("gate", "up") else None


def pack_expert(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, fmt: str,
                importance: torch.Tensor | Mapping[str, torch.Tensor] | None = None, rtn: bool = False) -> torch.Tensor:
    """Quantize one routed expert and lay it out as one blob (uint8, `expert_layout(fmt, H, I).nbytes`).

    gate, up: [I, H]; down: [H, I]. `importance` is a Tensor[H] (input statistics of gate and up) or a
    mapping {"gate": [H], "up": [H], "down": [I]} with any subset of those keys. rtn: round-to-nearest
    with group-wise min/max scaling (the baseline), see `quantize`."""
    if gate.dim() != 2 or up.shape != gate.shape or down.shape != gate.shape[::-1]:
        raise ValueError(f"pack_expert: need gate, up [I, H] and down [H, I]; got {tuple(gate.shape)}, "
                         f"{tuple(up.shape)}, {tuple(down.shape)}")
    inter, hidden = gate.shape
    packed = {name: quantize(w, fmt, _matrix_importance(importance, name, w.shape[1]), rtn)
              for name, w in zip(MATRICES, (gate, up, down))}
    return blob_from_matrices(packed, fmt, hidden, inter)


def blob_from_matrices(packed: Mapping[str, PackedMatrix], fmt: str, hidden: int, intermediate: int) -> torch.Tensor:
    """Lay already packed gate/up/down matrices out as one expert blob (on their device)."""
    layout = expert_layout(fmt, hidden, intermediate)
    device = packed["gate"].device
    blob = torch.zeros(layout.nbytes, dtype=torch.uint8, device=device)
    for seg in layout.segments:
        t = getattr(packed[seg.matrix], seg.name)
        blob[seg.offset:seg.offset + seg.nbytes] = t.contiguous().view(torch.uint8).reshape(-1)
    return blob


def unpack_expert(blob: torch.Tensor, fmt: str, hidden: int, intermediate: int) -> dict[str, PackedMatrix]:
    """Views of the gate, up and down matrices inside one expert blob (no copy)."""
    layout = expert_layout(fmt, hidden, intermediate)
    if blob.dtype != torch.uint8 or blob.dim() != 1 or blob.numel() < layout.payload_bytes:
        raise ValueError(f"unpack_expert: need a 1-D uint8 blob of {layout.nbytes} bytes for {fmt} "
                         f"H={hidden} I={intermediate}, got {blob.dtype} {tuple(blob.shape)}")
    out = {}
    for name, (n, k) in matrix_shapes(hidden, intermediate).items():
        segs = {s.name: blob[s.offset:s.offset + s.nbytes].view(_DTYPES[s.dtype]).view(s.shape)
                for s in layout.segments if s.matrix == name}
        out[name] = PackedMatrix(fmt, n, k, **segs)
    return out
