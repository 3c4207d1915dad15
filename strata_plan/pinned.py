"""Page-locked host memory that costs what it holds, and readable by GPU kernels in place.

    region = HostRegion(nbytes, device)     # mmap'd, 2 MiB-aligned, registered with the GPU when device is cuda
    region.tensor                           # uint8 CPU tensor [nbytes] over it (is_pinned() on a GPU machine)
    region.device_ptr                       # the address a kernel reads it at (0 on a CPU device)
    region.close()                          # unregister and unmap (idempotent)

torch's pinned allocator (`pin_memory=True`, cudaHostAlloc behind a caching allocator) rounds every request up to
a power of two: a 33 GB tier would take 34.4 GB, a 70 GB one 137 GB. A `HostRegion` is an anonymous mapping of
exactly `nbytes` (rounded up to 2 MiB, with transparent huge pages asked for) registered with the driver
(`cuMemHostRegister`, PORTABLE | DEVICEMAP), so it costs its size. Registered memory is mapped into the GPU's
address space: under unified addressing with `CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM` (every 64-bit Linux
machine with a recent GPU) a kernel reads it at its host address; otherwise at the address
`cuMemHostGetDevicePointer` gives. Kernels that take an arena and byte offsets (`fused_moe`) read a blob here
with offset `device_ptr + i - arena.data_ptr()`: over PCIe, with no copy (zero-copy).

On a machine of several NUMA nodes the region's pages are asked of the GPU's node (`mbind`, MPOL_PREFERRED, before
registering faults them in): pages on the other socket reach the GPU through the sockets' link, and a region's
placement otherwise follows whichever CPU the registering thread ran on (`node`: where they went, None where the
machine has one node or says nothing).

The driver API is called through ctypes on `libcuda.so.1` in the primary context torch made current; every
return code is checked. On a CPU device the region is the same mapping, not registered.
"""
from __future__ import annotations

import ctypes
import mmap
import time
from pathlib import Path

import torch

HUGE = 2 << 20                       # regions are whole 2 MiB pages
_REGISTER_FLAGS = 0x01 | 0x02        # CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP
_CAN_USE_HOST_POINTER = 91           # CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
_driver = None


def _cuda():
    """libcuda through ctypes (loaded once); calls act on the current context (torch's primary one, made current
    by `HostRegion` before it registers)."""
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def _check(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        _cuda().cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {name.value.decode() if name.value else rc}")


def can_use_host_pointer(device: torch.device) -> bool:
    """Whether kernels on `device` read registered host memory at its host address."""
    v = ctypes.c_int()
    _check(_cuda().cuDeviceGetAttribute(ctypes.byref(v), _CAN_USE_HOST_POINTER, ctypes.c_int(device.index or 0)),
           "cuDeviceGetAttribute")
    return bool(v.value)


def gpu_numa_node(device: torch.device) -> int | None:
    """The NUMA node the GPU's PCIe slot hangs off (sysfs), or None (one node, unknown, or not a CUDA device)."""
    if device.type != "cuda" or len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) < 2:
        return None
    try:
        p = torch.cuda.get_device_properties(device)
        bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        node = int(Path(f"/sys/bus/pci/devices/{bus}/numa_node").read_text())
    except (AttributeError, OSError, ValueError):
        return None
    return node if node >= 0 else None


_MBIND, _MPOL_PREFERRED = 237, 1     # x86_64's mbind(2) syscall number; prefer the node, fall back when it is full


def prefer_node(addr: int, length: int, node: int) -> bool:
    """Ask that pages of [addr, addr + length) not yet faulted in come from NUMA node `node`; False where the
    kernel refused (the machine's default placement then applies)."""
    import platform
    if platform.machine() != "x86_64":
        return False
    mask = (ctypes.c_ulong * 16)()
    mask[node // 64] = 1 << (node % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_MBIND, ctypes.c_void_p(addr), ctypes.c_size_t(length), _MPOL_PREFERRED, mask,
                        ctypes.c_ulong(16 * 64 + 1), ctypes.c_uint(0)) == 0


class HostRegion:
    def __init__(self, nbytes: int, device: torch.device | str = "cpu", node: int | None = -1):
        device = torch.device(device)
        self.nbytes = int(nbytes)
        self.mapped = max(HUGE, -(-self.nbytes // HUGE) * HUGE)
        # one huge page more than needed, so the region can start on a 2 MiB boundary whatever address the kernel
        # gives (only whole, aligned 2 MiB ranges can be transparent huge pages)
        self._mm = mmap.mmap(-1, self.mapped + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self._mm.madvise(mmap.MADV_HUGEPAGE)
        whole = torch.frombuffer(self._mm, dtype=torch.uint8)
        skip = -whole.data_ptr() % HUGE
        self.tensor = whole[skip:skip + self.nbytes]
        self.host_ptr = self.tensor.data_ptr()
        want = gpu_numa_node(device) if node == -1 else node          # -1: the GPU's; None: the machine's default
        self.node = want if want is not None and prefer_node(self.host_ptr, self.mapped, want) else None
        self.registered = False
        self.register_s = 0.0
        self.device_ptr = 0
        if device.type == "cuda":
            torch.cuda.init()
            with torch.cuda.device(device):
                torch.zeros(1, device=device)          # the primary context exists and is current here
                t0 = time.perf_counter()
                _check(_cuda().cuMemHostRegister_v2(ctypes.c_void_p(self.host_ptr), ctypes.c_size_t(self.mapped),
                                                    ctypes.c_uint(_REGISTER_FLAGS)), "cuMemHostRegister")
                self.register_s = time.perf_counter() - t0
                self.registered = True
                if can_use_host_pointer(device):
                    self.device_ptr = self.host_ptr
                else:
                    d = ctypes.c_uint64()
                    _check(_cuda().cuMemHostGetDevicePointer_v2(ctypes.byref(d), ctypes.c_void_p(self.host_ptr),
                                                                ctypes.c_uint(0)), "cuMemHostGetDevicePointer")
                    self.device_ptr = d.value

    def huge_share(self) -> float | None:
        """The share of the region backed by transparent huge pages now (`AnonHugePages` of its mappings in
        /proc/self/smaps, summed: registering may split it), or None where that is not readable. The GPU reads the
        region through the IOMMU: 4 KiB pages mean 512 times the translations of 2 MiB ones."""
        try:
            lines = open("/proc/self/smaps").read().splitlines()
        except OSError:
            return None
        lo, hi, inside, huge = self.host_ptr, self.host_ptr + self.mapped, False, 0
        for line in lines:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):          # a mapping's header: start-end perms ...
                start, end = (int(v, 16) for v in head.split("-"))
                inside = start < hi and end > lo          # the mapping (the region and < 2 MiB of slack) or a piece
            elif inside and line.startswith("AnonHugePages:"):
                huge += int(line.split()[1]) * 1024
        return min(huge, self.mapped) / self.mapped

    def close(self) -> None:
        """Unregister, and drop this object's hold on the mapping: it is unmapped when the last tensor viewing
        it goes (torch.frombuffer keeps the mmap object alive, so a live view never points at unmapped memory)."""
        if getattr(self, "registered", False):
            self.registered = False
            torch.cuda.synchronize()             # no kernel or copy still reading it
            _check(_cuda().cuMemHostUnregister(ctypes.c_void_p(self.host_ptr)), "cuMemHostUnregister")
        self.tensor = None
        self._mm = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:            # interpreter shutdown: the driver may be gone already
            pass

    def __enter__(self) -> "HostRegion":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
