"""The quantizer's error table: each packed format against plain round-to-nearest at the nearest lower
or equal bit rate, on random and heavy-tailed weights.

    python -m strata_plan.kernels.quality [--n 1024 --k 4096 --seed 0]   (prints a markdown table)

Error = ||x W_hat^T - x W^T|| / ||x W^T|| over random activations x. The baselines are min/max
round-to-nearest with an fp16 scale and zero per group (`reference.rtn_minmax`). The "decode path" column
adds the decode kernels' int8 activation grid (`reference.linear_q8`): the error the fused GEMV reports.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from .formats import get_format
from .quantizer import dequantize, quantize
from .reference import linear_q8, relative_output_error, rtn_minmax

# format -> (bits, group) of the baseline: the nearest lower-or-equal bit rate with fp16 scale and zero
BASELINES = {
    "q2_g16_s8m4": (2, 64),     # 2.8125 bpw vs 2.5
    "q2_g32_s8m8": (2, 64),     # 2.5625 vs 2.5
    "q1_g32_s8m4": (1, 128),    # 1.4375 vs 1.25
    "q4_g128_f16": (4, 128),    # 4.25 vs 4.25 (same storage)
}
DISTRIBUTIONS = ("normal", "student-t3")


def sample_weights(dist: str, n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """Weights with the scale of a trained layer: normal, or Student-t with 3 degrees of freedom."""
    if dist == "normal":
        return torch.randn(n, k, generator=generator) * 0.02
    if dist == "student-t3":
        z = torch.randn(n, k, generator=generator)
        chi2 = torch.randn(n, k, 3, generator=generator).pow(2).sum(-1)
        return z / (chi2 / 3).sqrt() * 0.02
    raise ValueError(f"unknown distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")


@dataclass(frozen=True)
class ErrorRow:
    dist: str
    fmt: str
    error: float             # our quantizer, exact activations
    decode_error: float      # our quantizer, through the decode kernels' int8 activation grid
    baseline_bits: int
    baseline_group: int
    baseline_error: float

    @property
    def bpw(self) -> float:
        return get_format(self.fmt).bpw

    @property
    def baseline_bpw(self) -> float:
        return self.baseline_bits + 32 / self.baseline_group

    @property
    def passes(self) -> bool:
        return self.error <= self.baseline_error


def error_table(n: int = 1024, k: int = 4096, seed: int = 0, n_act: int = 64,
                formats=tuple(BASELINES), dists=DISTRIBUTIONS) -> list[ErrorRow]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for dist in dists:
        w = sample_weights(dist, n, k, g)
        x = torch.randn(n_act, k, generator=g)
        ref = x.double() @ w.double().T
        for fmt in formats:
            bits, group = BASELINES[fmt]
            p = quantize(w, fmt)
            err = relative_output_error(w, dequantize(p), x)
            dec = float((linear_q8(x, p) - ref).norm() / ref.norm())
            base = relative_output_error(w, rtn_minmax(w, bits, group), x)
            rows.append(ErrorRow(dist, fmt, err, dec, bits, group, base))
    return rows


def markdown(rows: list[ErrorRow]) -> str:
    out = ["| weights | format | bpw | error | decode path | baseline (RTN min/max, fp16 scale+zero) | bpw | error | ours / baseline |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.dist} | {r.fmt} | {r.bpw:.4f} | {r.error:.4f} | {r.decode_error:.4f} | "
                   f"{r.baseline_bits}-bit g{r.baseline_group} | {r.baseline_bpw:.4f} | {r.baseline_error:.4f} | "
                   f"{r.error / r.baseline_error:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rows = error_table(a.n, a.k, a.seed)
    print(f"relative output error, W [{a.n}, {a.k}], 64 random activation rows, seed {a.seed}\n")
    print(markdown(rows))
    return 0 if all(r.passes for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
