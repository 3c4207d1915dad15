"""Launch configurations: named, frozen, with defaults that are right everywhere and per-GPU data files.

    config_for(kind, fmt, m, n, k, device) -> GemvConfig | GemmConfig | MoEConfig | MoEGroupedConfig

kind is "gemv" (decode GEMV), "gemm" (prefill GEMM), "moe" (fused MoE decode) or "moe_grouped" (fused
MoE prefill). The tuned values live in `kernels/configs/<gpu>.json` (package data), one file per GPU,
written by `benchmarks/bench_kernels.py --sweep` with the result file and commit they came from
(`config_file`). A GPU is matched by its exact device name (`torch.cuda.get_device_name`, case aside) against
the file's "gpu", as vLLM keys its fused-MoE configs; a GPU without a file of its own (another name, e.g. an
H100 or an "NVIDIA H200 NVL") gets the file of its compute capability (an H100 gets the H200's sm_90 configs)
with one logged line, and the defaults otherwise (and on CPU). An entry "kind:fmt" (e.g.
"gemv:q4_g128_f16") overrides "kind" for one format. Why each shipped value won: KERNELS.md, and the
result files behind them in each config file's "source".
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
log = logging.getLogger("strata_plan.kernels")


def _cg(dp4a_block: bool, clamp_rows: bool) -> int:
    """The decode kernels' code-generation constexpr CG (triton_common.gemv_rows): bit 0 the DP4A chain
    as one PTX block a word, bit 1 rows past N clamped instead of masked."""
    return int(dp4a_block) | int(clamp_rows) << 1


@dataclass(frozen=True)
class GemvConfig:
    """Decode GEMV (M <= 8): `rows` of W per program (a warp covers 32 / W4 rows of a K step, W4 = 8
    threads per row for 2-bit codes, 4 for 1- and 4-bit), K split over programs to reach `threads`
    (at most `max_split`; `split` > 0 forces it), `chunk` inputs per step of phase A, `bf16_block` the
    K block of plain bf16 matrices; the K loop's code generation: `dp4a_block` (the DP4A chain as one
    PTX block a word), `clamp_rows` (rows past N clamped, not masked), `max_registers` (0: no cap)."""
    rows: int = 64
    warps: int = 4
    threads: int = 65536
    max_split: int = 8
    split: int = 0
    chunk: int = 1024
    bf16_block: int = 128
    dp4a_block: bool = False
    clamp_rows: bool = False
    max_registers: int = 0

    @property
    def cg(self) -> int:
        return _cg(self.dp4a_block, self.clamp_rows)


@dataclass(frozen=True)
class GemmConfig:
    """Prefill GEMM: the Triton kernel's tiles (`block_m` x `block_n`, K step `block_k`, `group_m`
    tiles tall for L2 reuse), warps, pipeline stages, `bf16x2_dequant` (two codes a register through
    bf16x2 FMAs), `prefetch_scales` (a K tile's scale bytes loaded a step ahead); and on sm_90 the Gluon
    kernel (`gluon`, from `gluon_min_m` rows): `gluon_tokens` a tile, `gluon_stages` x stages,
    `gluon_warps` (8 from `gluon_warps8_min_m` rows and `gluon_warps8_min_k` columns on), a K split up to
    `gluon_split` ways where the tiles leave SMs idle."""
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    warps: int = 4
    stages: int = 4
    bf16x2_dequant: bool = False
    prefetch_scales: bool = False
    gluon: bool = False
    gluon_min_m: int = 1
    gluon_tokens: int = 256
    gluon_stages: int = 3
    gluon_warps: int = 4
    gluon_warps8_min_m: int = 1 << 62
    gluon_warps8_min_k: int = 0
    gluon_split: int = 1


@dataclass(frozen=True)
class MoEConfig:
    """Fused MoE decode (M <= 16): gate/up launch (`rows1` rows of I a program, `warps1`, `split1` K
    splits of H: 0 = enough to fill `wave1` programs an SM) and down launch (`rows2` rows of H, `warps2`,
    `split2` K splits of I); `chunk` inputs per step of phase A; `bf16_block` the K block of bf16
    experts; each launch's K loop code generation as in `GemvConfig`."""
    rows1: int = 64
    warps1: int = 4
    split1: int = 1
    wave1: int = 4
    rows2: int = 64
    warps2: int = 4
    split2: int = 1
    chunk: int = 1024
    bf16_block: int = 128
    dp4a_block1: bool = False
    clamp_rows1: bool = False
    max_registers1: int = 0
    dp4a_block2: bool = False
    clamp_rows2: bool = False
    max_registers2: int = 0

    @property
    def cg1(self) -> int:
        return _cg(self.dp4a_block1, self.clamp_rows1)

    @property
    def cg2(self) -> int:
        return _cg(self.dp4a_block2, self.clamp_rows2)


@dataclass(frozen=True)
class MoEGroupedConfig:
    """Fused MoE prefill (grouped GEMMs, M > 16): tiles as `GemmConfig`'s Triton kernel."""
    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    warps: int = 4
    stages: int = 3
    bf16x2_dequant: bool = False
    prefetch_scales: bool = False


KINDS = {"gemv": GemvConfig, "gemm": GemmConfig, "moe": MoEConfig, "moe_grouped": MoEGroupedConfig}
Config = GemvConfig | GemmConfig | MoEConfig | MoEGroupedConfig


def make(kind: str, values: dict | None = None, base: Config | None = None) -> Config:
    """A config of `kind` from named values over `base` (the defaults if none); an unknown name is an
    error, so a typo never silently runs the defaults."""
    cls = KINDS[kind]
    names = {f.name for f in fields(cls)}
    bad = sorted(set(values or {}) - names)
    if bad:
        raise ValueError(f"{kind} config: unknown field(s) {bad}; fields are {sorted(names)}")
    return replace(base if base is not None else cls(), **(values or {}))


def resolve(kind: str, config, shipped: Config) -> Config:
    """A call's `config` argument: a full config of the kind, or a dict of named fields over `shipped`."""
    if config is None:
        return shipped
    if isinstance(config, KINDS[kind]):
        return config
    if isinstance(config, dict):
        return make(kind, config, shipped)
    raise TypeError(f"{kind} config must be a {KINDS[kind].__name__} or a dict of its fields, got {type(config)}")


# ------------------------------------------------------------------------------------ per-GPU data files

def load_config_file(path: Path) -> dict:
    """A configs/<gpu>.json file: {"gpu", "arch", "source": {...}, "configs": {kind: {...}}},
    every entry checked against its dataclass."""
    data = json.loads(Path(path).read_text())
    for key, values in data["configs"].items():
        make(key.split(":")[0], values)
    return data


@lru_cache(maxsize=1)
def config_files() -> tuple[dict, ...]:
    return tuple(load_config_file(p) for p in sorted(CONFIG_DIR.glob("*.json")))


def config_file(gpu: str, arch: str, configs: dict[str, Config | dict], result: str, commit: str) -> dict:
    """The data of a configs/<gpu>.json file (what the tuner writes): only the fields that differ from
    the defaults, with the result file and commit the winners came from."""
    out = {}
    for key, cfg in configs.items():
        d = asdict(cfg) if not isinstance(cfg, dict) else dict(cfg)
        base = asdict(KINDS[key.split(":")[0]]())
        out[key] = {k: v for k, v in d.items() if base.get(k) != v}
    return {"gpu": gpu, "arch": arch, "source": {"result": result, "commit": commit},
            "configs": out}


@lru_cache(maxsize=16)
def gpu_entries(name: str, arch: str) -> dict:
    """The tuned entries for a GPU of this device name (lowercased) and architecture ("sm_90"): the file of
    exactly that name, else the first file of its architecture (logged once), else none."""
    files = config_files()
    for f in files:
        if f["gpu"].lower() == name:
            return f["configs"]
    for f in files:
        if f["arch"] == arch:
            log.warning("kernels: no tuned configs for %r; using %s's (same architecture %s)", name, f["gpu"], arch)
            return f["configs"]
    log.warning("kernels: no tuned configs for %r (%s); using the defaults", name, arch)
    return {}


@lru_cache(maxsize=16)
def _device_key(device: torch.device) -> tuple[str, str] | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return torch.cuda.get_device_name(device).lower(), f"sm_{major}{minor}"


@lru_cache(maxsize=512)
def _config(kind: str, fmt: str, small_m: int, key: tuple[str, str] | None) -> Config:
    entries = gpu_entries(*key) if key is not None else {}
    cfg = make(kind, entries.get(kind), None)
    cfg = make(kind, entries.get(f"{kind}:{fmt}"), cfg)          # a format's own winner, if it has one
    if kind == "gemm" and small_m < cfg.block_m:
        cfg = replace(cfg, block_m=small_m, warps=4)
    return cfg


def config_for(kind: str, fmt: str, m: int, n: int, k: int, device) -> Config:
    """The launch config for one call (frozen: derive others with `make(kind, {...}, base)`)."""
    small_m = 16 if m <= 16 else 64 if m <= 64 else 1 << 30      # the GEMM's BM drops for small M
    return _config(kind, fmt, small_m if kind == "gemm" else 0, _device_key(torch.device(device)))
