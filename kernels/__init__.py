"""Packed expert formats and the kernels that read them.

`formats` (byte layouts) has no heavy imports. The quantizer and Triton kernels load on first use, so
`from strata_plan.kernels import formats` works where torch or triton are missing.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"quantize": "quantize", "dequantize": "quantize", "packed_linear": "ops", "fused_moe": "ops"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["quantize", "dequantize", "packed_linear", "fused_moe"]
