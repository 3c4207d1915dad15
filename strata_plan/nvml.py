"""NVML, shared by the profiler (GPU identity, PCIe link) and the kernel benchmarks (clock and power while
timing): finding NVML's handle of a CUDA device."""
from __future__ import annotations


def nvml_handle(pynvml, index: int):
    """NVML's handle of torch's CUDA device `index`, found by UUID (NVML numbers GPUs without regard to
    CUDA_VISIBLE_DEVICES), by index where torch gives no UUID."""
    import torch
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)
