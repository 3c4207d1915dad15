"""Every kernel compiles for sm_90 (H100/H200) on this machine, GPU or not.

The CPU tests run the kernels in Triton's interpreter, which accepts some code the compiler refuses (a
Python global read inside a jitted function passed the interpreter and failed on the H200 once). This
builds the real cubin with Triton's bundled ptxas, in a subprocess so the kernels there are compiled, not
interpreted."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

# never import triton here: in this process it must first be imported with TRITON_INTERPRET=1 (no GPU)
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)


def test_all_kernels_compile_for_sm90():
    env = {**os.environ, "STRATA_TRITON_COMPILE_ONLY": "1"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-m", "strata_plan.kernels.compile_check", "--quick", "--sass"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "all kernels compiled for sm_90" in r.stdout
    assert "moe grouped down" in r.stdout and "moe gate_up FMASK=31 SPLIT=1 CG=39" in r.stdout
    # the Gluon prefill GEMM (never run on CPU: Gluon has no interpreter) builds with its wgmma
    gluon = next(line for line in r.stdout.splitlines() if line.startswith("gemm gluon code=0"))
    assert int(gluon.split("wgmma")[1].split()[0]) > 0
    # its output in 16-byte stores (with N unspecialized they were 2-byte ones, and the GEMM ~10% slower),
    # stream-K's fp32 parts in 8-byte ones (pairs of the accumulator's layout), none narrower
    n_st, n_16, n_8 = (int(v) for v in gluon.split("st.global ")[1].split()[0].split("/"))
    assert n_st == n_16 + n_8 and n_16 > 0, gluon
    # two programs an SM: 228 KB of shared memory an SM, 1 KB of it reserved a program
    assert int(gluon.split("shared")[1].split()[0]) <= 113 * 1024, gluon
    # --sass reads the decode GEMV's K loop: its DP4As are there, among the other instructions of a step
    gemv = next(line for line in r.stdout.splitlines() if line.startswith("gemv code=0"))
    n, idp = (int(v) for v in gemv.split("loop: ")[1].replace(" SASS,", "").replace(" IDP", "").split())
    assert 0 < idp < n
    assert 0 < int(gemv.split("regs ")[1].split()[0]) <= 255          # registers a thread, from the cubin
