"""Write one benchmark result as JSON, into the folder the caller names (the format BENCHMARKS.md is built
from: a checkout's benchmarks write into benchmarks/results/, `strata-plan bench --results DIR` wherever asked).

Every result carries: benchmark, date, git_sha, machine (with the GPU name), command, metrics
{name: value}, and optional notes. `python benchmarks/summarize.py` rebuilds BENCHMARKS.md from the
latest result of each benchmark.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("STRATA_GIT_SHA", "unknown")


def machine() -> dict:
    info = {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version()}
    try:
        import torch
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda"] = torch.version.cuda
        else:
            info["gpu"] = "none"
    except ImportError:
        info["gpu"] = "unknown (torch missing)"
    return info


def result_path(benchmark: str, out_dir: str | os.PathLike) -> Path:
    """`<out_dir>/<benchmark>-<UTC timestamp now>.json`: where a benchmark that saves as it goes rewrites its result."""
    now = _dt.datetime.now(_dt.timezone.utc)
    return Path(out_dir) / f"{benchmark}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"


def write_result(benchmark: str, metrics: dict, out_dir: str | os.PathLike, command: str | None = None,
                 notes: str = "", extra: dict | None = None, path: str | os.PathLike | None = None) -> Path:
    """Write `<out_dir>/<benchmark>-<UTC timestamp>.json` (or `path`, replaced atomically: a benchmark saving after
    each run rewrites one file) and return its path."""
    now = _dt.datetime.now(_dt.timezone.utc)
    data = {"benchmark": benchmark, "date": now.isoformat(timespec="seconds"),
            "git_sha": os.environ.get("STRATA_GIT_SHA") or git_sha(), "machine": machine(),
            "command": command or " ".join([Path(sys.executable).name, *sys.argv]),
            "metrics": metrics, "notes": notes}
    if extra:
        data.update(extra)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = Path(path) if path else out / f"{benchmark}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return path
