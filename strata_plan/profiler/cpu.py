"""CPU model and core counts (read, not timed)."""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class CpuInfo:
    model: str
    cores: int          # physical
    threads: int        # logical
    source: str


def cpu_info() -> CpuInfo:
    model, source = "", "platform.processor()"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                model, source = line.split(":", 1)[1].strip(), "/proc/cpuinfo"
                break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    threads = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    cores = psutil.cpu_count(logical=False) or threads
    return CpuInfo(model, cores, threads, f"{source}; psutil.cpu_count")
