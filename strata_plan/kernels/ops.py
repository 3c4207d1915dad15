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

import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch

from . import reference
from .formats import FORMATS, expert_layout, get_format
from .quantizer import PackedMatrix
from .triton_common import (BF16_CODE, FORMAT_CODES, INTERPRET, INTERPRETER_OK, USE_ASM, format_constants,
                            tile_words_limit, triton)
from . import launch, triton_gemm, triton_gemv, triton_moe
from .tuned import GemmConfig, GemvConfig, MoEConfig, MoEGroupedConfig, config_for, resolve

GEMV_MAX_M = 8            # decode kernel up to this many rows; the tensor-core GEMM above
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


def _chunk(chunk: int, k: int) -> int:
    """Inputs packed per step of phase A: the config's chunk, or less for short rows (powers of two >= 32)."""
    return min(chunk, max(32, triton.next_power_of_2(k)))


def scratch(*shape: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialized buffer the kernels fill. A seam: the kernel tests replace it with one that fills the
    buffer with garbage, so that a read of an element no kernel wrote shows in the result."""
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
                  backend: str = "auto", config: GemvConfig | GemmConfig | dict | None = None) -> torch.Tensor:
    """x [M, K] @ W^T for a packed W [N, K]: [M, N] in x's dtype, written into `out` if given. config: a
    `GemvConfig` (M <= GEMV_MAX_M) / `GemmConfig`, or a dict of named fields over the shipped one."""
    _check_linear(x, p, out)
    if out is None:
        out = torch.empty(x.shape[0], p.n, dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    if not _use_triton(x, backend):
        return out.copy_(reference.linear(x, p).to(x.dtype))
    x = x if x.stride(1) == 1 else x.contiguous()
    if x.shape[0] <= GEMV_MAX_M:
        _gemv(x, p, out, resolve("gemv", config, config_for("gemv", p.fmt, x.shape[0], p.n, p.k, x.device)))
    else:
        _gemm(x, p, out, resolve("gemm", config, config_for("gemm", p.fmt, x.shape[0], p.n, p.k, x.device)))
    return out


def _matrix_args(p: PackedMatrix) -> list[torch.Tensor]:
    """codes (as int32 words), scales, mins, d, dmin; dummies where absent."""
    if p.format.is_bf16:
        d = _dummy(p.device)
        return [p.weight, d, d, d, d]
    segs = p.segments
    codes = segs["codes"].view(torch.int32)
    return [codes] + [segs.get(n, _dummy(p.device)) for n in _SEGS[1:]]


def pack_activations(x: torch.Tensor, kp: int, chunk: int = 1024):
    """Phase A of the decode GEMV: x [M, K] on the int8 grid over kp >= K inputs (zeros past K), the same
    for every code width. Returns xq int32 [M, kp/4] (the int8 values, four a word), xdx f32 [M, kp/32],
    xsum f32 [M, 3*kp/32] (the exact sums of x per 16 inputs, then per 32)."""
    m, k = x.shape
    xq = scratch(m, kp // 4, dtype=torch.int32, device=x.device)
    xdx = scratch(m, kp // 32, dtype=torch.float32, device=x.device)
    xsum = scratch(m, 3 * kp // 32, dtype=torch.float32, device=x.device)
    triton_gemv.quantize_x_kernel[(m,)](x, x.stride(0), k, kp, xq, xdx, xsum, CHUNK=_chunk(chunk, kp),
                                        num_warps=4)
    return xq, xdx, xsum


def _gemv_split(n: int, row_words: int, bkw: int, cfg: GemvConfig) -> int:
    """K splits of the GEMV: enough (rows x splits) threads to keep HBM busy (at most max_split), whole K
    steps per split."""
    want = cfg.split or max(1, min(cfg.max_split, _cdiv(cfg.threads, n)))
    return max(1, min(want, row_words // bkw))


def _gemv(x: torch.Tensor, p: PackedMatrix, out: torch.Tensor, cfg: GemvConfig) -> None:
    """One launch: every program quantizes its K slice of x, runs phase B, and with a K split the last
    program of each row tile adds the parts (`triton_gemv.gemv_kernel`)."""
    m, k = x.shape
    code = FORMAT_CODES.index(p.fmt)
    c = format_constants(code)
    common = dict(BITS=c["BITS"], GROUP=c["GROUP"], SCALE_BITS=c["SCALE_BITS"], MIN_BITS=c["MIN_BITS"],
                  SB=c["SB"], BN=cfg.rows, BK16=cfg.bf16_block, USE_ASM=USE_ASM, num_warps=cfg.warps)
    nt = _cdiv(p.n, cfg.rows)
    if c["BITS"] == 16:
        d = _dummy(x.device)
        triton_gemv.gemv_kernel[(nt * m,)](
            x, x.stride(0), *_matrix_args(p), d, d, d, d, d, out, out.stride(0), m, p.n, k, 0,
            SPLIT=1, CHUNK=32, **common)
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
    part = scratch(split, m, nt * cfg.rows, dtype=torch.float32, device=dev) if split > 1 else _dummy(dev)
    cnt = _counters(m * nt, dev) if split > 1 else _dummy(dev)
    triton_gemv.gemv_kernel[(nt * split * m,)](
        x, x.stride(0), *_matrix_args(p), xq, xdx, xsum, part, cnt, out, out.stride(0), m, p.n, k, wsplit,
        SPLIT=split, CHUNK=min(_chunk(cfg.chunk, kp), (wsplit * epw) & -(wsplit * epw)),
        CG=cfg.cg, **common, **_maxnreg(cfg.max_registers))


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


def _gluon_ok(x: torch.Tensor, p: PackedMatrix, cfg: GemmConfig) -> bool:
    """The Gluon GEMM (`gluon_gemm`: wgmma, x by TMA) takes this call: asked for by the config (gluon,
    from gluon_min_m rows on), an sm_90 GPU, packed weights, bf16 x laid out as TMA needs (K a multiple
    of 8, rows 16-byte aligned), and a Triton that has it. Anything else runs the Triton GEMM."""
    return (cfg.gluon and x.shape[0] >= cfg.gluon_min_m and not p.format.is_bf16
            and x.dtype == torch.bfloat16 and x.is_cuda and torch.cuda.get_device_capability(x.device) == (9, 0)
            and x.shape[1] % 8 == 0 and x.stride(1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
            and gluon_module() is not None)


def gluon_warps(m: int, k: int, cfg: GemmConfig) -> int:
    """Warps of the Gluon GEMM for x [m, k]: 8 (128-row tiles) from gluon_warps8_min_m rows and
    gluon_warps8_min_k columns on, gluon_warps below."""
    big = m >= cfg.gluon_warps8_min_m and k >= cfg.gluon_warps8_min_k
    return 8 if big else cfg.gluon_warps


def _gemm(x: torch.Tensor, p: PackedMatrix, out: torch.Tensor, cfg: GemmConfig) -> None:
    m, k = x.shape
    c = format_constants(FORMAT_CODES.index(p.fmt))
    if _gluon_ok(x, p, cfg):
        gg, bt = gluon_module(), cfg.gluon_tokens
        nw = gluon_warps(m, k, cfg)
        tiles = gg.tiles(m, p.n, bt, nw)
        # K split (up to gluon_split ways) where the tiles leave SMs idle: one program an SM at most
        split = max(1, min(cfg.gluon_split, _sm_count(x.device) // tiles))
        progs = tiles * split
        part = scratch(gg.part_numel(progs, bt, nw), dtype=torch.float32, device=x.device) if split > 1 else None
        cnt = _counters(tiles, x.device) if split > 1 else None
        gg.gemm_gluon(x, _matrix_args(p), c, p.n, out, bt=bt, ns=cfg.gluon_stages, num_warps=nw, programs=progs,
                      part=part, cnt=cnt)
        return
    bk = _gemm_bk(p.fmt, cfg.block_k)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(p.n, cfg.block_n),)
    triton_gemm.gemm_kernel[grid](x, x.stride(0), *_matrix_args(p), out, out.stride(0), m, p.n, k,
                                  BITS=c["BITS"], GROUP=c["GROUP"], SCALE_BITS=c["SCALE_BITS"],
                                  MIN_BITS=c["MIN_BITS"], SB=c["SB"], BM=cfg.block_m, BN=cfg.block_n, BK=bk,
                                  GROUP_M=cfg.group_m, EVEN_K=k % bk == 0, INTERP=INTERPRET,
                                  DQ=int(cfg.bf16x2_dequant), PFM=int(cfg.prefetch_scales),
                                  num_warps=cfg.warps, num_stages=cfg.stages)


_COUNTERS: dict[tuple, torch.Tensor] = {}


def _counters(n: int, device: torch.device) -> torch.Tensor:
    """Zeroed int32 counters for the last-program reductions of the GEMV's and the Gluon GEMM's K
    splits, kept per device and stream (every kernel leaves them at zero again). Calls on one stream
    are ordered, so they never overlap."""
    key = (str(device), _stream_id(device))
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


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


def _check_moe_static(arena, offsets, hidden, intermediate):
    if hidden <= 0 or intermediate <= 0:
        raise ValueError(f"fused_moe: hidden and intermediate must be positive, got {hidden}, {intermediate}")
    if arena.dtype != torch.uint8 or arena.dim() != 1:
        raise ValueError(f"fused_moe: arena must be a 1-D uint8 tensor of expert blobs, got {arena.dtype} {tuple(arena.shape)}")
    if offsets.dim() != 1 or offsets.dtype != torch.int64:
        raise ValueError(f"fused_moe: offsets must be int64 [E] (byte offset of each expert blob), got {offsets.dtype}")


_ID_DTYPES = (torch.int32, torch.int64)
_U8, _I64 = torch.uint8, torch.int64


def _check_moe(x, topk_ids, topk_weights, arena, offsets, hidden, out):
    """Shapes, dtypes and devices of one call: attribute reads only (no sync, no allocation)."""
    xs = x.shape
    if len(xs) != 2 or xs[1] != hidden or not x.is_floating_point():
        raise ValueError(f"fused_moe: x must be a float tensor [M, hidden={hidden}], got {tuple(xs)} {x.dtype}")
    m = xs[0]
    ks = topk_ids.shape
    if len(ks) != 2 or ks[0] != m or topk_ids.dtype not in _ID_DTYPES:
        raise ValueError(f"fused_moe: topk_ids must be int32/int64 [M={m}, k], got {tuple(ks)} {topk_ids.dtype}")
    if topk_weights.shape != ks or not topk_weights.is_floating_point():
        raise ValueError(f"fused_moe: topk_weights must be float {tuple(ks)}, got {tuple(topk_weights.shape)}")
    dev = x.device
    for t in (topk_ids, topk_weights, arena, offsets):
        if t.device != dev:
            raise ValueError(f"fused_moe: every tensor must be on {dev}; one is on {t.device}")
    if out is not None and (out.shape != (m, hidden) or out.dtype != x.dtype or out.stride(1) != 1
                            or out.device != dev):
        raise ValueError(f"fused_moe: out must be {x.dtype} [{m}, {hidden}] with unit column stride on {dev}")


@dataclass(frozen=True, eq=False)
class MoEScratch:
    """What the gate/up launch leaves for the down launch (and for tests): the token activations on the
    int8 grid (xq int8 [M, HP] held as int32 [M, HP/4], xdx [M, HP/32], xsum [M, 3*HP/32]: `pack_activations`)
    and each (token, expert) pair's h = silu(g) * u on the same kind of grid for its expert's down matrix
    (hq [P, IP/4], hdx [P, IP/32], hsum [P, 3*IP/32]; hf [P, IP] float32 for bf16 experts); the K splits'
    parts (gpart [P, SPLIT1, 2, IP] f32, part [P * SPLIT2, NT2 * BN2] f32) and the launches' zeroed
    counters (every kernel leaves them at zero). HP, IP: hidden and intermediate padded to 512."""

    xq: torch.Tensor
    xdx: torch.Tensor
    xsum: torch.Tensor
    hq: torch.Tensor
    hdx: torch.Tensor
    hsum: torch.Tensor
    hf: torch.Tensor
    gpart: torch.Tensor
    part: torch.Tensor
    cnt1: torch.Tensor
    cnt2: torch.Tensor

    @staticmethod
    def new(m: int, topk: int, hp: int, ip: int, bf16: bool, split1: int, split2: int, nt1: int, nt2: int,
            bn2: int, device) -> "MoEScratch":
        p = m * topk
        f32, i32 = torch.float32, torch.int32
        return MoEScratch(
            xq=torch.empty(m, hp // 4, dtype=i32, device=device), xdx=torch.empty(m, hp // 32, dtype=f32, device=device),
            xsum=torch.empty(m, 3 * hp // 32, dtype=f32, device=device),
            hq=torch.empty(p, ip // 4, dtype=i32, device=device), hdx=torch.empty(p, ip // 32, dtype=f32, device=device),
            hsum=torch.empty(p, 3 * ip // 32, dtype=f32, device=device),
            hf=torch.empty(p, ip if bf16 else 1, dtype=f32, device=device),
            gpart=torch.empty(p * split1 * 2 * ip if split1 > 1 else 1, dtype=f32, device=device),
            part=torch.empty(p * split2, nt2 * bn2, dtype=f32, device=device),
            cnt1=torch.zeros(p * nt1 if split1 > 1 else 1, dtype=i32, device=device),
            cnt2=torch.zeros(m * nt2, dtype=i32, device=device))


def use_scratch(sc: MoEScratch) -> None:
    """A decode call's scratch (fresh, or cached and holding an earlier call's values) just before its
    kernels run: nothing to do. A seam: the kernel tests replace it with one that fills every buffer but
    the counters with garbage, so that a read of an element no kernel wrote shows in the result."""


_SCRATCH: dict[tuple, MoEScratch] = {}


def _stream_id(device: torch.device) -> int:
    """The current stream of `device` as an int (0 on CPU): scratch is shared by the calls of one stream,
    which run in order."""
    return torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0


@dataclass(frozen=True)
class _DecodeLaunch:
    """Everything about one decode call shape that does not change from call to call: grids, K splits,
    the launch options, and the scratch it uses (cached per device, stream and shape)."""
    grid1: tuple
    grid2: tuple
    ku1: int
    ku2: int
    kw1: dict
    kw2: dict
    sc: MoEScratch


@dataclass(frozen=True, eq=False)
class _DecodeCall:
    """The two decode launches of one call shape of a `PreparedMoE`, their fixed arguments resolved once."""
    sc: MoEScratch
    gate_up: launch.Launch
    down: launch.Launch


GATE_UP_LIVE = ("x_p", "stride_xm", "ids_p", "offs_p", "arena_p")      # what changes between calls
DOWN_LIVE = ("ids_p", "wts_p", "offs_p", "arena_p", "out_p", "stride_om")


def _gate_up_args(sc: MoEScratch, x, ids, codes, offsets, arena, table, m: int, hidden: int, inter: int,
                  ku1: int) -> dict:
    """`triton_moe.gate_up_kernel`'s arguments by name (its launch options: `_DecodeLaunch.kw1`)."""
    return dict(x_p=x, stride_xm=x.stride(0), ids_p=ids, codes_p=codes, offs_p=offsets, arena_p=arena, table_p=table,
                xq_p=sc.xq, xdx_p=sc.xdx, xsum_p=sc.xsum, hq_p=sc.hq, hdx_p=sc.hdx, hsum_p=sc.hsum, hf_p=sc.hf,
                gpart_p=sc.gpart, cnt_p=sc.cnt1, M=m, H=hidden, I=inter, KU=ku1)


def _down_args(sc: MoEScratch, ids, wts, codes, offsets, arena, table, out, hidden: int, inter: int,
               ku2: int) -> dict:
    """`triton_moe.down_kernel`'s arguments by name (its launch options: `_DecodeLaunch.kw2`)."""
    return dict(ids_p=ids, wts_p=wts, codes_p=codes, offs_p=offsets, arena_p=arena, table_p=table, hq_p=sc.hq,
                hdx_p=sc.hdx, hsum_p=sc.hsum, hf_p=sc.hf, part_p=sc.part, cnt_p=sc.cnt2, out_p=out,
                stride_om=out.stride(0), H=hidden, I=inter, KU=ku2)


class PreparedMoE:
    """`fused_moe` with everything that does not change between calls resolved once: the expert formats
    (codes on the device and the mask of those present), the layout table, the launch configs, and per
    call shape (tokens, top-k, stream) the grids, the scratch and the two launches' fixed arguments
    (`launch.Launch`). A call then checks shapes and launches two kernels: no host sync, no allocation
    (except `out` when not given). After the first call of a shape, the decode kernels (M <=
    MOE_DECODE_MAX_M) are launched straight from their compiled kernels, skipping Triton's Python
    launcher; `direct=False` keeps every call on `kernel[grid](...)`.

        moe = prepare_moe(formats, n_experts, hidden, intermediate, device)     # once per layer
        moe(x, topk_ids, topk_weights, arena, offsets, out=out)                  # every token

    `fused_moe` keeps one of these per (formats, hidden, intermediate, device) in a small cache, so
    calling it directly costs the same after the first call; pass formats as an `ExpertFormats` (or one
    name, or a tensor of codes) there: a list of names is hashed every call."""

    def __init__(self, fm: ExpertFormats, hidden: int, intermediate: int, device,
                 config: MoEConfig | None = None, grouped_config: MoEGroupedConfig | None = None,
                 direct: bool = True):
        self.fm, self.hidden, self.inter = fm, hidden, intermediate
        self.device = torch.device(device)
        self.n_experts = fm.codes.numel()
        self.table = _layout_table(hidden, intermediate, str(self.device))
        self.hp, self.ip = _cdiv(hidden, 512) * 512, _cdiv(intermediate, 512) * 512
        self.cfg = config or config_for("moe", "mix", 1, hidden, intermediate, self.device)
        self.grouped_cfg = grouped_config or config_for("moe_grouped", "mix", MOE_DECODE_MAX_M + 1, hidden,
                                                        intermediate, self.device)
        self.direct = direct              # False: every decode launch through Triton's launcher
        # a compiled kernel runs on the device it was loaded on: with several GPUs, check the current one
        self._one_gpu = self.device.type != "cuda" or torch.cuda.device_count() == 1
        self._launches: dict[tuple, _DecodeCall] = {}

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, arena: torch.Tensor,
                 offsets: torch.Tensor, out: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
        _check_moe(x, topk_ids, topk_weights, arena, offsets, self.hidden, out)
        if (arena.dtype != _U8 or arena.dim() != 1 or offsets.dtype != _I64 or offsets.dim() != 1
                or offsets.shape[0] != self.n_experts):
            _check_moe_static(arena, offsets, self.hidden, self.inter)
            raise ValueError(f"fused_moe: {self.n_experts} format codes for {offsets.shape[0]} experts (offsets)")
        m = x.shape[0]
        if out is None:
            out = torch.empty(m, self.hidden, dtype=x.dtype, device=x.device)
        if m == 0:
            return out
        if not _use_triton(x, backend):
            return out.copy_(reference.moe(x, topk_ids, topk_weights, arena, offsets, self.fm.codes, self.hidden,
                                           self.inter).to(x.dtype))
        if x.stride(1) != 1:
            x = x.contiguous()
        ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
        wts = topk_weights if topk_weights.is_contiguous() else topk_weights.contiguous()
        if m > MOE_DECODE_MAX_M:
            _moe_grouped(x, ids, wts, arena, offsets, self.fm, self.hidden, self.inter, out, self.grouped_cfg,
                         self.table)
            return out
        stream = _stream_id(x.device)
        key = (m, ids.shape[1], stream)
        d = self._launches.get(key)
        if d is None:
            d = self._launches[key] = self._decode_call(x, ids, wts, arena, offsets, out)
        use_scratch(d.sc)
        if self._one_gpu or torch.cuda.current_device() == x.device.index:
            d.gate_up.launch(stream, x, x.stride(0), ids, offsets, arena)
            d.down.launch(stream, ids, wts, offsets, arena, out, out.stride(0))
        else:
            d.gate_up.triton(x, x.stride(0), ids, offsets, arena)
            d.down.triton(ids, wts, offsets, arena, out, out.stride(0))
        return out

    def launch_mode(self, x, topk_ids, topk_weights, arena, offsets, out) -> str:
        """How a decode call with these arguments launches its two kernels: "direct" (from the compiled
        kernels), "plain" (Triton's launcher), "new" (this shape or specialization not called yet) or
        "mixed" (the two launches differ)."""
        d = self._launches.get((x.shape[0], topk_ids.shape[1], _stream_id(x.device)))
        if d is None:
            return "new"
        modes = {d.gate_up.mode(x, x.stride(0), topk_ids, offsets, arena),
                 d.down.mode(topk_ids, topk_weights, offsets, arena, out, out.stride(0))}
        return modes.pop() if len(modes) == 1 else "mixed"

    def _decode_call(self, x, ids, wts, arena, offsets, out) -> _DecodeCall:
        """The launches of this call's shape (the live arguments of this first call stand for every call's)."""
        m, topk = ids.shape
        ln = _decode_launch(m, topk, self.fm, self.hidden, self.inter, self.cfg, x.device)
        sc, codes, table, h, i = ln.sc, self.fm.codes, self.table, self.hidden, self.inter
        gate_up = launch.Launch(triton_moe.gate_up_kernel, ln.grid1,
                                {**_gate_up_args(sc, x, ids, codes, offsets, arena, table, m, h, i, ln.ku1), **ln.kw1},
                                GATE_UP_LIVE, self.direct)
        down = launch.Launch(triton_moe.down_kernel, ln.grid2,
                             {**_down_args(sc, ids, wts, codes, offsets, arena, table, out, h, i, ln.ku2), **ln.kw2},
                             DOWN_LIVE, self.direct)
        return _DecodeCall(sc, gate_up, down)


def _decode_launch(m: int, topk: int, fm: ExpertFormats, hidden: int, inter: int, cfg: MoEConfig, dev,
                   fresh: bool = False) -> _DecodeLaunch:
    """Grids, K splits and launch options of the two decode launches for m tokens of topk experts, and
    their scratch: shared by every call of this shape on this device and stream (fresh: its own)."""
    hp, ip = _cdiv(hidden, 512) * 512, _cdiv(inter, 512) * 512      # padded to every scale unit
    bn1, bn2 = cfg.rows1, cfg.rows2
    assert bn1 % 32 == 0 and 512 % bn1 == 0, "gate/up row tile: a multiple of 32 (h is packed per 32) dividing 512"
    nt1, nt2 = ip // bn1, _cdiv(hidden, bn2)
    want = cfg.split1 or max(1, round(_sm_count(dev) * cfg.wave1 / (nt1 * m * topk)))
    split1, ku1 = _moe_split(want, hp)
    split2, ku2 = _moe_split(cfg.split2, ip)
    bf16 = bool(fm.mask >> BF16_CODE & 1)
    skey = (str(dev), _stream_id(dev), m, topk, hp, ip, bf16, split1, split2, nt1, nt2, bn2)
    sc = None if fresh else _SCRATCH.get(skey)
    if sc is None:
        sc = MoEScratch.new(m, topk, hp, ip, bf16, split1, split2, nt1, nt2, bn2, dev)
        if not fresh:
            _SCRATCH[skey] = sc
    kw1 = dict(TOPK=topk, FMASK=fm.mask, BN=bn1, SPLIT=split1, BK16=cfg.bf16_block,
               CHUNK=min(_chunk(cfg.chunk, hp), 1 << (ku1 * 512).bit_length() - 1), USE_ASM=USE_ASM,
               num_warps=cfg.warps1, CG=cfg.cg1, **_maxnreg(cfg.max_registers1))
    kw2 = dict(TOPK=topk, FMASK=fm.mask, BN=bn2, SPLIT=split2, BK16=cfg.bf16_block, USE_ASM=USE_ASM,
               num_warps=cfg.warps2, CG=cfg.cg2, **_maxnreg(cfg.max_registers2))
    return _DecodeLaunch(grid1=(nt1, m, topk * split1), grid2=(nt2, m, topk * split2), ku1=ku1, ku2=ku2,
                         kw1=kw1, kw2=kw2, sc=sc)


_PREPARED: dict[tuple, PreparedMoE] = {}
_TENSOR_FORMATS: dict[int, tuple] = {}


def _formats_of_tensor(codes: torch.Tensor, device) -> ExpertFormats:
    """ExpertFormats of a tensor of format codes, computed once per tensor (and per in-place change: its
    version counter), since the mask of the codes present costs a device sync."""
    hit = _TENSOR_FORMATS.get(id(codes))
    if hit is not None and hit[0]() is codes and hit[1] == codes._version:
        return hit[2]
    c = codes.to(device=device, dtype=torch.int32)
    mask = 0
    for v in torch.unique(c).tolist():
        mask |= 1 << int(v)
    fm = ExpertFormats(c, mask)
    if len(_TENSOR_FORMATS) > 256:
        _TENSOR_FORMATS.clear()
    _TENSOR_FORMATS[id(codes)] = (weakref.ref(codes), codes._version, fm)
    return fm


@lru_cache(maxsize=64)
def _one_format(name: str, n_experts: int, device: str) -> ExpertFormats:
    return ExpertFormats.from_names((name,) * n_experts, device)


def _resolve_formats(formats, n_experts: int, device) -> ExpertFormats:
    if isinstance(formats, ExpertFormats):
        if formats.codes.numel() != n_experts:
            raise ValueError(f"fused_moe: {formats.codes.numel()} format codes for {n_experts} experts")
        return formats
    if isinstance(formats, str):
        return _one_format(formats, n_experts, str(device))
    if isinstance(formats, torch.Tensor):
        if formats.numel() != n_experts:
            raise ValueError(f"fused_moe: {formats.numel()} format codes for {n_experts} experts")
        return _formats_of_tensor(formats, device)
    names = tuple(formats)
    if len(names) != n_experts:
        raise ValueError(f"fused_moe: {len(names)} formats for {n_experts} experts (offsets)")
    return ExpertFormats.from_names(names, device)


def prepare_moe(formats, n_experts: int, hidden: int, intermediate: int, device,
                config: MoEConfig | None = None, grouped_config: MoEGroupedConfig | None = None) -> PreparedMoE:
    """The `PreparedMoE` for these formats (one name, a name per expert, an `ExpertFormats` or a tensor
    of format codes), shapes and device; cached unless a config is given (then this GPU's shipped
    configs: `tuned.config_for`)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    fm = _resolve_formats(formats, n_experts, dev)
    if config is not None or grouped_config is not None:
        return PreparedMoE(fm, hidden, intermediate, dev, config, grouped_config)
    key = (fm, hidden, intermediate, dev)
    pm = _PREPARED.get(key)
    if pm is None:
        if len(_PREPARED) > 1024:
            _PREPARED.clear()
        pm = _PREPARED[key] = PreparedMoE(fm, hidden, intermediate, dev)
    return pm


def fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, arena: torch.Tensor,
              offsets: torch.Tensor, formats, hidden: int, intermediate: int, out: torch.Tensor | None = None,
              backend: str = "auto", config: MoEConfig | MoEGroupedConfig | dict | None = None) -> torch.Tensor:
    """out[m] = sum_j topk_weights[m, j] * expert_{topk_ids[m, j]}(x[m]), SwiGLU experts read packed.

    arena: uint8 tensor holding expert blobs (`formats.expert_layout`); offsets: int64 [E], each a
    multiple of 256 (blobs are placed at 4 KiB multiples); formats: one name for all experts, a name per
    expert, an `ExpertFormats` or a tensor of format codes. topk_ids may hold -1: that pair is skipped
    (contributes nothing). Returns [M, hidden] in x's dtype. The formats, tables, configs and scratch
    are resolved once and cached (`PreparedMoE`). `config` (a sweep's candidate: a `MoEConfig` for
    M <= MOE_DECODE_MAX_M, a `MoEGroupedConfig` above, or a dict of named fields over the shipped one of
    the path the call takes) bypasses that cache."""
    if config is None:                 # the engine's calls (ExpertFormats, or a tensor of codes): one lookup
        fm = _formats_of_tensor(formats, x.device) if isinstance(formats, torch.Tensor) else formats
        pm = _PREPARED.get((fm, hidden, intermediate, x.device)) if fm.__class__ is ExpertFormats else None
        if pm is not None:
            return pm(x, topk_ids, topk_weights, arena, offsets, out=out, backend=backend)
    _check_moe_static(arena, offsets, hidden, intermediate)
    if config is not None:
        kind = "moe" if x.shape[0] <= MOE_DECODE_MAX_M else "moe_grouped"
        cfg = resolve(kind, config, config_for(kind, "mix", x.shape[0], hidden, intermediate, x.device))
        pm = PreparedMoE(_resolve_formats(formats, offsets.numel(), x.device), hidden, intermediate, x.device,
                         cfg if kind == "moe" else None, cfg if kind == "moe_grouped" else None)
    else:
        pm = prepare_moe(formats, offsets.shape[0], hidden, intermediate, x.device)
    return pm(x, topk_ids, topk_weights, arena, offsets, out=out, backend=backend)


def _maxnreg(cap: int) -> dict:
    """A launch's register cap (0: none) as a launch option."""
    return {"maxnreg": int(cap)} if cap else {}


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


def moe_gate_up(x, ids, arena, offsets, fm: ExpertFormats, hidden: int, inter: int, cfg: MoEConfig | dict | None,
                fresh: bool = False) -> MoEScratch:
    """Launch 1 of the decode MoE on its own (tests, benchmarks): phase A for x, then gate and up of every
    pair, h packed for down. Returns the scratch holding it (fresh: not the shared cached one)."""
    m, topk = ids.shape
    cfg = resolve("moe", cfg, config_for("moe", "mix", m, hidden, inter, x.device))
    ln = _decode_launch(m, topk, fm, hidden, inter, cfg, x.device, fresh)
    sc = ln.sc
    use_scratch(sc)
    table = _layout_table(hidden, inter, str(x.device))
    triton_moe.gate_up_kernel[ln.grid1](**_gate_up_args(sc, x, ids, fm.codes, offsets, arena, table, m, hidden, inter,
                                                        ln.ku1), **ln.kw1)
    return sc


def moe_down(sc: MoEScratch, ids, wts, arena, offsets, fm: ExpertFormats, hidden: int, inter: int,
             out: torch.Tensor, cfg: MoEConfig | dict | None) -> None:
    """Launch 2 of the decode MoE on its own: every pair's down projection, weighted and summed into out."""
    m, topk = ids.shape
    cfg = resolve("moe", cfg, config_for("moe", "mix", m, hidden, inter, out.device))
    ln = _decode_launch(m, topk, fm, hidden, inter, cfg, out.device)
    table = _layout_table(hidden, inter, str(out.device))
    triton_moe.down_kernel[ln.grid2](**_down_args(sc, ids, wts, fm.codes, offsets, arena, table, out, hidden, inter,
                                                  ln.ku2), **ln.kw2)


def _moe_grouped(x, ids, wts, arena, offsets, fm: ExpertFormats, hidden, inter, out, cfg, table=None) -> None:
    triton_gemm.moe_grouped(x, ids, wts, arena, offsets, fm.codes, fm.mask,
                            table if table is not None else _layout_table(hidden, inter, str(x.device)),
                            hidden, inter, out, cfg, scratch)
