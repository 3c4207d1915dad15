"""Host time of one eager `fused_moe` call, as the engine makes it: once per MoE layer per token.

    python benchmarks/bench_moe_host.py [--out-dir OUT] [--calls 200] [--rounds 7]

One kimi-k3.1-pro layer (hidden 7168, intermediate 3584) of 384 experts in the seed's tier mix, top-8,
batch 1 and 4. The GPU is kept busy the whole time (`torch.cuda._sleep` queued ahead of the calls), so
every launch returns as soon as it is queued: the time measured with a host timer (perf_counter) over
`--calls` back-to-back calls is the host's own work per call (argument checks, format and config
lookups, scratch, the two Triton launches), not the kernels'. A round whose sleep had already ended when
the calls were done is not counted (the GPU must still be busy at the end: its event not yet reached).

Rows: `fused_moe` with an `ExpertFormats` (what the engine passes), with a list of 384 names (hashed
every call), and a `PreparedMoE` called directly, each launching the compiled kernels directly
(`strata_plan/kernels/launch.py`, the default); beside the last, a `PreparedMoE` made with `direct=False`
(`_plain`: every call through Triton's launcher, `kernel[grid](...)`), and their ratio. The launch mode
the calls actually took is recorded (`launch_mode_m*`: "plain" where this Triton cannot launch directly). The first call of a shape (it
compiles) is reported apart. Target (issue 27): under 30 us a call at batch 1, `fused_moe` with an
`ExpertFormats`, direct. The kernels' own time (graph-timed) is bench_kernels.py's.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

import torch  # noqa: E402

from _result import write_result  # noqa: E402
from strata_plan.kernels import bench as B  # noqa: E402
from strata_plan.kernels import ops  # noqa: E402
from strata_plan.kernels.triton_common import triton  # noqa: E402
from strata_plan.kernels.formats import tier_mix  # noqa: E402

HIDDEN, INTER, EXPERTS, TOPK = 7168, 3584, 384, 8
TARGET_US = 30.0


def _busy_ms_cycles(ms: float) -> int:
    """GPU clock cycles for about `ms` milliseconds of torch.cuda._sleep (read from the SM clock)."""
    mhz = torch.cuda.get_device_properties(0).clock_rate / 1e3 if hasattr(
        torch.cuda.get_device_properties(0), "clock_rate") else 2000.0
    return int(ms * 1e3 * mhz)


def host_us(call, calls: int, rounds: int, sleep_cycles: int) -> dict:
    """Median host microseconds a call over `rounds` rounds of `calls` calls each, GPU busy throughout."""
    per = []
    dropped = 0
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(sleep_cycles)
        t = time.perf_counter()
        for _ in range(calls):
            call()
        dt = time.perf_counter() - t
        end = torch.cuda.Event()
        end.record()
        busy = not end.query()                      # the sleep (and the calls queued after it) not done yet
        torch.cuda.synchronize()
        if busy:
            per.append(dt / calls * 1e6)
        else:
            dropped += 1
    if not per:
        raise RuntimeError("the GPU went idle during every round: raise the sleep")
    return {"us_median": round(statistics.median(per), 2), "us_min": round(min(per), 2),
            "rounds": len(per), "rounds_dropped_gpu_idle": dropped}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--calls", type=int, default=200)   # 400 launches: well inside the launch queue
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    names = (tier_mix().names(TOPK) * (EXPERTS // TOPK + 1))[:EXPERTS]
    arena, offsets = B.random_expert_blobs(names, HIDDEN, INTER, dev)
    fm = ops.ExpertFormats.from_names(names, dev)
    metrics, res = {}, {}
    for m in (1, 4):
        x = torch.randn(m, HIDDEN, dtype=torch.bfloat16, device=dev)
        ids = torch.stack([torch.randperm(EXPERTS, device=dev)[:TOPK] for _ in range(m)]).to(torch.int32)
        wts = torch.softmax(torch.randn(m, TOPK, device=dev), -1)
        out = torch.empty(m, HIDDEN, dtype=torch.bfloat16, device=dev)
        t0 = time.perf_counter()
        ops.fused_moe(x, ids, wts, arena, offsets, fm, HIDDEN, INTER, out=out)     # compiles, resolves once
        first_s = time.perf_counter() - t0
        for _ in range(3):
            ops.fused_moe(x, ids, wts, arena, offsets, fm, HIDDEN, INTER, out=out)
        torch.cuda.synchronize()
        # one call's kernels take ~70 us; calls * 1.5 x that, plus margin, of sleep keeps the GPU busy
        cycles = _busy_ms_cycles(args.calls * 0.2 + 20)
        pm = ops.prepare_moe(fm, EXPERTS, HIDDEN, INTER, dev)
        plain = ops.PreparedMoE(fm, HIDDEN, INTER, dev, direct=False)     # every call through Triton's launcher
        plain(x, ids, wts, arena, offsets, out=out)
        rows = {
            "fused_moe_expertformats": lambda: ops.fused_moe(x, ids, wts, arena, offsets, fm, HIDDEN, INTER, out=out),
            "fused_moe_name_list": lambda: ops.fused_moe(x, ids, wts, arena, offsets, names, HIDDEN, INTER, out=out),
            "prepared_call": lambda: pm(x, ids, wts, arena, offsets, out=out),
            "prepared_call_plain": lambda: plain(x, ids, wts, arena, offsets, out=out),
        }
        for label, fn in rows.items():
            r = host_us(fn, args.calls, args.rounds, cycles)
            res[f"{label}_m{m}"] = r
            metrics[f"host_us_{label}_m{m}"] = r["us_median"]
            print(f"m={m} {label:32s} {r['us_median']:7.2f} us a call (min {r['us_min']:.2f}, "
                  f"{r['rounds']} rounds, {r['rounds_dropped_gpu_idle']} dropped)", flush=True)
        ratio = metrics[f"host_us_prepared_call_plain_m{m}"] / metrics[f"host_us_prepared_call_m{m}"]
        metrics[f"plain_over_direct_prepared_call_m{m}"] = round(ratio, 2)
        print(f"m={m} {'prepared_call':32s} Triton's launcher / direct: {ratio:.2f}x", flush=True)
        metrics[f"launch_mode_m{m}"] = pm.launch_mode(x, ids, wts, arena, offsets, out)
        metrics[f"first_call_ms_m{m}"] = round(first_s * 1e3, 1)
        # allocations: none in a warm call, either path (the allocator's counters before and after)
        for path, call in (("", rows["fused_moe_expertformats"]), ("_plain", rows["prepared_call_plain"])):
            torch.cuda.synchronize()
            before = torch.cuda.memory_stats()["allocation.all.allocated"]
            for _ in range(10):
                call()
            torch.cuda.synchronize()
            metrics[f"allocations_per_call{path}_m{m}"] = (
                torch.cuda.memory_stats()["allocation.all.allocated"] - before) / 10
    metrics["target_us"] = TARGET_US
    metrics["meets_target_m1"] = metrics["host_us_fused_moe_expertformats_m1"] < TARGET_US
    path = write_result("kernels-moe-host", metrics, out_dir=args.out_dir,
                        command="python benchmarks/bench_moe_host.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                        notes=f"measured: host time per eager fused_moe call, GPU busy (torch.cuda._sleep) "
                              f"throughout; rows without _plain launch the compiled kernels directly, _plain through "
                              f"Triton's launcher; kimi-k3.1-pro layer {HIDDEN}x{INTER}, {EXPERTS} experts, top-{TOPK}, "
                              f"tier mix", extra={"rows": res, "triton": triton.__version__})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
