"""Counting the kernel launches of a piece of engine work (a diagnostic, and what tests hold the cost model's launch
counts to: `core.lookahead.GATE_LAUNCHES`).

    hook_triton()                       # once: Triton launches are counted too (compiled or interpreted)
    with Launches() as got:
        model.decode_step(token)
    got.torch, got.triton               # Counters: torch operators that launch a kernel on a GPU, Triton kernels
    decode_step_launches(packed, plan, "plan", "cpu")    # one eager decode step of an engine, counted

Torch operators that only make views, read shapes or allocate are not launches (`NO_KERNEL`); the tensor work the
Triton interpreter does inside a kernel is the kernel's, not launches.
"""
from __future__ import annotations

import collections

from torch.utils._python_dispatch import TorchDispatchMode

NO_KERNEL = frozenset({
    "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "select", "slice", "expand", "t", "transpose", "permute",
    "alias", "as_strided", "detach", "_reshape_alias", "split", "unbind", "lift_fresh", "empty", "empty_like",
    "empty_strided", "item", "_local_scalar_dense", "is_nonzero", "sym_size", "sym_stride", "new_empty", "chunk",
    "narrow", "split_with_sizes", "record_stream", "promote_types"})

_active: list["Launches"] = []


class Launches(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.torch: collections.Counter = collections.Counter()
        self.triton: collections.Counter = collections.Counter()
        self._inside = 0

    def __enter__(self):
        _active.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _active.remove(self)
        return super().__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.torch.values()) + sum(self.triton.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in NO_KERNEL and not self._inside:
            self.torch[name] += 1
        return func(*args, **(kwargs or {}))

    def _launch(self, name: str, run):
        self.triton[name] += 1
        self._inside += 1
        try:
            return run()
        finally:
            self._inside -= 1


def hook_triton() -> None:
    """Count Triton launches in the active `Launches` (compiled: `JITFunction.run`; interpreted: the interpreter's
    grid executor). Idempotent."""
    from triton.runtime import interpreter, jit
    if getattr(jit.JITFunction.run, "_counted", False):
        return
    run, grid = jit.JITFunction.run, interpreter.GridExecutor.__call__

    def jit_run(self, *a, **k):
        return _active[-1]._launch(self.fn.__name__, lambda: run(self, *a, **k)) if _active else run(self, *a, **k)

    def grid_call(self, *a, **k):
        return _active[-1]._launch(self.fn.__name__, lambda: grid(self, *a, **k)) if _active else grid(self, *a, **k)
    jit_run._counted = True
    jit_run._original = run                      # what was hooked (tests read its source)
    jit.JITFunction.run, interpreter.GridExecutor.__call__ = jit_run, grid_call


def decode_step_launches(packed, plan, mode: str, device: str) -> Launches:
    """The launches of one eager decode step (after a short prefill and a warm-up step) of the engine on `packed` and
    `plan` in `mode`, its kernels launched (`backend="triton"`: interpreted on a CPU)."""
    import torch

    from .engine import Engine, EngineOptions
    hook_triton()
    with Engine.open(packed, plan, EngineOptions(mode=mode, device=device, graphs=False, backend="triton")) as eng:
        m = eng.model
        m.reset()
        m.prefill([5, 17, 99], chunk=1)
        m.decode_step(3, greedy=True)                  # warm-up: kernels compiled, caches filled
        with Launches() as got:
            m.decode_step(4, greedy=True)
        if device != "cpu":
            torch.cuda.synchronize()
    return got
