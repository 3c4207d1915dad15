"""Packed expert formats and the kernels that read them.

`formats` (byte layouts) has no heavy imports. The quantizer and Triton kernels load on first use, so
`from strata_plan.kernels import formats` works where torch or triton are missing.
"""
from __future__ import annotations

import importlib
from typing import Any

# (the quantizer lives in `quantizer.py`: a submodule named `quantize` would shadow the function once imported)
_LAZY = {"quantize": "quantizer", "dequantize": "quantizer", "packed_linear": "ops", "fused_moe": "ops",
         "PackedMatrix": "quantizer", "pack_expert": "quantizer", "unpack_expert": "quantizer"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["quantize", "dequantize", "packed_linear", "fused_moe", "PackedMatrix", "pack_expert", "unpack_expert"]
