"""`kernels.launch.Launch`: the direct launch of a compiled Triton kernel, checked against a recording
stand-in for Triton's JIT function and compiled kernel (CPU, no Triton run), and against the launch
protocol of the Triton installed here. The real kernels through both paths: test_kernels_moe_calls.py."""
from __future__ import annotations

import inspect

import pytest
import torch

from strata_plan.kernels import launch


def kernel_source(a_p, n, b_p, M, BN: "tl.constexpr", CG: "tl.constexpr" = 0):   # noqa: F821
    pass


NAMES = list(inspect.signature(kernel_source).parameters)


class FakeCompiled:
    """What `JITFunction.run` uses of a CompiledKernel, recording the launches made through it."""

    def __init__(self, names=NAMES):
        self.function, self.packed_metadata = object(), object()
        self.src = type("Src", (), {"signature": {n: "*fp32" for n in names}})()
        self.launches, self.metadata_calls = [], []

    def run(self, *args):
        self.launches.append(args)

    def launch_metadata(self, grid, stream, *args):
        self.metadata_calls.append((grid, stream, args))
        return {"name": "kernel_source"}


class FakeJIT:
    """`kernel[grid](*args, **kwargs)`: records the call, returns `compiled` (None: the interpreter)."""

    def __init__(self, compiled):
        self.fn, self.compiled, self.calls = kernel_source, compiled, []

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return self.compiled
        return call


@pytest.fixture
def tensors():
    a = torch.zeros(64, dtype=torch.float32)
    b = torch.zeros(64, dtype=torch.float32)
    return a, b


def make(fn, b, **kw):
    return launch.Launch(fn, (4, 2), dict(a_p=None, n=7, b_p=b, M=3, BN=64, num_warps=4), live=("a_p", "n"), **kw)


def test_first_call_compiles_through_triton_then_launches_directly(tensors):
    a, b = tensors
    ck = FakeCompiled()
    fn = FakeJIT(ck)
    ln = make(fn, b, direct=True)
    assert ln.mode(a, 7) == "new"
    ln(123, a, 7)
    # the first call: Triton's launcher, every parameter in order (tensors as tensors), options by name
    assert fn.calls == [((4, 2, 1), (a, 7, b, 3, 64, 0), {"num_warps": 4})] and ck.launches == []
    assert ln.mode(a, 7) == "direct"
    ln(123, a, 7)
    ln(456, a, 32)                       # divisible by 16, 7 is not: another specialization, Triton again
    assert len(fn.calls) == 2
    ln(456, a, 9)                        # the class of 7: direct
    # direct: the launcher as JITFunction.run calls it, pointers as ints, constexprs and defaults in their
    # places; no hooks registered: no launch metadata, no hooks
    assert ck.launches == [
        (4, 2, 1, 123, ck.function, ck.packed_metadata, None, None, None, a.data_ptr(), 7, b.data_ptr(), 3, 64, 0),
        (4, 2, 1, 456, ck.function, ck.packed_metadata, None, None, None, a.data_ptr(), 9, b.data_ptr(), 3, 64, 0)]


@pytest.mark.parametrize("change", ["dtype", "alignment", "wide", "wide and divisible by 16"])
def test_a_new_specialization_goes_through_triton(tensors, change):
    a, b = tensors
    ck = FakeCompiled()
    fn = FakeJIT(ck)
    ln = make(fn, b, direct=True)
    for n in (7, 1, 16):                 # an int's classes within i32: other, 1, divisible by 16
        ln(0, a, n)
    assert len(fn.calls) == 3 and all(ln.mode(a, n) == "direct" for n in (7, 1, 16))
    fn.calls.clear()
    other_a, n = {"dtype": (a.to(torch.float16), 7), "alignment": (a[1:], 7), "wide": (a, 7 + 2 ** 32),
                  "wide and divisible by 16": (a, 2 ** 32)}[change]
    assert ln.mode(other_a, n) == "new"
    ln(0, other_a, n)
    assert len(fn.calls) == 1 and ck.launches == []
    ln(0, other_a, n)
    assert len(fn.calls) == 1 and len(ck.launches) == 1


def test_plain_when_asked_or_when_the_kernel_cannot_be_launched_directly(tensors):
    a, b = tensors
    cases = {"asked": (FakeCompiled(), dict(direct=False)),
             "interpreter": (None, dict(direct=True)),
             "no run": (type("Old", (), {"function": 1, "packed_metadata": 1})(), dict(direct=True)),
             "other signature order": (FakeCompiled(names=NAMES[::-1]), dict(direct=True)),
             "a compile under way": (type("Future", (FakeCompiled,), {"result": lambda self: self})(),
                                     dict(direct=True))}
    for label, (compiled, kw) in cases.items():
        fn = FakeJIT(compiled)
        ln = make(fn, b, **kw)
        for _ in range(3):
            ln(0, a, 7)
        assert len(fn.calls) == 3 and ln.mode(a, 7) == "plain", label
        assert compiled is None or not getattr(compiled, "launches", []), label
    # not asked: direct
    ck = FakeCompiled()
    fn = FakeJIT(ck)
    ln = make(fn, b)
    ln(0, a, 7)
    ln(0, a, 7)
    assert len(fn.calls) == 1 and len(ck.launches) == 1 and ln.mode(a, 7) == "direct"


def test_a_launcher_that_refuses_the_arguments_falls_back(tensors):
    a, b = tensors

    class Refusing(FakeCompiled):
        def run(self, *args):
            raise TypeError("launcher takes other arguments")
    fn = FakeJIT(Refusing())
    ln = make(fn, b, direct=True)
    ln(0, a, 7)
    ln(0, a, 7)                          # refused: launched through Triton instead, and from then on
    ln(0, a, 7)
    assert len(fn.calls) == 3 and ln.mode(a, 7) == "plain"


@pytest.mark.skipif(launch._KNOBS is None, reason="this Triton has no knobs.runtime launch hooks")
def test_a_launch_hook_gets_its_metadata(tensors, monkeypatch):
    a, b = tensors
    ck = FakeCompiled()
    ln = make(FakeJIT(ck), b, direct=True)
    ln(9, a, 7)
    seen = []
    hook = seen.append
    enter = launch._KNOBS.launch_enter_hook
    if hasattr(enter, "calls"):                     # Triton >= 3.7: a HookChain
        monkeypatch.setattr(enter, "calls", [hook])
    else:
        monkeypatch.setattr(launch._KNOBS, "launch_enter_hook", hook)
    ln(9, a, 7)
    assert ck.metadata_calls == [((4, 2, 1), 9, (a.data_ptr(), 7, b.data_ptr(), 3, 64, 0))]
    assert ck.launches[-1][6] == {"name": "kernel_source"}


def test_a_launch_keeps_no_live_tensor(tensors):
    a, b = tensors
    ln = launch.Launch(FakeJIT(FakeCompiled()), (1,), dict(a_p=a, n=7, b_p=b, M=3, BN=64), live=("a_p", "n"))
    assert not any(o is a for o in ln._objs) and a.data_ptr() not in ln._ints


def test_live_names_must_be_kernel_arguments(tensors):
    _, b = tensors
    with pytest.raises(ValueError):
        launch.Launch(FakeJIT(None), (1,), dict(a_p=None, n=7, b_p=b, M=3, BN=64), live=("a_p", "x"))
    with pytest.raises(TypeError):                  # M not given (no default)
        launch.Launch(FakeJIT(None), (1,), dict(a_p=None, n=7, b_p=b, BN=64), live=("a_p",))


def test_installed_triton_launches_compiled_kernels_as_launch_does():
    # Launch calls CompiledKernel.run as JITFunction.run does: grid, stream, function, packed metadata,
    # launch metadata, the two hooks, then every parameter in order (bound_args, constexprs included):
    # Triton 3.6 (the H200's) and 3.9 (CI's) both. A Triton that changes it fails here, on CPU, first.
    from triton.runtime.jit import JITFunction
    try:
        run = getattr(JITFunction.run, "_original", JITFunction.run)     # under engine.launches.hook_triton
        src = " ".join(inspect.getsource(run).split())
    except (OSError, TypeError):
        pytest.skip("Triton's source is not installed")
    assert ("kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata, "
            "knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound_args.values())") in src
    assert "return kernel" in src
