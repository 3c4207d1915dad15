"""Launch a compiled Triton kernel straight from its `CompiledKernel`, without Triton's Python launcher.

`kernel[grid](*args, **kwargs)` binds every argument, computes the specialization key (each pointer's
dtype and 16-byte alignment, each integer's value 1 / divisibility by 16 / width), looks the compiled
kernel up, checks the globals it read, and then calls the C launcher, which asks the driver about every
pointer again. `fused_moe` launches two kernels per layer per token that way: 72-84 us of host time a
call measured on the H200 (Triton 3.6; benchmarks/bench_moe_host.py), most of it in those two launches.

A `Launch` is one call site whose arguments are mostly fixed (scratch buffers, tables, sizes, constexprs,
launch options, grid): it resolves them once, and per call takes only the `live` arguments (those that
change between calls: activations, ids, output). The first call of each specialization goes through
`kernel[grid](...)` (which compiles, or finds the compiled kernel) and keeps the `CompiledKernel` it
returns; later calls of that specialization call its launcher directly, as `JITFunction.run` does, with
the pointers as integers, on the stream the caller gives (torch's current stream, so CUDA-graph capture
works). Nothing is allocated and nothing read back from the device.

    gate_up = Launch(kernel, grid, dict(x_p=x, stride_xm=x.stride(0), ..., BN=64, num_warps=4),
                     live=("x_p", "stride_xm"))          # everything `kernel[grid](**kwargs)` takes, once
    gate_up(stream, x, x.stride(0))                      # every call: the live arguments, in `live` order

Plain path: `direct=False` sends every call through `kernel[grid](...)`. Where the direct launch cannot
be made (Triton's interpreter returns no compiled kernel; a Triton without `knobs.runtime`, or whose
`CompiledKernel` lacks `run` / `function` / `packed_metadata` or orders its signature otherwise) the
calls take the plain path with the same arguments, and nothing fails. A launch hook (a profiler's)
gets its launch metadata as from Triton. Not seen after the first call of a specialization: Triton
knobs changed later (debug, instrumentation) and changed globals a kernel reads (Triton refuses those
launches; this launches the kernel compiled before).
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping, NamedTuple, Sequence

import torch

from .triton_common import triton

_NEEDED = ("run", "function", "packed_metadata")    # what JITFunction.run itself uses to launch
_REPLAY = "replay"                                  # cache entry: no compiled kernel, launch the plain way


def _runtime_knobs():
    """triton.knobs.runtime (Triton >= 3.4: the launch hooks live there), else None."""
    knobs = getattr(triton, "knobs", None)
    rt = getattr(knobs, "runtime", None)
    return rt if hasattr(rt, "launch_enter_hook") and hasattr(rt, "launch_exit_hook") else None


_KNOBS = _runtime_knobs()


def spec_key(live: Sequence) -> tuple:
    """What Triton's specialization sees of the live arguments, or finer: a tensor's dtype and 16-byte
    alignment; an int's class: 1 for the value 1, else 2 + (divisible by 16) + 2 * (fits in i32). Two
    calls whose live arguments have equal keys run the same compiled kernel."""
    key = []
    for v in live:
        if v.__class__ is int:
            key.append(1 if v == 1 else 2 + (v & 15 == 0) + 2 * (-0x80000000 <= v <= 0x7FFFFFFF))
        else:
            key += [v.dtype, v.data_ptr() & 15 == 0]
    return tuple(key)


class Launch:
    """`fn[grid](**kwargs)` made again and again with only the `live` arguments changing (module doc).
    kwargs: every argument of the kernel by name (constexprs included; parameters with defaults may be
    left out) and the launch options (num_warps, maxnreg, ...), exactly as to `fn[grid]`; the values given
    for the `live` names only say which are ints (the others are tensors) and are not kept. `direct`:
    False sends every call through Triton's launcher (`triton`)."""

    def __init__(self, fn, grid: tuple, kwargs: Mapping[str, Any], live: Sequence[str], direct: bool = True):
        sig = inspect.signature(fn.fn)
        bound = sig.bind(**{k: v for k, v in kwargs.items() if k in sig.parameters})
        bound.apply_defaults()                              # every parameter without a default must be given
        names = list(bound.arguments)                       # the kernel's parameters, in order
        self.fn, self.live, self._names = fn, tuple(live), names
        self.grid = tuple(grid) + (1,) * (3 - len(grid))    # (x, y, z) as the launcher takes it
        self.options = {k: v for k, v in kwargs.items() if k not in sig.parameters}
        self.direct = direct
        self._slots = tuple(names.index(n) for n in self.live)
        kinds = ["int" if bound.arguments[n].__class__ is int else "tensor" for n in self.live]
        for n in self.live:                                 # hold no reference to a call's tensors
            bound.arguments[n] = None
        self._objs = list(bound.arguments.values())         # the plain path's arguments (tensors)
        self._ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in self._objs]   # the direct one's
        self._entries: dict[tuple, Any] = {}                # specialization key -> _Entry | _REPLAY
        self.launch = self._write_launch(kinds)

    def __call__(self, stream: int, *live) -> None:
        """Launch with these live arguments (in `live` order) on `stream` (a raw CUDA stream handle, torch's
        current one; the plain path takes torch's current stream itself). `self.launch(stream, *live)` is
        the same call without this layer."""
        self.launch(stream, *live)

    def _write_launch(self, kinds: Sequence[str]):
        """`launch(stream, a0, a1, ...)`: the per-call work written out for this call site's live
        arguments (a tensor or an int each, as `kinds` says), as Triton writes its binder: the launcher's
        argument list with each live one at its slot, the specialization key (equal to `spec_key`'s),
        then the compiled kernel's launcher, or `plain` for a specialization not launched yet; with
        direct launches off, straight to `triton`."""
        params = [f"a{j}" for j in range(len(kinds))]
        live = ", ".join(params)
        lines = [f"def launch(stream, {live}):",
                 "    if not self.direct:",
                 f"        return self.triton({live})",
                 "    args = ints.copy()"]
        key = []
        for j, (slot, kind) in enumerate(zip(self._slots, kinds)):
            if kind == "tensor":
                lines.append(f"    p{j} = args[{slot}] = a{j}.data_ptr()")
                key += [f"a{j}.dtype", f"p{j} & 15 == 0"]
            else:
                lines.append(f"    args[{slot}] = a{j}")
                key.append(f"(1 if a{j} == 1 else 2 + (a{j} & 15 == 0) + 2 * (-0x80000000 <= a{j} <= 0x7FFFFFFF))")
        lines += [
            f"    e = entries.get(({', '.join(key)},))",
            "    if e.__class__ is not Entry:",
            f"        return self.plain({live})",
            "    enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook",
            "    if (enter is not None and getattr(enter, 'calls', True)) or (leave is not None and getattr(leave, 'calls', True)):",
            "        return self._hooked(e, stream, args, enter, leave)",
            "    try:",
            "        e.run(g0, g1, g2, stream, e.function, e.metadata, None, None, None, *args)",
            "    except TypeError:       # a launcher that takes its arguments otherwise: parsed before launching",
            f"        self._refused({live})"]
        ns = dict(self=self, ints=self._ints, entries=self._entries, Entry=_Entry, knobs=_KNOBS,
                  g0=self.grid[0], g1=self.grid[1], g2=self.grid[2])
        exec("\n".join(lines), ns)                        # noqa: S102 - our own source, from names above
        return ns["launch"]

    def _hooked(self, e, stream, args, enter, leave) -> None:
        """A direct launch with a profiler's launch hooks registered: their metadata as Triton makes it."""
        meta = e.kernel.launch_metadata(self.grid, stream, *args)
        e.run(*self.grid, stream, e.function, e.metadata, meta, enter, leave, *args)

    def _refused(self, *live) -> None:
        self._entries[spec_key(live)] = _REPLAY
        self.plain(*live)

    def mode(self, *live) -> str:
        """How a call with these live arguments runs: "direct", "plain" (Triton's launcher: asked for, or
        no direct launch possible) or "new" (direct asked for, its specialization not launched yet: the
        next call goes through Triton's launcher, which compiles or finds the kernel)."""
        if not self.direct:
            return "plain"
        e = self._entries.get(spec_key(live))
        return "new" if e is None else "plain" if e is _REPLAY else "direct"

    def triton(self, *live):
        """Launch through `fn[grid](...)` (Triton's launcher), every argument in the kernel's order.
        Returns what that returns (the compiled kernel; None in the interpreter)."""
        args = self._objs.copy()
        for i, v in zip(self._slots, live):
            args[i] = v
        return self.fn[self.grid](*args, **self.options)

    def plain(self, *live) -> None:
        """`triton(*live)`, keeping the compiled kernel it returns for the direct launches of this
        specialization (or that there can be none)."""
        kernel = self.triton(*live)
        key = spec_key(live)
        if key not in self._entries:
            self._entries[key] = self._entry(kernel)

    def _entry(self, kernel):
        """The direct launch of a compiled kernel, or _REPLAY where it cannot be made: no compiled kernel
        (the interpreter; a compile still under way, returned as a future), attributes missing, hooks that
        Triton runs before a launch, or a kernel signature other than the arguments' order."""
        if (_KNOBS is None or kernel is None or hasattr(kernel, "result") or getattr(self.fn, "pre_run_hooks", None)
                or not all(hasattr(kernel, a) for a in _NEEDED)):
            return _REPLAY
        signature = getattr(getattr(kernel, "src", None), "signature", None)
        if not isinstance(signature, dict) or list(signature) != self._names:
            return _REPLAY
        return _Entry(kernel, kernel.run, kernel.function, kernel.packed_metadata)


class _Entry(NamedTuple):
    """A compiled kernel and what its launcher takes, read once."""
    kernel: Any
    run: Any
    function: Any
    metadata: Any
