"""Diagnostic (GPU, about 20 s): does the GPU read pinned RAM in place slower from one NUMA node than another? On the
H100 machine the engine's RAM tier read at 32-33 GB/s in place (kimi5, engine-20261205T154435Z.json) while the
profile's zero-copy probe, another process, read 50 GB/s: a region's pages land on the node of the CPU that faults
them in, unless asked for (`pinned.HostRegion(node=...)`).

    python3 benchmarks/tools/numa_probe.py        # prints the topology and GB/s a placement; $OUT/numa_probe.json

Per placement: a `profiler.gpu.ZeroCopyProbe` of REGION bytes, pages asked of that node (or the machine's default),
where they went (/proc/self/numa_maps), reads of READ bytes cycling through it, CUDA events, median of 5.
Not a benchmark: no results file."""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import torch

from strata_plan.pinned import gpu_numa_node
from strata_plan.profiler.gpu import ZeroCopyProbe

REGION, READ = 2 << 30, 256 << 20


def pages_by_node(addr: int, size: int) -> dict:
    """N<node>=<pages> of the mappings from the one holding `addr` to those starting before addr + size
    (/proc/self/numa_maps lists each mapping's start; registering may split the region), {} where unreadable."""
    try:
        lines = [(int(line.split()[0], 16), line.split()) for line in open("/proc/self/numa_maps")]
    except OSError:
        return {}
    first = max((a for a, _ in lines if a <= addr), default=addr)
    got: dict = {}
    for a, words in lines:
        if first <= a < addr + size:
            for w in words:
                if w.startswith("N") and "=" in w:
                    got[w.split("=")[0]] = got.get(w.split("=")[0], 0) + int(w.split("=")[1])
    return got


def gbps(probe: ZeroCopyProbe) -> float:
    out = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(REGION // READ):
            probe.read(i * READ, READ)
        b.record()
        b.synchronize()
        out.append(REGION / (a.elapsed_time(b) / 1e3) / 1e9)
    return statistics.median(out[2:])


def main() -> None:
    dev = torch.device("cuda")
    nodes = sorted(int(p.name[4:]) for p in Path("/sys/devices/system/node").glob("node[0-9]*"))
    info = {"gpu": torch.cuda.get_device_name(), "nodes": nodes, "gpu_node": gpu_numa_node(dev),
            "cpus_allowed": len(os.sched_getaffinity(0)), "cpu_now": os.sched_getcpu() if hasattr(os, "sched_getcpu")
            else None, "placements": {}}
    print(json.dumps({k: v for k, v in info.items() if k != "placements"}))
    for name, node in [("default", None), ("gpu's (-1)", -1)] + [(f"node {n}", n) for n in nodes]:
        probe = ZeroCopyProbe(REGION, dev, node)
        probe.check(READ)
        reg = probe.region
        r = {"asked": node, "got": reg.node, "pages": pages_by_node(reg.host_ptr, reg.mapped), "gbps": gbps(probe)}
        probe.close()
        info["placements"][name] = r
        print(f"  {name:12s} {r['gbps']:6.2f} GB/s   pages {r['pages']}")
    out = Path(os.environ.get("OUT", "."))
    (out / "numa_probe.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
