"""Host RAM: size, copy bandwidth at a small size, and the capped pin probe."""
import pytest

from strata_plan.profiler import host
from strata_plan.profiler.timing import MiB


def test_ram_info_is_sane():
    r = host.ram_info()
    assert 0 < r.available_bytes <= r.total_bytes
    assert r.total_gb == r.total_bytes / 1e9


def test_memcpy_bandwidth_small():
    st = host.memcpy_bandwidth(16 * MiB, threads=2, repeats=3)
    assert st.repeats == 3
    assert 0.1 < st.median < 10_000          # GB/s, read + write counted


class FakePinner:
    """Pins until `fail_after` chunks are held; records what is held and released."""

    def __init__(self, fail_after=None):
        self.fail_after, self.held, self.max_held, self.sizes = fail_after, 0, 0, []

    def __call__(self, n):
        if self.fail_after is not None and len(self.sizes) >= self.fail_after:
            raise RuntimeError("CUDA error: out of memory")
        self.sizes.append(n)
        self.held += n
        self.max_held = max(self.max_held, self.held)

        def release():
            self.held -= n
        return release


def test_pin_probe_stops_at_cap_and_releases_everything():
    pin = FakePinner()
    p = host.probe_pinnable(pin, cap_bytes=10 * MiB, chunk_bytes=4 * MiB)
    assert pin.sizes == [4 * MiB, 4 * MiB, 2 * MiB]      # never more than the cap
    assert p.pinned_bytes == 10 * MiB and p.hit_cap and not p.error
    assert pin.held == 0 and pin.max_held == 10 * MiB
    assert p.rate_gbps > 0


def test_pin_probe_reports_failure_below_cap():
    pin = FakePinner(fail_after=2)
    p = host.probe_pinnable(pin, cap_bytes=64 * MiB, chunk_bytes=4 * MiB)
    assert p.pinned_bytes == 8 * MiB and not p.hit_cap
    assert "out of memory" in p.error
    assert pin.held == 0


def test_pin_probe_releases_on_interrupt():
    pin = FakePinner()
    calls = []

    def pin_then_interrupt(n):
        if calls:
            raise KeyboardInterrupt
        calls.append(n)
        return pin(n)
    with pytest.raises(KeyboardInterrupt):
        host.probe_pinnable(pin_then_interrupt, cap_bytes=64 * MiB, chunk_bytes=4 * MiB)
    assert pin.held == 0
