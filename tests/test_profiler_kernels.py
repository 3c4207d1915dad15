"""The packed-format GEMV throughput hook: used when the kernels package provides it, skipped with a note
otherwise (runs on CPU with a stand-in module)."""
import sys
import types

from strata_plan.kernels.formats import TIER_FORMATS
from strata_plan.profiler import gpu


def test_missing_benchmark_is_skipped_with_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "strata_plan.kernels.bench", None)     # import fails
    notes = []
    assert gpu.kernel_throughput(64, 64, notes) == {}
    assert len(notes) == 1 and "skipped" in notes[0]


def test_benchmark_is_called_per_tier_format(monkeypatch):
    calls = []

    def measure_gemv_gbps(fmt, n, k, device="cuda"):
        calls.append((fmt, n, k, device))
        if fmt == TIER_FORMATS[-1]:
            raise RuntimeError("triton: out of resources")
        return 1000.0 + len(calls)
    monkeypatch.setitem(sys.modules, "strata_plan.kernels.bench",
                        types.SimpleNamespace(measure_gemv_gbps=measure_gemv_gbps))
    notes = []
    out = gpu.kernel_throughput(256, 128, notes)
    assert [c[0] for c in calls] == list(TIER_FORMATS) and all(c[1:] == (256, 128, "cuda") for c in calls)
    assert {f: s.median for f, s in out.items()} == {TIER_FORMATS[0]: 1001.0, TIER_FORMATS[1]: 1002.0}
    assert len(notes) == 1 and TIER_FORMATS[-1] in notes[0] and "out of resources" in notes[0]
