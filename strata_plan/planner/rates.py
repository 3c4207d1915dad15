"""GPU kernel rates the cost model charges, each with where it comes from (measured or which estimate).

Decode: the fused MoE call the engine makes (one layer's top-k experts in the tier mix, both launches),
read from the profile's `fused_moe_decode` at the model's layer bytes (k experts of the mix at the model's
hidden x moe_intermediate), never above HBM. Without it: the profile's single-matrix GEMV `kernel_gbps`
per format (an estimate for the fused call: one 16384 x 7168 matrix, not a layer of k experts), else
`hbm_gbps x hbm_efficiency` (the calibration's estimate).

Prefill: every touched expert's packed weights are expanded once a chunk (3 x hidden x intermediate
weights); the rate in weights a second comes from the profile's `fused_moe_prefill` at the chunk length
and the nearest measured expert shape. Without it: the H200's measured rate (REFERENCE_EXPANSION) scaled by
this GPU's bf16 TFLOPS over the H200's datasheet figure (an estimate: expansion runs on the same ALUs and
tensor cores; other GPUs run the portable Triton path, not the H200's Gluon kernel).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REFERENCE_EXPANSION = {"tokens": (512, 2048), "gweights_s": (2014.2, 1820.3), "bf16_tflops": 989.0,
                       "source": "H200 fused MoE prefill of a whole kimi-k3.1-pro layer (384 experts, top-8), "
                                 "benchmarks/results/kernels-moe-prefill-20261202T071457Z.json"}
"""The fused MoE prefill measured on an H200 (14.7 / 16.3 ms at M = 512 / 2048): the reference the expansion
estimate of other GPUs scales from, by their bf16_tflops over the H200's datasheet dense BF16 (989, as the
H100 SXM's; the shipped profiles carry datasheet figures, so like is divided by like)."""


@dataclass(frozen=True)
class Rate:
    """One rate with its provenance: `measured`, `datasheet` or `estimate`, and what it is."""

    value: float                # bytes/s (decode) or weights/s (expansion)
    provenance: str
    source: str

    @property
    def estimated(self) -> bool:
        return self.provenance == "estimate"


def layer_bytes(problem) -> float:
    """Packed bytes of one layer's top-k experts in the tier mix (what the fused MoE profiler point counts)."""
    spec = problem.spec
    return float(sum(spec.routed_expert_bytes(f) for f in problem.mix.names(spec.top_k)))


def decode_rates(problem, gpu=None) -> dict[str, Rate]:
    """Bytes/s the fused MoE decode call streams each tier format at (never above HBM)."""
    gpu, cal = gpu or problem.profile.gpu, problem.profile.calibration
    hbm = gpu.hbm_gbps.value * 1e9
    if gpu.fused_moe_decode is not None:
        fm = gpu.fused_moe_decode
        b = layer_bytes(problem)
        r = Rate(min(fm.at(b) * 1e9, hbm), fm.provenance,
                 f"fused MoE decode at {b / 1e6:.1f} MB a layer (profile fused_moe_decode: {fm.source})")
        return {f: r for f in problem.mix.formats}
    out = {}
    for f in problem.mix.formats:
        fig = gpu.kernel_gbps.get(f)
        if fig is not None:
            out[f] = Rate(min(fig.value * 1e9, hbm), "estimate",
                          f"single-matrix GEMV kernel_gbps[{f}] ({fig.provenance}) standing in for the fused MoE call")
        else:
            out[f] = Rate(hbm * cal.hbm_efficiency.value, "estimate",
                          f"hbm_gbps x hbm_efficiency {cal.hbm_efficiency.value:g} ({cal.hbm_efficiency.provenance})")
    return out


def expansion_rate(problem, gpu=None) -> Rate:
    """Weights/s the fused MoE prefill call expands packed experts at, for this chunk length."""
    gpu, spec, C = gpu or problem.profile.gpu, problem.spec, problem.prefill_chunk
    fm = gpu.fused_moe_prefill
    if fm is not None:
        return Rate(fm.at(spec.expert_params, C) * 1e9, fm.provenance,
                    f"fused MoE prefill at {C} tokens (profile fused_moe_prefill: {fm.source})")
    ref = REFERENCE_EXPANSION
    x = np.log(np.clip(C, ref["tokens"][0], ref["tokens"][-1]))
    g = float(np.interp(x, np.log(ref["tokens"]), ref["gweights_s"]))
    scale = gpu.bf16_tflops.value / ref["bf16_tflops"]
    return Rate(g * scale * 1e9, "estimate",
                f"{ref['source']}, scaled by bf16 TFLOPS {gpu.bf16_tflops.value:g} / {ref['bf16_tflops']:g}")
