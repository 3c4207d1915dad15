"""Diagnostic: device-loop engines with an NVMe tier opened one after another in one process (GPU).

    python3 benchmarks/tools/stager_engines.py [--engines 3] [--tokens 8]

On the H200 (2026-12-05) only the first device-loop engine of a process staged NVMe experts correctly: later ones
read NaN (the fixture) or timed out waiting for the stager (kimi5). This opens `--engines` such engines on the
committed fixture (packed in BF16, every routed expert on NVMe), each after the previous one closed, and prints per
engine: the pinned regions' host addresses (an address reused from a closed engine is marked), whether its greedy
tokens are those of the same plan with every expert in VRAM, and whether the GPU sees the pinned staging block as the host wrote it (its words,
ready table and ring, and the first staged slot, read through a device view against the host's bytes). A GPU that
reads old bytes at a reused address points at the driver's mappings; equal bytes and wrong tokens point elsewhere.
With `--measure` each engine runs `engine.bench.measure` instead (the benchmarks' path: warm-up, launches queued
ahead, the tokens read through the ring), `--plan V,R,C,D` the fixture's split (VRAM, RAM experts a layer, cache
slots, lookahead depth; the rest on NVMe), `--modes` the engines' modes in turn, `--timeout-s` the GPU's wait for one
staged expert (then the stager's one line), and `benchmarks/_watch.py` prints what the stager knows while an engine
runs past `--watch-s`; past three times that the process ends (every thread's stack first).
Not a benchmark: no results file.
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from strata_plan.cli import main as cli  # noqa: E402
from strata_plan.engine.dense import device_view  # noqa: E402
from strata_plan.engine.engine import Engine, EngineOptions  # noqa: E402
from strata_plan.errors import UserError  # noqa: E402
from strata_plan.kernels import stage_wait as sw  # noqa: E402
from test_engine_run import FIXTURE, PROMPT, bf16_plan  # noqa: E402
from _watch import StagerWatch  # noqa: E402


def gpu_sees_host(region, start: int, nbytes: int) -> bool:
    """Whether a device view of the region's bytes [start, start + nbytes) reads what the host holds there."""
    host = region.tensor[start:start + nbytes]
    seen = device_view(host, region.device_ptr + start, torch.device("cuda")).clone().cpu()
    return bool(torch.equal(seen, host))


def both_ways(region, start: int, nbytes: int, salt: int) -> str:
    """Whether the GPU reads what the host wrote at [start, start + nbytes) of a registered region, and the host
    reads what the GPU wrote there (the stager's two directions: staged bytes and ready words one way, requests the
    other). Overwrites those bytes."""
    host = region.tensor[start:start + nbytes]
    dev = device_view(host, region.device_ptr + start, torch.device("cuda"))
    pattern = (torch.arange(nbytes, dtype=torch.int64) * 7 + salt).remainder(251).to(torch.uint8)
    host.copy_(pattern)
    torch.cuda.synchronize()
    h2d = torch.equal(dev.clone().cpu(), pattern)
    dev.copy_((pattern.to(torch.int64) + 1).remainder(251).to(torch.uint8).cuda())
    torch.cuda.synchronize()
    d2h = torch.equal(host, (pattern.to(torch.int64) + 1).remainder(251).to(torch.uint8))
    return f"GPU reads host {'ok' if h2d else 'STALE'}, host reads GPU {'ok' if d2h else 'STALE'}"


def regions_only(n: int, nbytes: int) -> None:
    """HostRegions of one size opened, checked both ways and closed one after another (no engine)."""
    from strata_plan.pinned import HostRegion
    seen: set[int] = set()
    for i in range(n):
        r = HostRegion(nbytes, "cuda")
        tag = " (reused address)" if r.host_ptr in seen else ""
        seen.add(r.host_ptr)
        print(f"region {i} at {r.host_ptr:#x}{tag}: {both_ways(r, nbytes - 65536, 65536, i)}", flush=True)
        r.close()
        del r
        gc.collect()


def stop_past(watch: StagerWatch, limit_s: float) -> None:
    """Every thread's stack, then the process ends, once an engine has run `limit_s` seconds."""
    while True:
        time.sleep(1.0)
        t0 = watch.started
        if t0 is not None and time.perf_counter() - t0 > limit_s:
            faulthandler.dump_traceback()
            os._exit(3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--region-mb", type=int, default=64, help="size of the bare regions checked first")
    ap.add_argument("--plan", default="0,0,0,0", help="VRAM,RAM,cache slots,depth of the fixture's plan")
    ap.add_argument("--chunk", type=int, default=1, help="the plan's prefill chunk")
    ap.add_argument("--modes", default="plan", help="the engines' modes in turn (comma-separated)")
    ap.add_argument("--io", default=None, help="the stager's io (default: the engine's)")
    ap.add_argument("--measure", action="store_true", help="each engine runs engine.bench.measure")
    ap.add_argument("--timeout-s", type=float, default=sw.TIMEOUT_NS / 1e9, help="the GPU's wait for one expert")
    ap.add_argument("--watch-s", type=float, default=30.0)
    a = ap.parse_args()
    sw.TIMEOUT_NS = int(a.timeout_s * 1e9)
    watchdog = StagerWatch(after_s=a.watch_s, every_s=a.watch_s / 2, log=lambda m: print(m, flush=True))
    threading.Thread(target=stop_past, args=(watchdog, 3 * a.watch_s), daemon=True).start()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        regions_only(a.engines + 1, a.region_mb << 20)
    vram, ram, cache, depth = (int(v) for v in a.plan.split(","))
    modes = a.modes.split(",")
    io = {"stager_io": a.io} if a.io else {}
    with tempfile.TemporaryDirectory() as tmp:
        packed = Path(tmp) / "packed"
        assert cli(["pack", str(FIXTURE), "--out", str(packed), "--format", "bf16", "--json"]) == 0
        plan = bf16_plan(vram, ram, cache, depth, chunk=a.chunk)
        with Engine.open(packed, bf16_plan(32, 0, 0, 0, chunk=1), EngineOptions(device=device)) as eng:
            want = eng.generate(PROMPT, max_new_tokens=a.tokens)
        print(f"tokens with every expert in VRAM: {want}")
        seen_addresses: set[int] = set()
        for i in range(a.engines):
            mode = modes[i % len(modes)]
            watchdog.name, watchdog.started = f"engine {i}", time.perf_counter()
            if a.measure:
                from strata_plan.engine.bench import measure
                try:
                    r = measure(packed, plan, mode=mode, tokens=a.tokens, warmup=4, device=device,
                                prompt=PROMPT, options=EngineOptions(**io))
                    st = watchdog.stager
                    print(f"engine {i} ({mode}): measured {r['measured']['decode_tok_s']:.1f} tok/s in "
                          f"{time.perf_counter() - watchdog.started:.1f} s; staging at {st.base:#x} from the arena, "
                          f"requests {st.seen_req}", flush=True)
                except UserError as err:
                    print(f"engine {i} ({mode}): {err}", flush=True)
                watchdog.started = None
                gc.collect()
                continue
            with Engine.open(packed, plan, EngineOptions(device=device, mode=mode, **io)) as eng:
                store = eng.store
                regions = {"staging": store._stage_region, "ram": store._ram_region}
                where = {k: (r.host_ptr if r is not None else None) for k, r in regions.items()}
                reused = [k for k, v in where.items() if v in seen_addresses]
                seen_addresses.update(v for v in where.values() if v)
                reg = regions["staging"]
                probe = ""
                if device == "cuda" and reg is not None:            # slot 0 is free before the first token
                    probe = f"; before the tokens, staging slot 0: {both_ways(reg, 0, min(65536, store.slot_bytes), i)}"
                try:
                    got = eng.generate(PROMPT, max_new_tokens=a.tokens)
                except UserError as err:
                    got = f"error: {err}"
                line = (f"engine {i} ({mode}): tokens {'EQUAL' if got == want else 'DIFFER ' + str(got)}; regions "
                        + ", ".join(f"{k} at {v:#x}" if v else f"{k} none" for k, v in where.items())
                        + (f" (reused: {', '.join(reused)})" if reused else ""))
                st, reg = store.staging.stager, regions["staging"]
                if device == "cuda" and reg is not None:
                    torch.cuda.synchronize()
                    block = st.layout["words"]
                    line += (f"; GPU sees the host's block: {gpu_sees_host(reg, block, reg.nbytes - block)}, "
                             f"its first slot: {gpu_sees_host(reg, 0, store.slot_bytes)}")
                print(line + probe, flush=True)
            watchdog.started = None
            gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
