"""Shared test fixtures: paths to the repository, the shared data folder beside it, and a CLI runner."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def _triton_interpreter_without_gpu() -> None:
    """The Triton kernels run in Triton's interpreter where there is no GPU. Triton reads TRITON_INTERPRET
    when it is first imported, so it is set here, before any test module can import triton. Under
    pytest-xdist each worker gets its share of the cores for torch's threads."""
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:            # pytest-xdist: split the cores between the workers instead of oversubscribing
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


_triton_interpreter_without_gpu()


@pytest.fixture
def shared_data() -> Path:
    d = SHARED / "data"
    if not d.is_dir():
        pytest.skip(f"{d} not present (the shared data folder lies beside the checkout)")
    return d


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `strata-plan ARGS` in a fresh interpreter, as a user would."""
    return subprocess.run([sys.executable, "-m", "strata_plan.cli", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models on a busy 2-core runner: a second torch thread only spins (the fixture's decode step
    measured 100x slower with 2 threads than with 1 while other jobs ran)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
