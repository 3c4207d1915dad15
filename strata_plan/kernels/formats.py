"""The packed formats: exact byte layouts of a routed expert's weights.

This module is the one place that knows how many bytes a packed matrix or expert takes. The model spec,
the planner, the packer, the expert store and the kernels all call it.

A matrix W of shape [N, K] (N output features, K inputs: `nn.Linear.weight`) is quantized along K in
groups of `group` weights; K is padded with zeros up to a multiple of the scale unit `k_align` (the
super-block, or the group when there is none), giving NU = Kp / k_align units a row. Every tensor is
stored unit-major, [NU, N, per-unit values]: all of unit 0 for rows 0 .. N-1, then unit 1, ... so the
decode kernels, which walk K one unit at a time over a block of rows, read each tensor of a unit for
consecutive rows from consecutive bytes. Per unit of one row, in this storage order:

    codes   uint8 [NU, N, unit * bits / 8]  `bits`-bit unsigned codes q in 32-bit little-endian words of
                                            32 / bits codes: code 4*s + j of a word in byte j, bits
                                            s*bits .. s*bits + bits - 1 (`quantizer.pack_bits`)
    scales  [NU, N, unit / group]           uint8 sc (scale_bits 8) or fp16 S (scale_bits 16)
    mins    [NU, N, unit / group]           uint8 mn (min_bits 8), fp16 M (16), or for min_bits 4
                                            uint8 [NU, N, unit / group / 2], two per byte, low nibble first
    d       fp16 [NU, N, 1]                 super-block scale of the scales   (only with a super-block)
    dmin    fp16 [NU, N, 1]                 super-block scale of the mins     (only with a super-block)

and a weight is   w = S * q - M   with   S = d * sc,  M = dmin * mn   (super-block formats)
                                   or   S, M read directly as fp16      (scale_bits = min_bits = 16).
`quantizer.PackedMatrix.rows(name)` gives any tensor back as a row-major [N, ...] view.

An expert is gate [I, H], up [I, H] and down [H, I], in that order, in one contiguous blob: every segment
starts on a `SEGMENT_ALIGN` boundary and the blob is padded to `EXPERT_ALIGN` (4 KiB), so one O_DIRECT
read and one host-to-GPU copy move a whole expert. FORMATS.md documents the same layouts for people.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

SEGMENT_ALIGN = 256      # bytes; keeps every tensor 16-byte aligned for vector loads, and more
EXPERT_ALIGN = 4096      # bytes; O_DIRECT needs sector-aligned offsets and sizes
MATRICES = ("gate", "up", "down")


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


@dataclass(frozen=True)
class PackedFormat:
    """One packed weight format. `bpw` counts every stored bit (codes, scales, mins, super-scales)."""

    name: str
    bits: int              # code bits: 1, 2, 4; 16 means plain bf16 (no codes)
    group: int = 0         # weights per group along K
    scale_bits: int = 0    # 8: uint8 scale of the group, 16: fp16 scale
    min_bits: int = 0      # 4 or 8: unsigned quantized min, 16: fp16 min
    superblock: int = 0    # weights per super-block (fp16 d and dmin); 0 = none
    seed_bpw: float | None = None   # the seed's figure this format stands for, if any
    description: str = ""

    def __post_init__(self) -> None:
        if self.bits == 16:
            return
        assert self.bits in (1, 2, 4), "codes are 1, 2 or 4 bits so they pack whole into a byte"
        assert self.scale_bits in (8, 16) and self.min_bits in (4, 8, 16)
        assert (self.scale_bits == 16) == (self.min_bits == 16) == (self.superblock == 0), \
            "fp16 scales and mins go without a super-block; quantized ones need one"
        assert self.superblock == 0 or self.superblock % self.group == 0
        assert (self.group * self.bits) % 8 == 0 and (self.min_bits != 4 or (self.k_align // self.group) % 2 == 0)

    @property
    def is_bf16(self) -> bool:
        return self.bits == 16

    @property
    def k_align(self) -> int:
        """K is padded to a multiple of this many weights."""
        return 1 if self.is_bf16 else (self.superblock or self.group)

    @property
    def bpw(self) -> float:
        """Bits per weight when K is a multiple of `k_align` (padding and alignment excluded)."""
        if self.is_bf16:
            return 16.0
        sb = 32 / self.superblock if self.superblock else 0.0
        return self.bits + (self.scale_bits + self.min_bits) / self.group + sb

    def segments(self, n: int, k: int) -> tuple[tuple[str, str, tuple[int, ...], int], ...]:
        """(name, dtype, shape, nbytes) of each stored tensor of an [n, k] matrix, in storage order."""
        if self.is_bf16:
            return (("weight", "bfloat16", (n, k), 2 * n * k),)
        unit = self.k_align
        nu = _round_up(k, unit) // unit
        gpu = unit // self.group                   # groups per unit
        segs = [("codes", "uint8", (nu, n, unit * self.bits // 8), nu * n * unit * self.bits // 8)]
        sdt = "float16" if self.scale_bits == 16 else "uint8"
        segs.append(("scales", sdt, (nu, n, gpu), nu * n * gpu * self.scale_bits // 8))
        if self.min_bits == 4:
            segs.append(("mins", "uint8", (nu, n, gpu // 2), nu * n * gpu // 2))
        else:
            mdt = "float16" if self.min_bits == 16 else "uint8"
            segs.append(("mins", mdt, (nu, n, gpu), nu * n * gpu * self.min_bits // 8))
        if self.superblock:
            segs.append(("d", "float16", (nu, n, 1), 2 * n * nu))
            segs.append(("dmin", "float16", (nu, n, 1), 2 * n * nu))
        return tuple(segs)

    def matrix_bytes(self, n: int, k: int) -> int:
        """Stored bytes of one [n, k] matrix (K padding included, segment alignment excluded)."""
        return sum(s[3] for s in self.segments(n, k))


# The registry. Names say code bits, group and scale width; `tier` names map the seed's three tiers.
FORMATS: dict[str, PackedFormat] = {f.name: f for f in (
    PackedFormat("q2_g16_s8m4", bits=2, group=16, scale_bits=8, min_bits=4, superblock=512, seed_bpw=2.81,
                 description="2-bit codes; per 16 weights a uint8 scale and a 4-bit min; fp16 d, dmin per 512"),
    PackedFormat("q2_g32_s8m8", bits=2, group=32, scale_bits=8, min_bits=8, superblock=512, seed_bpw=2.56,
                 description="2-bit codes; per 32 weights a uint8 scale and a uint8 min; fp16 d, dmin per 512"),
    PackedFormat("q1_g32_s8m4", bits=1, group=32, scale_bits=8, min_bits=4, superblock=512, seed_bpw=1.44,
                 description="1-bit codes; per 32 weights a uint8 scale and a 4-bit min; fp16 d, dmin per 512"),
    PackedFormat("q4_g128_f16", bits=4, group=128, scale_bits=16, min_bits=16, superblock=0, seed_bpw=None,
                 description="4-bit codes; per 128 weights an fp16 scale and an fp16 min (HQQ/GemLite-style g128)"),
    PackedFormat("bf16", bits=16, description="plain bfloat16, unquantized"),
)}
FORMAT_CODES = tuple(FORMATS)   # the kernels' run-time format code of each format is its index here (bf16 last)

# The seed's three tiers of routed experts, most used first.
TIER_FORMATS = ("q2_g16_s8m4", "q2_g32_s8m8", "q1_g32_s8m4")
NATIVE_FORMAT = "q4_g128_f16"    # Kimi's native 4-bit experts (about 4.25 bpw)
SEED_TARGET_BPW = 1.92           # the seed's average over routed experts


def get_format(name: str) -> PackedFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown packed format {name!r}; known: {', '.join(FORMATS)}") from None


@dataclass(frozen=True)
class Segment:
    matrix: str        # gate, up or down
    name: str          # codes, scales, mins, d, dmin or weight
    dtype: str
    shape: tuple[int, int]
    offset: int        # bytes from the start of the expert blob
    nbytes: int


@dataclass(frozen=True)
class ExpertLayout:
    """Where each tensor of one packed expert lies inside its 4 KiB-aligned blob."""

    format: str
    hidden: int
    intermediate: int
    segments: tuple[Segment, ...]
    nbytes: int        # the whole blob, padded to EXPERT_ALIGN: what one read and one copy move

    @property
    def payload_bytes(self) -> int:
        return sum(s.nbytes for s in self.segments)

    def segment(self, matrix: str, name: str) -> Segment:
        for s in self.segments:
            if s.matrix == matrix and s.name == name:
                return s
        raise KeyError(f"{matrix}.{name} not in {self.format} layout")


def matrix_shapes(hidden: int, intermediate: int) -> dict[str, tuple[int, int]]:
    """[N, K] of each expert matrix (nn.Linear weight shapes)."""
    return {"gate": (intermediate, hidden), "up": (intermediate, hidden), "down": (hidden, intermediate)}


@lru_cache(maxsize=None)
def expert_layout(format: str, hidden: int, intermediate: int) -> ExpertLayout:
    fmt = get_format(format)
    segs, off = [], 0
    for m, (n, k) in matrix_shapes(hidden, intermediate).items():
        for name, dtype, shape, nbytes in fmt.segments(n, k):
            off = _round_up(off, SEGMENT_ALIGN)
            segs.append(Segment(m, name, dtype, shape, off, nbytes))
            off += nbytes
    return ExpertLayout(format, hidden, intermediate, tuple(segs), _round_up(off, EXPERT_ALIGN))


def expert_bytes(format: str, hidden: int, intermediate: int) -> int:
    """Bytes of one packed routed expert as stored, read and copied (alignment included)."""
    return expert_layout(format, hidden, intermediate).nbytes


@dataclass(frozen=True)
class TierMix:
    """Fractions of a layer's routed experts stored in each tier format, most used experts first."""

    formats: tuple[str, ...]
    fractions: tuple[float, ...]

    @property
    def mean_bpw(self) -> float:
        return sum(f * get_format(n).bpw for n, f in zip(self.formats, self.fractions))

    def counts(self, n_experts: int) -> tuple[int, ...]:
        """Whole experts per format for a layer of `n_experts` (largest remainders; sums to n_experts)."""
        raw = [f * n_experts for f in self.fractions]
        counts = [math.floor(r) for r in raw]
        order = sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)
        for i in order[: n_experts - sum(counts)]:
            counts[i] += 1
        return tuple(counts)

    def names(self, n_experts: int) -> list[str]:
        """The format of each of `n_experts` experts in tier order (`counts` of each, most used tier first)."""
        return [name for name, c in zip(self.formats, self.counts(n_experts)) for _ in range(c)]

    def assign(self, popularity_order: list[int] | tuple[int, ...]) -> dict[int, str]:
        """Expert id -> format, given expert ids sorted from most to least used."""
        return dict(zip(popularity_order, self.names(len(popularity_order))))


def tier_mix(target_bpw: float = SEED_TARGET_BPW, formats: tuple[str, ...] = TIER_FORMATS,
             hot_to_warm: float = 1.0) -> TierMix:
    """Split routed experts over three tier formats so their mean bpw equals `target_bpw`.

    Two equations (fractions sum to 1; mean bpw = target) leave one degree of freedom; `hot_to_warm`
    fixes it as the ratio of the first tier's share to the second's (1.0: equal shares). For the seed's
    1.92 bpw with the default formats this gives 19.3% / 19.3% / 61.4%.
    """
    a, b, c = (get_format(n).bpw for n in formats)
    if not c <= target_bpw <= a:
        raise ValueError(f"target {target_bpw} bpw is outside what {formats} can reach ({c:.4f}..{a:.4f})")
    # f1 = r * f2, f3 = 1 - f1 - f2;  a f1 + b f2 + c f3 = t  ->  f2 (r a + b - c (r + 1)) = t - c
    r = hot_to_warm
    f2 = (target_bpw - c) / (r * a + b - c * (r + 1))
    f1 = r * f2
    f3 = 1.0 - f1 - f2
    if min(f1, f2, f3) < -1e-12:
        raise ValueError(f"hot_to_warm={r} cannot reach {target_bpw} bpw with {formats}")
    return TierMix(tuple(formats), (f1, f2, max(f3, 0.0)))
