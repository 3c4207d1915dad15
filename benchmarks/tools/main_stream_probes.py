"""Diagnostic (GPU, about 20 s): the profiler's main-stream kernel probes alone, as `strata-plan profile` runs them
(profiler.gpu): the graph launch floor, the VRAM lookahead's slot kernels, the device LRU's step and fill, and the
NVMe stager's handshake, microseconds a MoE layer (median and spread of `--repeats` interleaved pairs).

    python3 benchmarks/tools/main_stream_probes.py [--repeats 15]     # prints them; writes $OUT/main_stream_probes.json
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from strata_plan.profiler import gpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    got = {}
    for name, probe in (("graph_launch_us", gpu.graph_launch_us), ("lookahead_layer_us", gpu.lookahead_layer_us),
                        ("cache_layer_us", gpu.cache_layer_us), ("stage_layer_us", gpu.stage_layer_us)):
        st = probe(a.repeats)
        got[name] = {"median": st.median, "min": min(st.samples), "max": max(st.samples)}
        print(f"{name:20s} {st.median:8.2f} us  (min {min(st.samples):.2f}, max {max(st.samples):.2f}, "
              f"{len(st.samples)} repeats)")
    out = Path(os.environ.get("OUT", "."))
    (out / "main_stream_probes.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), **got}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
