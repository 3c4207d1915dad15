"""Public kernel entry points: check shapes, allocate, launch.

    packed_linear(x [M, K], p: PackedMatrix) -> [M, N]
        M <= 8: decode GEMV (int8 activations, DP4A; 2 launches); larger M: dequant + tensor-core GEMM.
    fused_moe(x [M, H], topk_ids [M, k], topk_weights [M, k], arena, offsets, formats, hidden, intermediate)
        -> [M, H]: every token's top-k experts (any mix of formats) in two launches (gate/up, down);
        for M > MOE_DECODE_MAX_M the grouped GEMM path (tokens sorted by expert; see KERNELS.md).

`backend`: "auto" runs Triton for CUDA tensors and the plain-torch reference (kernels/reference.py) for
CPU tensors; "triton" forces the kernels (on CPU only where they are interpreted, TRITON_INTERPRET=1 or
no GPU); "torch" forces the reference. Outputs have x's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch

from . import reference
from .formats import FORMATS, expert_layout, get_format
from .quantizer import PackedMatrix
from .triton_common import (BF16_CODE, FORMAT_CODES, INTERPRET, INTERPRETER_OK, USE_ASM, format_constants,
                            tile_words_limit, triton)
from . import triton_gemm, triton_gemv, triton_moe
from .tuned import config_for

GEMV_MAX_M = 8            # decode kernel up to this many rows; the tensor-core GEMM above
POISON_SCRATCH = False    # tests: fill every scratch buffer with NaN / garbage, so a read of an unwritten
                          # element shows in the result
MOE_DECODE_MAX_M = 16     # fused MoE decode kernels up to this many tokens; grouped GEMMs above
_SEGS = ("codes", "scales", "mins", "d", "dmin")

for _name, (_code, *_consts) in triton_moe.KERNEL_FORMATS.items():
    _c = format_constants(FORMAT_CODES.index(_name))
    assert _code == _c["CODE"] and (_name == "bf16" or tuple(_consts) == (
        _c["BITS"], _c["GROUP"], _c["SCALE_BITS"], _c["MIN_BITS"], _c["SB"])), \
        f"triton_moe.KERNEL_FORMATS[{_name!r}] disagrees with formats.FORMATS: add or fix its kernel branch"
assert set(triton_moe.KERNEL_FORMATS) == set(FORMATS), "every registered format needs a branch in triton_moe"


def _use_triton(t: torch.Tensor, backend: str) -> bool:
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if backend == "torch":
        return False
    if t.is_cuda:
        return True
    if backend == "triton":
        if not INTERPRETER_OK:
            raise ValueError("backend='triton' on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 "
                             "in the environment before anything imports triton")
        return True
    return False


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _chunk(cfg: dict, k: int) -> int:
    """Inputs packed per step of phase A: the config's CHUNK, or less for short rows (powers of two >= 32)."""
    return min(cfg.get("CHUNK", 1024), max(32, triton.next_power_of_2(k)))


def scratch(*shape: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialized buffer the kernels fill; poisoned (NaN, or 0x7F7F7F7F) under POISON_SCRATCH."""
    if POISON_SCRATCH:
        fill = float("nan") if dtype.is_floating_point else 0x7F7F7F7F
        return torch.full(shape, fill, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _dummy(device) -> torch.Tensor:
    return torch.empty(1, dtype=torch.uint8, device=device)


# ------------------------------------------------------------------------------------- packed_linear

def _check_linear(x: torch.Tensor, p: PackedMatrix, out: torch.Tensor | None) -> None:
    if x.dim() != 2 or x.shape[1] != p.k or not x.is_floating_point():
        raise ValueError(f"packed_linear: x must be a float tensor [M, {p.k}], got {tuple(x.shape)} {x.dtype}")
    if x.device != p.device:
        raise ValueError(f"packed_linear: x is on {x.device} but the weights are on {p.device}")
    if out is not None and (tuple(out.shape) != (x.shape[0], p.n) or out.dtype != x.dtype
                            or out.device != x.device or out.stride(1) != 1):
        raise ValueError(f"packed_linear: out must be a {x.dtype} [{x.shape[0]}, {p.n}] tensor with unit column "
                         f"stride on {x.device}")


def packed_linear(x: torch.Tensor, p: PackedMatrix, out: torch.Tensor | None = None,
                  backend: str = "auto", config: dict | None = None) -> torch.Tensor:
    """x [M, K] @ W^T for a packed W [N, K]: [M, N] in x's dtype, written into `out` if given."""
    _check_linear(x, p, out)
    if out is None:
        out = torch.empty(x.shape[0], p.n, dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    if not _use_triton(x, backend):
        return out.copy_(reference.linear(x, p).to(x.dtype))
    x = x if x.stride(1) == 1 else x.contiguous()
    if x.shape[0] <= GEMV_MAX_M:
        _gemv(x, p, out, config or config_for("gemv", p.fmt, x.shape[0], p.n, p.k, x.device))
    else:
        _gemm(x, p, out, config or config_for("gemm", p.fmt, x.shape[0], p.n, p.k, x.device))
    return out


def _matrix_args(p: PackedMatrix) -> list[torch.Tensor]:
    """codes (as int32 words), scales, mins, d, dmin; dummies where absent."""
    if p.format.is_bf16:
        d = _dummy(p.device)
        return [p.weight, d, d, d, d]
    segs = p.segments
    codes = segs["codes"].view(torch.int32)
    return [codes] + [segs.get(n, _dummy(p.device)) for n in _SEGS[1:]]


def pack_activations(x: torch.Tensor, kp: int, cfg: dict | None = None):
    """Phase A of the decode GEMV: x [M, K] on the int8 grid over kp >= K inputs (zeros past K), the same
    for every code width. Returns xq int32 [M, kp/4] (the int8 values, four a word), xdx f32 [M, kp/32],
    xsum f32 [M, 3*kp/32] (the exact sums of x per 16 inputs, then per 32)."""
    m, k = x.shape
    xq = scratch(m, kp // 4, dtype=torch.int32, device=x.device)
    xdx = scratch(m, kp // 32, dtype=torch.float32, device=x.device)
    xsum = scratch(m, 3 * kp // 32, dtype=torch.float32, device=x.device)
    triton_gemv.quantize_x_kernel[(m,)](x, x.stride(0), k, kp, xq, xdx, xsum, CHUNK=_chunk(cfg or {}, kp),
                                        num_warps=4)
    return xq, xdx, xsum


def _gemv_split(n: int, row_words: int, bkw: int, cfg: dict) -> int:
    """K splits of the GEMV: enough (rows x splits) threads to keep HBM busy (at most MAXSPLIT), whole K
    steps per split."""
    want = cfg.get("SPLIT") or max(1, min(cfg.get("MAXSPLIT", 8), _cdiv(cfg.get("THREADS", 32768), n)))
    return max(1, min(want, row_words // bkw))


def _gemv(x: torch.Tensor, p: PackedMatrix, out: torch.Tensor, cfg: dict) -> None:
    """One launch: every program quantizes its K slice of x, runs phase B, and with a K split the last
    program of each row tile adds the parts (`triton_gemv.gemv_kernel`)."""
    m, k = x.shape
    code = FORMAT_CODES.index(p.fmt)
    c = format_constants(code)
    common = dict(BITS=c["BITS"], GROUP=c["GROUP"], SCALE_BITS=c["SCALE_BITS"], MIN_BITS=c["MIN_BITS"],
                  SB=c["SB"], BN=cfg["BN"], BK16=cfg["BK16"], USE_ASM=USE_ASM, num_warps=cfg["num_warps"])
    nt = _cdiv(p.n, cfg["BN"])
    if c["BITS"] == 16:
        d = _dummy(x.device)
        triton_gemv.gemv_kernel[(nt * m,)](
            x, x.stride(0), *_matrix_args(p), d, d, d, d, d, out, out.stride(0), m, p.n, k, 0,
            SPLIT=1, NS=1, CHUNK=32, **common)
        return
    bkw = tile_words_limit(code)                     # a K step is one scale unit
    kp, epw = p.kp, 32 // c["BITS"]
    row_words = kp // epw
    split = _gemv_split(p.n, row_words, bkw, cfg)
    wsplit = _cdiv(row_words // bkw, split) * bkw
    split = _cdiv(row_words, wsplit)
    dev = x.device
    xq = scratch(m, kp // 4, dtype=torch.int32, device=dev)
    xdx = scratch(m, kp // 32, dtype=torch.float32, device=dev)
    xsum = scratch(m, 3 * kp // 32, dtype=torch.float32, device=dev)
    part = scratch(split, m, nt * cfg["BN"], dtype=torch.float32, device=dev) if split > 1 else _dummy(dev)
    cnt = _counters(m * nt, dev) if split > 1 else _dummy(dev)
    triton_gemv.gemv_kernel[(nt * split * m,)](
        x, x.stride(0), *_matrix_args(p), xq, xdx, xsum, part, cnt, out, out.stride(0), m, p.n, k, wsplit,
        SPLIT=split, NS=cfg.get("NS", 1), CHUNK=min(_chunk(cfg, kp), (wsplit * epw) & -(wsplit * epw)),
        CG=cfg.get("CG", 0), **common, **_maxnreg(cfg, "MAXNREG"))


GLUON_MIN_TRITON = (3, 6)    # the oldest Triton the Gluon GEMM was run on (3.6) or compiled with (3.9)


@lru_cache(maxsize=1)
def gluon_module():
    """`kernels.gluon_gemm`, or None where this Triton is older than GLUON_MIN_TRITON (Gluon's API moves
    between releases) or cannot import it: then every GEMM runs the Triton kernel."""
    try:
        if tuple(int(v) for v in triton.__version__.split(".")[:2]) < GLUON_MIN_TRITON:
            return None
        from . import gluon_gemm
        return gluon_gemm
    except (ImportError, AttributeError, ValueError):
        return None


def _gluon_ok(x: torch.Tensor, p: PackedMatrix, cfg: dict) -> bool:
    """The Gluon GEMM (`gluon_gemm`: wgmma, x by TMA) takes this call: asked for by the config (GLUON,
    from GLUON_MIN_M rows on), an sm_90 GPU, packed weights, bf16 x laid out as TMA needs (K a multiple
    of 8, rows 16-byte aligned), and a Triton that has it. Anything else runs the Triton GEMM."""
    return (bool(cfg.get("GLUON")) and x.shape[0] >= cfg.get("GLUON_MIN_M", 1) and not p.format.is_bf16
            and x.dtype == torch.bfloat16 and x.is_cuda and torch.cuda.get_device_capability(x.device) == (9, 0)
            and x.shape[1] % 8 == 0 and x.stride(1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
            and gluon_module() is not None)


def gluon_warps(m: int, k: int, cfg: dict) -> int:
    """Warps of the Gluon GEMM for x [m, k]: 8 (128-row tiles) from GWARPS8_MIN_M rows and GWARPS8_MIN_K
    columns on, GWARPS below."""
    big = m >= cfg.get("GWARPS8_MIN_M", 1 << 62) and k >= cfg.get("GWARPS8_MIN_K", 0)
    return 8 if big else cfg["GWARPS"]


def _gemm(x: torch.Tensor, p: PackedMatrix, out: torch.Tensor, cfg: dict) -> None:
    m, k = x.shape
    c = format_constants(FORMAT_CODES.index(p.fmt))
    if _gluon_ok(x, p, cfg):
        gg, bt = gluon_module(), cfg["GBT"]
        nw = gluon_warps(m, k, cfg)
        tiles = gg.tiles(m, p.n, bt, nw)
        # K split (up to GSPLIT ways) where the tiles leave SMs idle: one program an SM at most
        split = max(1, min(cfg.get("GSPLIT", 1), _sm_count(x.device) // tiles))
        progs = tiles * split
        part = scratch(gg.part_numel(progs, bt, nw), dtype=torch.float32, device=x.device) if split > 1 else None
        cnt = _counters(tiles, x.device) if split > 1 else None
        gg.gemm_gluon(x, _matrix_args(p), c, p.n, out, bt=bt, ns=cfg["GNS"], num_warps=nw, programs=progs,
                      part=part, cnt=cnt)
        return
    bk = _gemm_bk(p.fmt, cfg["BK"])
    grid = (triton.cdiv(m, cfg["BM"]) * triton.cdiv(p.n, cfg["BN"]),)
    triton_gemm.gemm_kernel[grid](x, x.stride(0), *_matrix_args(p), out, out.stride(0), m, p.n, k,
                                  BITS=c["BITS"], GROUP=c["GROUP"], SCALE_BITS=c["SCALE_BITS"],
                                  MIN_BITS=c["MIN_BITS"], SB=c["SB"], BM=cfg["BM"], BN=cfg["BN"], BK=bk,
                                  GROUP_M=cfg.get("GROUP_M", 8), EVEN_K=k % bk == 0, INTERP=INTERPRET,
                                  DQ=cfg.get("DQ", 0), PFM=cfg.get("PFM", 0),
                                  num_warps=cfg["num_warps"],
                                  num_stages=cfg["num_stages"])


def _gemm_bk(fmt: str, bk: int) -> int:
    """The GEMM's K tile must divide the format's scale unit (super-block or fp16 group)."""
    f = get_format(fmt)
    return bk if f.is_bf16 else max(32 // f.bits, min(bk, f.superblock or f.group))   # whole code words


# ----------------------------------------------------------------------------------------- fused_moe

@dataclass(frozen=True, eq=False)
class ExpertFormats:
    """Per-expert run-time format codes (int32 [E] on the arena's device) and the mask of codes present.

    Build it once per layer (`ExpertFormats.from_names`) and pass it to every `fused_moe` call: a list
    of names costs a host-to-device copy per call."""

    codes: torch.Tensor
    mask: int

    @staticmethod
    def from_names(names: Sequence[str], device) -> "ExpertFormats":
        return _expert_formats(tuple(names), str(torch.device(device)))

    @property
    def names(self) -> list[str]:
        present = [FORMAT_CODES[c] for c in range(len(FORMAT_CODES)) if self.mask >> c & 1]
        return present


@lru_cache(maxsize=64)
def _expert_formats(names: tuple[str, ...], device: str) -> ExpertFormats:
    for n in set(names):
        get_format(n)
    codes = [FORMAT_CODES.index(n) for n in names]
    mask = 0
    for c in set(codes):
        mask |= 1 << c
    return ExpertFormats(torch.tensor(codes, dtype=torch.int32, device=device), mask)


def _resolve_formats(formats, n_experts: int, device) -> ExpertFormats:
    if isinstance(formats, ExpertFormats):
        if formats.codes.numel() != n_experts:
            raise ValueError(f"fused_moe: {formats.codes.numel()} format codes for {n_experts} experts")
        return formats
    if isinstance(formats, str):
        return ExpertFormats.from_names((formats,) * n_experts, device)
    if isinstance(formats, torch.Tensor):
        codes = formats.to(device=device, dtype=torch.int32)
        mask = 0
        for c in torch.unique(codes).tolist():     # one device sync: prefer ExpertFormats
            mask |= 1 << int(c)
        return ExpertFormats(codes, mask)
    names = list(formats)
    if len(names) != n_experts:
        raise ValueError(f"fused_moe: {len(names)} formats for {n_experts} experts (offsets)")
    return ExpertFormats.from_names(names, device)


@lru_cache(maxsize=64)
def _layout_table(hidden: int, intermediate: int, device: str) -> torch.Tensor:
    """int64 [codes, 3 matrices, 5 segments]: byte offset of each segment inside an expert blob."""
    t = torch.zeros(len(FORMAT_CODES), 3, 5, dtype=torch.int64)
    for code, name in enumerate(FORMAT_CODES):
        for s in expert_layout(name, hidden, intermediate).segments:
            mi = ("gate", "up", "down").index(s.matrix)
            si = 0 if s.name == "weight" else _SEGS.index(s.name)
            t[code, mi, si] = s.offset
    return t.to(device)


def _check_moe(x, topk_ids, topk_weights, arena, offsets, hidden, intermediate, out):
    if x.dim() != 2 or x.shape[1] != hidden or not x.is_floating_point():
        raise ValueError(f"fused_moe: x must be a float tensor [M, hidden={hidden}], got {tuple(x.shape)} {x.dtype}")
    m = x.shape[0]
    if topk_ids.dim() != 2 or topk_ids.shape[0] != m or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"fused_moe: topk_ids must be int32/int64 [M={m}, k], got {tuple(topk_ids.shape)} {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise ValueError(f"fused_moe: topk_weights must be float {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)}")
    if arena.dtype != torch.uint8 or arena.dim() != 1:
        raise ValueError(f"fused_moe: arena must be a 1-D uint8 tensor of expert blobs, got {arena.dtype} {tuple(arena.shape)}")
    if offsets.dim() != 1 or offsets.dtype != torch.int64:
        raise ValueError(f"fused_moe: offsets must be int64 [E] (byte offset of each expert blob), got {offsets.dtype}")
    for t in (topk_ids, topk_weights, arena, offsets):
        if t.device != x.device:
            raise ValueError(f"fused_moe: every tensor must be on {x.device}; one is on {t.device}")
    if out is not None and (tuple(out.shape) != (m, hidden) or out.dtype != x.dtype or out.stride(1) != 1):
        raise ValueError(f"fused_moe: out must be {x.dtype} [{m}, {hidden}] with unit column stride")


def fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, arena: torch.Tensor,
              offsets: torch.Tensor, formats, hidden: int, intermediate: int, out: torch.Tensor | None = None,
              backend: str = "auto", config: dict | None = None) -> torch.Tensor:
    """out[m] = sum_j topk_weights[m, j] * expert_{topk_ids[m, j]}(x[m]), SwiGLU experts read packed.

    arena: uint8 tensor holding expert blobs (`formats.expert_layout`); offsets: int64 [E], each a
    multiple of 256 (blobs are placed at 4 KiB multiples); formats: one name for all experts, a name per
    expert, or an `ExpertFormats`. Returns [M, hidden] in x's dtype."""
    _check_moe(x, topk_ids, topk_weights, arena, offsets, hidden, intermediate, out)
    fm = _resolve_formats(formats, offsets.numel(), x.device)
    m, topk = topk_ids.shape
    if out is None:
        out = torch.empty(m, hidden, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    if not _use_triton(x, backend):
        return out.copy_(reference.moe(x, topk_ids, topk_weights, arena, offsets, fm.codes, hidden,
                                       intermediate).to(x.dtype))
    x = x if x.stride(1) == 1 else x.contiguous()
    ids = topk_ids.contiguous()
    wts = topk_weights.contiguous()
    if m > MOE_DECODE_MAX_M:
        cfg = config or config_for("moe_grouped", "mix", m, hidden, intermediate, x.device)
        _moe_grouped(x, ids, wts, arena, offsets, fm, hidden, intermediate, out, cfg)
    else:
        cfg = config or config_for("moe", "mix", m, hidden, intermediate, x.device)
        _moe_decode(x, ids, wts, arena, offsets, fm, hidden, intermediate, out, cfg)
    return out


_COUNTERS: dict[tuple, torch.Tensor] = {}


def _counters(n: int, device: torch.device) -> torch.Tensor:
    """Zeroed int32 counters for the kernels' last-program reductions (K splits of the GEMV and of both
    MoE launches, the down launch's expert sum), kept per device and stream (every kernel leaves them at
    zero again). Calls on one stream are ordered, so they never overlap."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


@dataclass(frozen=True, eq=False)
class MoEScratch:
    """What the gate/up launch leaves for the down launch (and for tests): the token activations on the
    int8 grid (xq int8 [M, HP] held as int32 [M, HP/4], xdx [M, HP/32], xsum [M, 3*HP/32]: `pack_activations`)
    and each (token, expert) pair's h = silu(g) * u on the same kind of grid for its expert's down matrix
    (hq [P, IP/4], hdx [P, IP/32], hsum [P, 3*IP/32]; hf [P, IP] float32 for bf16 experts). HP, IP: hidden
    and intermediate padded to 512."""

    xq: torch.Tensor
    xdx: torch.Tensor
    xsum: torch.Tensor
    hq: torch.Tensor
    hdx: torch.Tensor
    hsum: torch.Tensor
    hf: torch.Tensor


def moe_gate_up(x, ids, arena, offsets, fm: ExpertFormats, hidden: int, inter: int, cfg: dict) -> MoEScratch:
    """Launch 1 of the decode MoE: phase A for x, then gate and up of every pair, h packed for down."""
    m, topk = ids.shape
    dev = x.device
    hp, ip = _cdiv(hidden, 512) * 512, _cdiv(inter, 512) * 512      # padded to every scale unit
    p = m * topk
    sc = MoEScratch(xq=scratch(m, hp // 4, dtype=torch.int32, device=dev),
                    xdx=scratch(m, hp // 32, dtype=torch.float32, device=dev),
                    xsum=scratch(m, 3 * hp // 32, dtype=torch.float32, device=dev),
                    hq=scratch(p, ip // 4, dtype=torch.int32, device=dev),
                    hdx=scratch(p, ip // 32, dtype=torch.float32, device=dev),
                    hsum=scratch(p, 3 * ip // 32, dtype=torch.float32, device=dev),
                    hf=scratch(p, ip if fm.mask >> BF16_CODE & 1 else 1, dtype=torch.float32, device=dev))
    bn1, jchunk = cfg["BN1"], min(cfg["JCHUNK"], topk)
    assert bn1 % 32 == 0 and 512 % bn1 == 0, "gate/up row tile: a multiple of 32 (h is packed per 32) dividing 512"
    nt = ip // bn1
    want = cfg.get("SPLIT1", 1) or max(1, round(_sm_count(dev) * cfg.get("WAVE1", 4) / (nt * p)))
    split, ku = _moe_split(want, hp)
    grid = (nt, m, _cdiv(topk, jchunk) * split)
    gpart = scratch(p, split, 2, ip, dtype=torch.float32, device=dev) if split > 1 else _dummy(dev)
    cnt = _counters(p * nt, dev) if split > 1 else _dummy(dev)
    triton_moe.gate_up_kernel[grid](
        x, x.stride(0), ids, fm.codes, offsets, arena, _layout_table(hidden, inter, str(dev)),
        sc.xq, sc.xdx, sc.xsum, sc.hq, sc.hdx, sc.hsum, sc.hf, gpart, cnt, _probe(cfg, "probe1", dev), m, hidden,
        inter, ku,
        TOPK=topk, FMASK=fm.mask, JCHUNK=jchunk, BN=bn1, SPLIT=split, BK16=cfg["BK16"],
        CHUNK=min(_chunk(cfg, hp), 1 << (ku * 512).bit_length() - 1), NS=cfg.get("NS1", 1),
        USE_ASM=USE_ASM, num_warps=cfg["warps1"], PROBE=int("probe1" in cfg), CG=cfg.get("CG1", 0),
        **_maxnreg(cfg, "MAXNREG1"))
    return sc


def _maxnreg(cfg: dict, key: str) -> dict:
    """The launch's register cap (cfg[key], a sweep candidate; none by default) as a launch option."""
    return {"maxnreg": int(cfg[key])} if cfg.get(key) else {}


def _probe(cfg: dict, key: str, dev) -> torch.Tensor:
    """The int64 buffer [programs, 4] a launch records its programs' SM and times in (cfg[key]: only
    benchmarks/probe_moe.py sets it), or a dummy when the launch is not probed."""
    return cfg[key] if key in cfg else _dummy(dev)


@lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (a small stand-in for the interpreter); read once."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _moe_split(want: int, kp: int) -> tuple[int, int]:
    """(splits, 512-input units per split) for a K split of a padded row of kp inputs: every split
    non-empty, whole 512-input units (every format's scale unit divides 512)."""
    units = kp // 512
    ku = _cdiv(units, max(1, min(int(want), units)))
    return _cdiv(units, ku), ku


def moe_down(sc: MoEScratch, ids, wts, arena, offsets, fm: ExpertFormats, hidden: int, inter: int,
             out: torch.Tensor, cfg: dict) -> None:
    """Launch 2 of the decode MoE: every pair's down projection, weighted and summed into out [M, H]."""
    m, topk = ids.shape
    dev = out.device
    nt = _cdiv(hidden, cfg["BN2"])
    split, ku = _moe_split(cfg.get("SPLIT2", 1), _cdiv(inter, 512) * 512)
    part = scratch(m * topk * split, nt * cfg["BN2"], dtype=torch.float32, device=dev)
    triton_moe.down_kernel[(nt, m, topk * split)](
        ids, wts, fm.codes, offsets, arena, _layout_table(hidden, inter, str(dev)), sc.hq, sc.hdx, sc.hsum, sc.hf,
        part, _counters(m * nt, dev), out, out.stride(0), _probe(cfg, "probe2", dev), hidden, inter, ku, TOPK=topk,
        FMASK=fm.mask, BN=cfg["BN2"], SPLIT=split, BK16=cfg["BK16"], NS=cfg.get("NS2", 1),
        USE_ASM=USE_ASM, num_warps=cfg["warps2"], PROBE=int("probe2" in cfg), CG=cfg.get("CG2", 0),
        **_maxnreg(cfg, "MAXNREG2"))


def _moe_decode(x, ids, wts, arena, offsets, fm: ExpertFormats, hidden, inter, out, cfg) -> None:
    moe_down(moe_gate_up(x, ids, arena, offsets, fm, hidden, inter, cfg), ids, wts, arena, offsets, fm,
             hidden, inter, out, cfg)


def _moe_grouped(x, ids, wts, arena, offsets, fm: ExpertFormats, hidden, inter, out, cfg) -> None:
    triton_gemm.moe_grouped(x, ids, wts, arena, offsets, fm.codes, fm.mask, _layout_table(hidden, inter, str(x.device)),
                            hidden, inter, out, cfg, scratch)
