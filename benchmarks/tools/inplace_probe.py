"""Diagnostic (GPU, about 30 s): what one MoE layer's fused call takes when its experts are read in place from
pinned RAM, beside the same call from VRAM and the bare reads of the same bytes (the cost model charges
max(bytes / R_zc(bytes), the call from VRAM) a layer: planner/cost.py).

    python3 benchmarks/tools/inplace_probe.py [HIDDEN,INTER,TOPK ...]     # default 512,256,6 (bench-moe) 2048,768,8
    # writes $OUT/inplace_probe.json (not a benchmark)

Per shape: enough layers of distinct experts in the tier mix (`formats.tier_mix`) that one graph reads more than 4x
the L2, captured in one CUDA graph and replayed (median of 20), microseconds a layer:
  vram            `fused_moe` with the blobs in VRAM
  ram             the same blobs in a registered pinned `HostRegion`, read in place (offsets past the arena)
  ram_plus_kernel the same with one small kernel after each layer's call (the engine's layers have such neighbours)
  read            `stream_read` of each layer's bytes from the region, one read a layer (the zero-copy curve's kernel)
  read_split      the same bytes in two reads a layer, the gate/up part (2/3) then the down part (1/3), as the fused
                  call's two launches read them
Random codes stand in for weights (speed does not depend on values, as in profiler/moe.py)."""
import json
import os
import sys

import torch

from strata_plan.kernels import ops
from strata_plan.kernels.bench import l2_bytes
from strata_plan.kernels.formats import expert_bytes, tier_mix
from strata_plan.kernels.stream_read import programs_for, stream_read
from strata_plan.pinned import HostRegion
from strata_plan.profiler.moe import cuda_graph_seconds, random_arena


def graph_us(fn, layers: int, reps: int = 20) -> float:
    """Median microseconds a layer of one replay of a CUDA graph holding fn (the profiler's graph timer)."""
    return cuda_graph_seconds(fn, reps) * 1e6 / layers


def shape_row(hidden: int, inter: int, top_k: int) -> dict:
    dev = torch.device("cuda")
    names = tier_mix().names(top_k)
    layer_bytes = sum(expert_bytes(f, hidden, inter) for f in names)
    layers = max(2, -(-4 * l2_bytes(dev) // layer_bytes))
    arena, offsets = random_arena(names * layers, hidden, inter, dev)
    fm = ops.ExpertFormats.from_names(names * layers, dev)
    region = HostRegion(arena.numel(), dev)
    region.tensor.copy_(arena.cpu())
    small = torch.empty(256, dtype=torch.uint8, device=dev)            # the arena the in-place offsets count from
    base = region.device_ptr - small.data_ptr()
    host_offsets = offsets + base
    ids = [torch.arange(i * top_k, (i + 1) * top_k, device=dev, dtype=torch.int32)[None] for i in range(layers)]
    wts = torch.softmax(torch.randn(1, top_k, device=dev), -1)
    x = torch.randn(1, hidden, dtype=torch.bfloat16, device=dev)
    out = torch.empty(1, hidden, dtype=torch.bfloat16, device=dev)
    y = torch.empty(1, hidden, dtype=torch.bfloat16, device=dev)
    starts = offsets[::top_k].tolist() + [arena.numel()]
    sizes = [b - a for a, b in zip(starts, starts[1:])]                 # each layer's blobs (4 KiB aligned)
    parts = []
    for a, n in zip(starts, sizes):
        gate_up = (2 * n // 3) // 4096 * 4096
        parts.append(((a, gate_up), (a + gate_up, n - gate_up)))
    outs = {n: torch.empty(programs_for(dev, n), dtype=torch.int64, device=dev)
            for n in {s for p in parts for _, s in p} | set(sizes)}

    def vram():
        for i in ids:
            ops.fused_moe(x, i, wts, arena, offsets, fm, hidden, inter, out=out)

    def ram():
        for i in ids:
            ops.fused_moe(x, i, wts, small, host_offsets, fm, hidden, inter, out=out)

    def ram_plus_kernel():
        for i in ids:
            ops.fused_moe(x, i, wts, small, host_offsets, fm, hidden, inter, out=out)
            torch.add(out, x, out=y)

    def read():
        for a, n in zip(starts, sizes):
            stream_read(small, base + a, n, outs[n])

    def read_split():
        for p in parts:
            for a, n in p:
                stream_read(small, base + a, n, outs[n])

    ref = ops.fused_moe(x, ids[0], wts, arena, offsets, fm, hidden, inter).float()
    got = ops.fused_moe(x, ids[0], wts, small, host_offsets, fm, hidden, inter).float()
    row = {"hidden": hidden, "intermediate": inter, "top_k": top_k, "formats": names, "layers": layers,
           "layer_bytes": layer_bytes, "in_place_equals_vram": bool(torch.equal(ref, got))}
    for name, fn in (("vram", vram), ("ram", ram), ("ram_plus_kernel", ram_plus_kernel), ("read", read),
                     ("read_split", read_split)):
        row[f"{name}_us"] = round(graph_us(fn, layers), 2)
    row["read_GBps"] = round(layer_bytes / row["read_us"] / 1e3, 2)
    row["charged_us"] = max(row["vram_us"], row["read_us"])           # the cost model's max(read, call)
    region.close()
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    shapes = [tuple(int(v) for v in s.split(",")) for s in sys.argv[1:]] or [(512, 256, 6), (2048, 768, 8)]
    res = {"gpu": torch.cuda.get_device_name(), "rows": [shape_row(*s) for s in shapes]}
    path = os.path.join(os.environ.get("OUT", "/tmp"), "inplace_probe.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
