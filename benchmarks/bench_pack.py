"""Benchmark: packing throughput at kimi-k3.1-pro's expert shape, the time to pack the whole seed model, and how
fast a synthetic packed model is built.

1. Quantize: `pack_expert` on this machine's GPU (else CPU) for each format of the seed's 1.92-bpw tier mix
   (and the native-like q4_g128_f16), on random weights of the expert shape (gate, up [3584, 7168], down
   [7168, 3584]); each expert timed to completion (blob back in host memory, as the packer writes it).
   Measured: experts per second and GB of blobs per second per format.
2. The whole model (the seed: 92 MoE layers x 384 experts at the tier mix): experts x measured seconds per
   expert of its format = the quantize time of a whole pack (an estimate from measured per-expert times; reading the source
   checkpoint, about `native_bytes`, is bound by the disk and overlaps with it: stated beside it at --read-gbps).
3. sha256 on one core (GB/s) of an expert-sized buffer: what verification costs per GB.
4. Synthetic: `pack_synthetic` of kimi-k3.1-pro@N moe layers into --dir (default a temporary folder; N from
   --synthetic-layers, 0 skips), timed whole (blobs generated on the GPU, written, hashed, fsynced): GB/s.

    python benchmarks/bench_pack.py [--model kimi-k3.1-pro] [--experts 6] [--synthetic-layers 1] [--dir /var/tmp/synth] [--read-gbps 2.0]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from _result import write_result  # noqa: E402

MODEL = "kimi-k3.1-pro"


def time_quantize(fmt: str, spec, device: str, n: int) -> float:
    """Seconds per expert of pack_expert(fmt) at the spec's shape, blob copied to host (median of n after 1 warm-up)."""
    import torch

    from strata_plan.kernels import pack_expert
    H, I = spec.hidden, spec.moe_intermediate
    gen = torch.Generator(device=device).manual_seed(0)
    times = []
    for i in range(n + 1):
        gate, up = (torch.randn(I, H, generator=gen, device=device) / H ** 0.5 for _ in range(2))
        down = torch.randn(H, I, generator=gen, device=device) / I ** 0.5
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        blob = pack_expert(gate, up, down, fmt).cpu().numpy()
        dt = time.perf_counter() - t0
        assert blob.nbytes == spec.routed_expert_bytes(fmt)
        if i:
            times.append(dt)
    return sorted(times)[len(times) // 2]


def sha256_gbps(nbytes: int) -> float:
    data = os.urandom(nbytes)
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        hashlib.sha256(data).hexdigest()
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def quantize_metrics(spec, mix, device: str, experts: int, read_gbps: float) -> dict:
    """Parts 1 and 2 of the module docstring."""
    from strata_plan.kernels import formats as F
    metrics: dict = {}
    per_expert = {}
    for fmt in (*mix.formats, F.NATIVE_FORMAT):
        s = time_quantize(fmt, spec, device, experts)
        per_expert[fmt] = s
        nb = spec.routed_expert_bytes(fmt)
        metrics[f"experts_per_s_{fmt}"] = round(1 / s, 3)
        metrics[f"blob_GBps_{fmt}"] = round(nb / s / 1e9, 4)
        print(f"{fmt:12s} {1 / s:8.3f} experts/s  {s * 1e3:9.1f} ms/expert  {nb / s / 1e9:.3f} GB/s of blobs (measured)")
    counts = mix.counts(spec.n_routed)
    layer_s = sum(c * per_expert[f] for f, c in zip(mix.formats, counts))
    seed_s = spec.n_moe_layers * layer_s
    n_experts = spec.n_moe_layers * spec.n_routed
    read_s = spec.native_bytes / (read_gbps * 1e9)
    metrics.update({"model_experts": n_experts, "model_mix_experts_per_s": round(n_experts / seed_s, 3),
                    "model_quantize_hours_estimated": round(seed_s / 3600, 3),
                    "model_source_bytes": spec.native_bytes, "model_source_read_hours_at_read_gbps": round(read_s / 3600, 3),
                    "read_gbps_assumed": read_gbps,
                    "model_pack_hours_estimated": round(max(seed_s, read_s) / 3600, 3)})
    print(f"whole {spec.name}: {n_experts} experts, quantize {seed_s / 3600:.2f} h (estimated from the measured "
          f"per-expert times), source read {read_s / 3600:.2f} h at {read_gbps} GB/s (assumed): "
          f"pack ~{max(seed_s, read_s) / 3600:.2f} h")
    return metrics


def main() -> None:
    import torch

    from strata_plan.engine.pack import default_device, formats_from_mix
    from strata_plan.engine.synthetic import pack_synthetic
    from strata_plan.kernels import formats as F
    from strata_plan.core.spec import load_spec
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL, help=f"model spec (default {MODEL}, the seed)")
    ap.add_argument("--experts", type=int, default=6, help="timed experts per format after one warm-up (0: skip)")
    ap.add_argument("--device", default=None, help="default: cuda when there is a GPU")
    ap.add_argument("--synthetic-layers", type=int, default=1, help="MoE layers of the synthetic build (0: skip)")
    ap.add_argument("--dir", help="folder for the synthetic build (default: a temporary folder, removed after)")
    ap.add_argument("--read-gbps", type=float, default=2.0, help="source checkpoint read rate for the stated bound")
    ap.add_argument("--out-dir", help="results folder (default benchmarks/results)")
    args = ap.parse_args()
    device = args.device or default_device()
    spec = load_spec(args.model)
    mix = F.tier_mix(F.SEED_TARGET_BPW)
    metrics: dict = {"model": spec.name, "device": device, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "none",
                     "expert_shape": f"H={spec.hidden} I={spec.moe_intermediate}",
                     "load_avg_1min_at_start": round(os.getloadavg()[0], 2)}
    if args.experts:
        metrics.update(quantize_metrics(spec, mix, device, args.experts, args.read_gbps))
    sha = sha256_gbps(spec.routed_expert_bytes(mix.formats[0]))
    metrics["sha256_GBps_one_core"] = round(sha, 3)
    metrics["sha256_seconds_per_GB_one_core"] = round(1 / sha, 3)
    print(f"sha256: {sha:.2f} GB/s on one core ({1 / sha:.2f} s per GB)")
    if args.synthetic_layers:
        cut = load_spec(args.model, moe_layers=args.synthetic_layers)
        base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="synth-", dir="/var/tmp"))
        out = base / cut.name
        try:
            t0 = time.perf_counter()
            index = pack_synthetic(cut, out, formats_from_mix(cut, F.SEED_TARGET_BPW, None, None), device, seed=0)
            dt = time.perf_counter() - t0
            total = index.expert_bytes + index.dense_nbytes
            metrics.update({"synthetic_model": cut.name, "synthetic_GB": round(total / 1e9, 3),
                            "synthetic_seconds": round(dt, 2), "synthetic_GBps": round(total / dt / 1e9, 3)})
            print(f"synthetic {cut.name}: {total / 1e9:.1f} GB in {dt:.1f} s ({total / dt / 1e9:.2f} GB/s, measured)")
        finally:
            if not args.dir:
                shutil.rmtree(base, ignore_errors=True)
    path = write_result("pack", metrics, out_dir=args.out_dir,
                        notes="experts/s and GB/s measured; model_* hours are estimates from the measured per-expert "
                              "times (quantize) and an assumed source read rate")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
