"""The kernels compile for every GPU the profiles name (sm_80, sm_89, sm_90, sm_120) on this machine, GPU or not.

The CPU tests run the kernels in Triton's interpreter, which accepts some code the compiler refuses (a
Python global read inside a jitted function passed the interpreter and failed on the H200 once). This
builds the real cubin with Triton's bundled ptxas, in a subprocess so the kernels there are compiled, not
interpreted. sm_90 builds every kernel at one format (--quick); the other architectures the decode
kernels the engine calls every token (--smoke, the tier mix). Every kernel at every format and config:
`python -m strata_plan.kernels.compile_check` (all four architectures, a few minutes)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

# never import triton here: in this process it must first be imported with TRITON_INTERPRET=1 (no GPU)
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)


def _compile_check(*args: str) -> str:
    env = {**os.environ, "STRATA_TRITON_COMPILE_ONLY": "1"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-m", "strata_plan.kernels.compile_check", *args], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout


def test_decode_kernels_compile_for_sm80_sm89_sm120():
    out = _compile_check("--smoke", "--fmask", "7", "--arch", "80,89,120")
    for arch in (80, 89, 120):
        assert f"all kernels compiled for sm_{arch}" in out
        assert f"sm_{arch} moe gate_up FMASK=7 SPLIT=1 CG=3" in out and f"sm_{arch} moe down FMASK=7" in out
        gemv = next(line for line in out.splitlines() if line.startswith(f"sm_{arch} gemv code=0"))
        assert int(gemv.split("dp4a")[1].split()[0]) > 0                 # the DP4A path on every one


def test_all_kernels_compile_for_sm90():
    out = _compile_check("--quick", "--sass", "--arch", "90")
    text = "\n".join(line.removeprefix("sm_90 ") for line in out.splitlines())
    assert "all kernels compiled for sm_90" in text
    assert "moe grouped down" in text and "moe gate_up FMASK=31 SPLIT=1 CG=3" in text
    # the Gluon prefill GEMM (never run on CPU: Gluon has no interpreter) builds with its wgmma
    gluon = next(line for line in text.splitlines() if line.startswith("gemm gluon code=0"))
    assert int(gluon.split("wgmma")[1].split()[0]) > 0
    # its output in 16-byte stores (with N unspecialized they were 2-byte ones, and the GEMM ~10% slower),
    # stream-K's fp32 parts in 8-byte ones (pairs of the accumulator's layout), none narrower
    n_st, n_16, n_8 = (int(v) for v in gluon.split("st.global ")[1].split()[0].split("/"))
    assert n_st == n_16 + n_8 and n_16 > 0, gluon
    # two programs an SM: 228 KB of shared memory an SM, 1 KB of it reserved a program
    assert int(gluon.split("shared")[1].split()[0]) <= 113 * 1024, gluon
    # --sass reads the decode GEMV's K loop: its DP4As are there, among the other instructions of a step
    gemv = next(line for line in text.splitlines() if line.startswith("gemv code=0"))
    n, idp = (int(v) for v in gemv.split("loop: ")[1].replace(" SASS,", "").replace(" IDP", "").split())
    assert 0 < idp < n
    assert 0 < int(gemv.split("regs ")[1].split()[0]) <= 255          # registers a thread, from the cubin
