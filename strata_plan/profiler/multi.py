"""Several GPUs: the links between the GPUs and the host (concurrent H2D to all at once, peer copies per
pair, whether the GPUs share a root complex), measured into the profile's `topology` (profiles/SCHEMA.md).

Method: each GPU's pinned H2D alone (one `copy_` of `size` bytes from its own pinned buffer, CUDA events on
its own stream), then to every GPU at once (one stream and one pinned buffer per GPU, all copies enqueued,
timed on the host clock from the first enqueue to the last synchronization: total bytes over the wall time),
then for every ordered pair (a, b) that torch says can access its peer, a device-to-device copy a -> b
(CUDA events on a's stream). Repeats are interleaved and the median kept, as everywhere in the profiler.
Where the pair reports active NVLink links (NVML), the peer kind is `nvlink`, else `pcie`; no pair with peer
access: `none`. The GPUs share a root complex when sysfs resolves their PCI devices to the same root port
(the first bridge below the host bridge); when sysfs cannot say, the concurrent H2D decides it (below 80 %
of the GPUs' own rates added) and the source says it is inferred.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from strata_plan.profiles.schema import HostLinks, PeerLink, Topology

from .timing import GB, Stats, interleaved, measured, today

SHARED_BELOW = 0.8           # concurrent H2D under this share of the GPUs' own rates added: links shared


@dataclass(frozen=True)
class LinkResult:
    """What `measure_links` measured (GB/s), with the root port of each GPU (None where sysfs cannot say)."""

    size: int                                       # bytes per copy
    alone: dict[int, Stats]                         # GPU -> pinned H2D alone
    concurrent: Stats                               # pinned H2D to every GPU at once, total
    peer: dict[tuple[int, int], Stats]              # (a, b) -> device copy a -> b, where peer access works
    nvlink: dict[tuple[int, int], bool]             # (a, b) -> NVML reports active NVLink between them
    root_ports: dict[int, str | None]


def root_port(sysfs_device_path: str) -> str | None:
    """The root port of a PCI device from its resolved sysfs path (`/sys/devices/pci0000:00/0000:00:01.1/
    0000:01:00.0/...`): the host bridge and the first bridge below it, `pci0000:00/0000:00:01.1`."""
    parts = [p for p in sysfs_device_path.split("/") if p]
    for i, p in enumerate(parts):
        if p.startswith("pci") and ":" in p and i + 2 < len(parts):
            return f"{p}/{parts[i + 1]}"
    return None


def topology_from(r: LinkResult) -> Topology:
    """The profile's topology from measured links (see the module docstring for the rules)."""
    day, n = today(), len(r.alone)
    own = sum(st.median for st in r.alone.values())
    ports = set(r.root_ports.values())
    if None not in ports:
        shared = len(ports) < n
        how = (f"sysfs root ports of the {n} GPUs: {', '.join(str(r.root_ports[g]) for g in sorted(r.root_ports))}; "
               f"concurrent H2D {r.concurrent.median:.1f} GB/s against {own:.1f} alone, added")
    else:
        shared = r.concurrent.median < SHARED_BELOW * own
        how = (f"sysfs could not resolve the root ports: inferred from concurrent H2D {r.concurrent.median:.1f} GB/s "
               f"against {own:.1f} GB/s alone, added ({'below' if shared else 'at least'} {SHARED_BELOW:.0%})")
    host = HostLinks(shared, measured(r.concurrent.median, f"pinned H2D of {r.size >> 20} MiB to all {n} GPUs at "
                                                           "once, one stream and buffer each, total bytes over the "
                                                           "host clock", r.concurrent),
                     "measured", how, day)
    if not r.peer:
        return Topology(PeerLink("none"), host)
    kind = "nvlink" if any(r.nvlink.get(k, False) for k in r.peer) else "pcie"
    slow = min(r.peer, key=lambda k: r.peer[k].median)
    pairs = ", ".join(f"{a}->{b} {st.median:.1f}" for (a, b), st in sorted(r.peer.items()))
    gbps = measured(r.peer[slow].median, f"device copy of {r.size >> 20} MiB per ordered pair, CUDA events; the "
                                         f"slowest pair kept ({pairs} GB/s)", r.peer[slow])
    return Topology(PeerLink(kind, gbps), host)


# ---------------------------------------------------------------- measurement (torch, CUDA)


def _root_ports(n: int) -> dict[int, str | None]:
    import torch
    out: dict[int, str | None] = {}
    for g in range(n):
        try:
            p = torch.cuda.get_device_properties(g)
            bdf = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            out[g] = root_port(os.path.realpath(f"/sys/bus/pci/devices/{bdf}"))
        except (AttributeError, OSError, RuntimeError):
            out[g] = None
    return out


def _nvlink(a: int, b: int) -> bool:
    """NVML reports an active NVLink on GPU a whose remote end is GPU b."""
    try:
        import pynvml

        from strata_plan.nvml import nvml_handle
        pynvml.nvmlInit()
    except Exception:
        return False
    try:
        ha, hb = nvml_handle(pynvml, a), nvml_handle(pynvml, b)
        bus_b = pynvml.nvmlDeviceGetPciInfo(hb).busId
        for link in range(18):
            try:
                if (pynvml.nvmlDeviceGetNvLinkState(ha, link)
                        and pynvml.nvmlDeviceGetNvLinkRemotePciInfo(ha, link).busId == bus_b):
                    return True
            except pynvml.NVMLError:
                break
        return False
    finally:
        pynvml.nvmlShutdown()


def measure_links(n: int, size: int, repeats: int, tick: Callable[[], None] | None = None) -> LinkResult:
    """See the module docstring; `n` GPUs, copies of `size` bytes, `repeats` interleaved repeats."""
    import torch
    host = [torch.empty(size, dtype=torch.uint8).pin_memory() for _ in range(n)]
    dev = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}") for g in range(n)]
    streams = [torch.cuda.Stream(device=g) for g in range(n)]
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b and torch.cuda.can_device_access_peer(a, b)]

    def timed_copy(g: int, dst, src) -> float:
        """GB/s of one copy src -> dst on GPU g's stream, CUDA events."""
        with torch.cuda.device(g), torch.cuda.stream(streams[g]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            return size / (start.elapsed_time(end) * 1e-3) / GB

    def alone(g: int) -> float:
        return timed_copy(g, dev[g], host[g])

    def together(_: str) -> float:
        import time
        for g in range(n):
            torch.cuda.synchronize(g)
        t0 = time.perf_counter()
        for g in range(n):
            with torch.cuda.device(g), torch.cuda.stream(streams[g]):
                dev[g].copy_(host[g], non_blocking=True)
        for g in range(n):
            streams[g].synchronize()
        return n * size / (time.perf_counter() - t0) / GB

    def peer(pair: tuple[int, int]) -> float:
        a, b = pair
        return timed_copy(a, dev[b], dev[a])

    for g in range(n):                       # warm-up
        alone(g)
    together("all")
    res_alone = interleaved(range(n), alone, repeats, tick)
    res_all = interleaved(["all"], together, repeats, tick)["all"]
    res_peer = interleaved(pairs, peer, repeats, tick) if pairs else {}
    return LinkResult(size, res_alone, res_all, res_peer, {p: _nvlink(*p) for p in pairs}, _root_ports(n))


PHASE = "several GPUs: H2D alone and at once, peer copies"


def phase_plan(n: int, repeats: int) -> tuple[str, float, int]:
    ticks = repeats * (n + 1 + n * (n - 1))
    return PHASE, 0.1 * ticks + 1.0, ticks

