"""A watch on the NVMe stager while a benchmark row runs: past `after_s` seconds into a row, every `every_s` one
line of what the newest stager (engine/stager.py) knows: the GPU's request and done counters and its error word
(pinned, read without stopping the GPU), what the stager has seen of them, reads queued, in flight (and the oldest's
age) and finished. A row that crawls (REQ advancing) reads apart from one that is stuck (REQ still); the drive's
reads that never end show as an old read in flight.

    watch = StagerWatch(after_s=30)       # before any engine opens (it wraps Stager.__init__)
    with watch.row("seed.plan"):
        ...measure...
"""
from __future__ import annotations

import contextlib
import threading
import time

from strata_plan.engine import stager as stager_mod
from strata_plan.kernels import stage_wait as sw


class StagerWatch:
    def __init__(self, after_s: float = 30.0, every_s: float = 10.0, log=print):
        self.after_s, self.every_s, self.log = after_s, every_s, log
        self.name, self.started, self.stager = None, None, None
        init = stager_mod.Stager.__init__
        watch = self

        def spy(st, *args, **kw):
            init(st, *args, **kw)
            watch.stager = st
        stager_mod.Stager.__init__ = spy
        threading.Thread(target=self._loop, name="stager-watch", daemon=True).start()

    @contextlib.contextmanager
    def row(self, name: str):
        self.name, self.started = name, time.perf_counter()
        try:
            yield
        finally:
            self.started = None

    def line(self) -> str:
        st = self.stager
        if st is None:
            return "no stager opened yet"
        w, c, now = st.hv.words, st.counts, time.perf_counter()
        if st.io == "aio":
            taken = [r.taken for r in list(st._reads.values()) if getattr(r, "taken", None)]
            flying = len(st._reads)
        else:
            taken, flying = [], int((st.state == stager_mod.READING).sum())
        oldest = f", oldest {now - min(taken):.2f} s" if taken else ""
        return (f"REQ {int(w[sw.REQ])} DONE {int(w[sw.DONE])} ERR {int(w[sw.ERR])}; the stager saw "
                f"{st.seen_req}/{st.seen_done}, {len(st._heap)} reads queued, {flying} in flight{oldest}, "
                f"{int(c.reads_demand.sum())} demand + {int(c.reads_guess.sum())} guess reads done; threads alive "
                f"{sum(t.is_alive() for t in st._threads)}/{len(st._threads)}")

    def _loop(self) -> None:
        while True:
            time.sleep(self.every_s)
            t0 = self.started
            if t0 is not None and time.perf_counter() - t0 >= self.after_s:
                self.log(f"watch: {self.name} running {time.perf_counter() - t0:.0f} s: {self.line()}")
