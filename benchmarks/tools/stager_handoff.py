"""Diagnostic (CPU, seconds): what the NVMe stager's thread structure costs apart from the drive.

    python3 benchmarks/tools/stager_handoff.py [--requests 400] [--layer-us 500]

A stand-in for the GPU (another process, so it holds no lock of the stager's interpreter) writes a request number
into shared memory and spins until the ready word shows it; the stager side is the engine's shape in miniature: a
poller thread that spins with `time.sleep(0)` (its timer slack the default 50 us or 1 ns) or sleeps 20 us, hands the request through a Condition to a reader
thread, which reads a 184 KB blob (page-cached: the drive left out), optionally hashes it (sha256, as a blob's first
read in a run is), and publishes. Prints the median and p90 request-to-ready latency per variant (interpreter switch
interval 200 us as the store sets it, or 5 ms). Not the engine and not a benchmark: no results file. On the 2-core CI
machine (2026-12-05): 59 us median without the hash, 189 us with it (sha256 of 184 KB at ~1.5 GB/s)."""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from multiprocessing import shared_memory

import numpy as np

BLOB = 184 * 1024


def stager(name: str, spin: bool, hashed: bool, switch: float, path: str, stop, slack_ns: int = 0) -> None:
    sys.setswitchinterval(switch)
    if slack_ns:                                     # the poller's timer slack (prctl PR_SET_TIMERSLACK; Linux)
        import ctypes
        ctypes.CDLL(None).prctl(29, ctypes.c_ulong(slack_ns), 0, 0, 0)
    shm = shared_memory.SharedMemory(name=name)
    words = np.ndarray((2,), dtype=np.int64, buffer=shm.buf)      # [request, ready]
    cv, queue = threading.Condition(), []
    fd, buf = os.open(path, os.O_RDONLY), bytearray(BLOB)

    def reader() -> None:
        while True:
            with cv:
                while not queue:
                    cv.wait()
                s = queue.pop(0)
            if s < 0:
                return
            os.preadv(fd, [buf], 0)
            if hashed:
                hashlib.sha256(buf).digest()
            words[1] = s

    threading.Thread(target=reader, daemon=True).start()
    seen = 0
    while not stop.is_set():
        r = int(words[0])
        if r == seen:
            time.sleep(0 if spin else 20e-6)
            continue
        seen = r
        with cv:
            queue.append(r)
            cv.notify()
    with cv:
        queue.append(-1)
        cv.notify()
    os.close(fd)                                     # (the shared block closes with the process)


def measure(spin: bool, hashed: bool, switch: float, path: str, n: int, layer_s: float,
            slack_ns: int = 0) -> list[float]:
    shm = shared_memory.SharedMemory(create=True, size=16)
    words = np.ndarray((2,), dtype=np.int64, buffer=shm.buf)
    words[:] = 0
    stop = mp.Event()
    p = mp.Process(target=stager, args=(shm.name, spin, hashed, switch, path, stop, slack_ns))
    p.start()
    time.sleep(0.3)
    lat = []
    for s in range(1, n + 1):
        t0 = time.perf_counter()
        words[0] = s
        while int(words[1]) != s:
            pass
        lat.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        while time.perf_counter() - t1 < layer_s:          # the GPU computing a layer
            pass
    stop.set()
    p.join()
    del words
    shm.close()
    shm.unlink()
    return lat[n // 20:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--layer-us", type=float, default=500)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "blob")
        with open(path, "wb") as f:
            f.write(os.urandom(BLOB))
        for spin, hashed, switch, slack in ((True, False, 2e-4, 0), (True, False, 2e-4, 1), (True, False, 5e-3, 0),
                                            (False, False, 2e-4, 0), (True, True, 2e-4, 0), (True, True, 2e-4, 1),
                                            (False, True, 2e-4, 0)):
            lat = measure(spin, hashed, switch, path, a.requests, a.layer_us * 1e-6, slack)
            print(f"poller {'spins' if spin else 'sleeps 20 us'}{', timer slack 1 ns' if slack else ''}, "
                  f"{'sha256, ' if hashed else ''}switch interval {switch * 1e6:.0f} us: median "
                  f"{statistics.median(lat) * 1e6:.1f} us, p90 {np.percentile(lat, 90) * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
