"""SM clock and board power while the prefill GEMM runs, against bf16 torch.matmul: is the packed GEMM's
gap to bf16 the clock (power) or the schedule?

    python3 benchmarks/probe_clocks.py OUT.json [SECONDS [KG:BT:NW ...]]

Each case (bf16 matmul; the Gluon GEMM whole and, at M = 2048, its PROF diagnostics 1-3, for each tile
shape KG:BT:NW, default 1:256:4) is a CUDA graph of 20 calls
replayed back to back for SECONDS (default 2) while a thread samples NVML's SM clock and power every
20 ms; the rows give the median ms a call (events around the whole run), the median clock and power
after the first half second. q2_g16 and q1_g32 at kimi-k3.1-pro's gate shape (3584 x 7168), M = 2048
and 512."""
from __future__ import annotations

import json
import statistics
import sys
import threading
import time

import pynvml
import torch

from strata_plan.kernels import bench as B
from strata_plan.kernels import ops
from strata_plan.kernels.triton_common import FORMAT_CODES, format_constants

CALLS = 20


def sampled(fn, seconds: float, handle) -> dict:
    g = B.graph_of(lambda: [fn() for _ in range(CALLS)])
    samples, stop = [], threading.Event()

    def watch():
        t0 = time.time()
        while not stop.is_set():
            if time.time() - t0 > 0.5:
                samples.append((pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                                pynvml.nvmlDeviceGetPowerUsage(handle) / 1000))
            time.sleep(0.02)

    th = threading.Thread(target=watch)
    th.start()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0, reps = time.time(), 0
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(10):
            g.replay()
        reps += 10
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    stop.set()
    th.join()
    return {"ms_a_call": round(start.elapsed_time(end) / (reps * CALLS), 4),
            "sm_mhz": statistics.median(s[0] for s in samples) if samples else None,
            "watts": round(statistics.median(s[1] for s in samples), 1) if samples else None}


def main() -> None:
    out, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    shapes = [tuple(int(v) for v in a.split(":")) for a in sys.argv[3:]] or [(1, 256, 4)]
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    gg, dev = ops.gluon_module(), torch.device("cuda")
    res = {"gpu": torch.cuda.get_device_name(dev), "command": " ".join(["python3"] + sys.argv),
           "max_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
           "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000}
    n, k = 3584, 7168
    w = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
    for m in (2048, 512):
        x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        res[f"bf16_M{m}"] = row = sampled(lambda: torch.matmul(x, w.T), seconds, handle)
        print("bf16", m, row, flush=True)
        for fmt in ("q2_g16_s8m4", "q1_g32_s8m4"):
            c = format_constants(FORMAT_CODES.index(fmt))
            mats = ops._matrix_args(B.random_packed(fmt, n, k, dev))
            o = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
            for kg, bt, nw in shapes:
                for prof in (0, 1, 2, 3) if m == 2048 else (0,):
                    key = f"{fmt}_M{m}_kg{kg}_bt{bt}_w{nw}_prof{prof}"
                    res[key] = row = sampled(lambda: gg.gemm_gluon(x, mats, c, n, o, bt=bt, ns=3, num_warps=nw, kg=kg,
                                                                   prof=prof), seconds, handle)
                    print(key, row, flush=True)
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
