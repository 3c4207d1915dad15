"""Moving expert blobs to the device arena: NVMe reads on a reader pool, host-to-device copies on one
copy stream, ordered by the store.

    t = Transfers(arena, bounce_slots=..., slot_bytes=..., readers=8)
    f = Fetch(layer, expert, dst_offset, nbytes, demand=True, ram=view)           # from pinned RAM
    f = Fetch(layer, expert, dst_offset, nbytes, demand=False, file=blob, file_offset=o, split=4)  # NVMe
    t.submit(f); ...; f.wait_enqueued(); compute_stream.wait_event(f.event)

NVMe fetches are read with O_DIRECT (`directio.BlobFile`) into one of `bounce_slots` pinned buffers,
as `split` requests on the reader threads (queue depth = requests in flight over all fetches), then
copied. A fetch carrying `parts` (the sha256 of each `part_bytes` part of the blob, engine/packed.py: the
store sets them on an expert's first read) is checked before its copy: each part is hashed on the hashing
pool (`hashers` threads, hashlib releases the interpreter lock) as soon as the reads covering it have
landed, so the hashing overlaps the fetch's other reads and the reader threads keep the queue depth; a
mismatch fails the fetch with a one-line `UserError` (file, layer, expert, offset, the fix) and its bytes
never reach the arena. Copies over one PCIe link serialize whatever their streams' priorities, so they are
ordered here:
- a copy from RAM (prefill's waves) is enqueued at once, in one piece, by the thread that needs it (`copy_now`);
- NVMe fetches, once read, and streamed dense weights are enqueued in chunks of `chunk_bytes` by one copy
  thread, demand before prefetch, at most `chunks_in_flight` unfinished chunks at once (`_window`).
A copy into a slot first waits (on the GPU) for the event of the last kernel that read the slot
(`Fetch.after`). A fetch can be cancelled until its copy is enqueued (a streamed dense unit issued out of turn). On a
CPU device the copies are plain synchronous copies and `event` is None. Streamed dense weights (`engine.dense`) take the
copy thread's queue with `Fetch.dst` naming their device buffer instead of an arena offset.
"""
from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .directio import BlobFile, aligned_empty, aligned_view
from .packed import blob_mismatch, hash_threads, part_ok


class FetchError(RuntimeError):
    """A read or copy of one expert failed: the message names the layer, the expert and the file."""


@dataclass(eq=False)
class Fetch:
    layer: int
    expert: int
    dst_offset: int                  # byte offset in the arena
    nbytes: int
    demand: bool
    dst: torch.Tensor | None = None  # or: a uint8 device view to copy into (streamed dense weights)
    what: str = ""                   # names a fetch that is not an expert (describe)
    ram: torch.Tensor | None = None  # uint8 view of the blob in pinned RAM
    file: BlobFile | None = None     # or: where it lies on NVMe
    file_offset: int = 0
    split: int = 1
    parts: tuple[str, ...] = ()      # sha256 of each part_bytes part: checked before the copy when set
    part_bytes: int = 0
    on_verified: Callable[[], None] | None = None   # called (transfers' lock held) once every part matched
    after: Any = None                # event the copy must wait for (the slot's last reader)
    event: Any = None                # recorded after the copy; None on CPU
    seq: int = 0
    cancelled: bool = False
    error: BaseException | None = None
    enqueued: threading.Event = field(default_factory=threading.Event)
    _parts_left: int = 0             # read requests not finished
    _hashes_left: int = 0            # part hashes submitted, not finished
    _hash_wait: list = field(default_factory=list)   # per hashed part: read requests covering it not finished
    _bounce: int = -1

    @property
    def source(self) -> str:
        return "nvme" if self.file is not None else "ram"

    def done(self) -> bool:
        """The blob is in the arena (its copy finished), without waiting."""
        return self.enqueued.is_set() and self.error is None and (self.event is None or self.event.query())

    def wait_enqueued(self) -> None:
        self.enqueued.wait()
        if self.error is not None:
            raise self.error

    def describe(self) -> str:
        if self.what:
            return self.what
        where = f"{self.file.path} at offset {self.file_offset}" if self.file is not None else "pinned RAM"
        return f"layer {self.layer}, expert {self.expert} ({where})"


CHUNK_BYTES = 8 << 20      # the copy thread's copies go out in chunks of this size ...
CHUNKS_IN_FLIGHT = 1       # ... at most this many on the copy stream at once (a demand copy waits behind them)


class Transfers:
    def __init__(self, arena: torch.Tensor, bounce_slots: int, slot_bytes: int, readers: int = 8,
                 chunk_bytes: int = CHUNK_BYTES, chunks_in_flight: int = CHUNKS_IN_FLIGHT, hashers: int = 0):
        self.arena = arena
        self.cuda = arena.is_cuda
        self.copy_stream = torch.cuda.Stream(arena.device) if self.cuda else None
        self.chunk_bytes, self.chunks_in_flight = chunk_bytes, max(1, chunks_in_flight)
        self._bounce = [aligned_empty(slot_bytes, pin=self.cuda) for _ in range(bounce_slots)]
        self._bounce_views = [aligned_view(v) for _, v in self._bounce]
        self._free_bounce = deque(range(bounce_slots))
        self._lock = threading.Condition()
        self._reads: list = []       # heap of (not demand, seq, part, fetch, a, n)
        self._waiting: list = []     # heap of (not demand, seq, fetch): NVMe fetches waiting for a bounce buffer
        self._copies: list = []      # heap of (not demand, seq, fetch)
        self._seq = itertools.count()
        self._closed = False
        # the copy thread's chunks unfinished on the copy stream, at most chunks_in_flight: (end event, fetch whose
        # bounce buffer frees when it completes, or None); lock held to change it
        self._window: deque = deque()
        self._hasher = ThreadPoolExecutor(hashers or hash_threads(), thread_name_prefix="strata-hash") \
            if bounce_slots else None
        self._threads = [threading.Thread(target=self._read_loop, name=f"strata-read-{i}", daemon=True)
                         for i in range(readers if bounce_slots else 0)]
        self._threads.append(threading.Thread(target=self._copy_loop, name="strata-copy", daemon=True))
        for t in self._threads:
            t.start()

    # ---- API ---------------------------------------------------------------------------------------
    def submit(self, f: Fetch) -> Fetch:
        """Queue a fetch for the reader and copy threads."""
        f.seq = next(self._seq)
        with self._lock:
            if self._closed:
                raise RuntimeError("transfers are closed")
            if f.file is None:
                heapq.heappush(self._copies, (not f.demand, f.seq, f))
            else:
                heapq.heappush(self._waiting, (not f.demand, f.seq, f))
                self._admit()
            self._lock.notify_all()
        return f

    def copy_now(self, f: Fetch) -> Fetch:
        """Enqueue a RAM fetch's copy from the calling thread, in one piece (no hop to the copy thread)."""
        f.seq = next(self._seq)
        self._enqueue_copy(f, f.ram)
        return f

    def cancel(self, f: Fetch) -> bool:
        """Drop a fetch whose copy is not enqueued yet; True if it was dropped (else it lands anyway)."""
        with self._lock:
            if f.enqueued.is_set():
                return False
            f.cancelled = True
            return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        for t in self._threads:
            t.join(timeout=10)
        if self._hasher is not None:
            self._hasher.shutdown(wait=True, cancel_futures=True)
        if self.cuda:
            self.copy_stream.synchronize()

    # ---- reader threads ------------------------------------------------------------------------------
    def _admit(self) -> None:
        """(lock held) Give waiting NVMe fetches bounce buffers, best first, and queue their parts."""
        while self._waiting and self._free_bounce:
            _, _, f = heapq.heappop(self._waiting)
            if f.cancelled:
                f.enqueued.set()
                continue
            f._bounce = self._free_bounce.popleft()
            step = -(-f.nbytes // max(1, f.split) // 4096) * 4096
            parts = [(a, min(step, f.nbytes - a)) for a in range(0, f.nbytes, step)]
            f._parts_left = len(parts)
            if f.parts:                         # read requests covering each hashed part
                f._hash_wait = [0] * len(f.parts)
                for a, n in parts:
                    for k in range(a // f.part_bytes, (a + n - 1) // f.part_bytes + 1):
                        f._hash_wait[k] += 1
            for i, (a, n) in enumerate(parts):
                heapq.heappush(self._reads, (not f.demand, f.seq, i, f, a, n))

    def _read_loop(self) -> None:
        while True:
            with self._lock:
                while not self._reads and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                _, _, _, f, a, n = heapq.heappop(self._reads)
            try:
                if f.error is None:
                    f.file.read_into(self._bounce_views[f._bounce][a:], f.file_offset + a, n)
            except OSError as e:
                f.error = FetchError(f"read error for {f.describe()}: {e.strerror or e}")
            with self._lock:
                if f.parts and f.error is None:  # the hashed parts this request completed go to the hashers
                    for k in range(a // f.part_bytes, (a + n - 1) // f.part_bytes + 1):
                        f._hash_wait[k] -= 1
                        if f._hash_wait[k] == 0:
                            f._hashes_left += 1
                            self._hasher.submit(self._check_part, f, k)
                f._parts_left -= 1
                self._read_done(f)

    def _check_part(self, f: Fetch, k: int) -> None:
        """(a hashing thread) Part k of an NVMe fetch against its sha256, then the fetch's completion."""
        a = k * f.part_bytes
        b = min(f.nbytes, a + f.part_bytes)
        err: BaseException | None = None
        try:
            if not part_ok(self._bounce_views[f._bounce], a, b, f.parts[k]):
                err = blob_mismatch(f.file.path.parent, f.file.path, f.layer, f.expert, f.file_offset, f.nbytes, k,
                                    f.part_bytes)
        except Exception as e:                # noqa: BLE001 - reported on the fetch, raised by the store
            err = FetchError(f"checksum of {f.describe()} failed: {e}")
        with self._lock:
            if err is not None and f.error is None:
                f.error = err
            f._hashes_left -= 1
            self._read_done(f)

    def _read_done(self, f: Fetch) -> None:
        """(lock held) Once every read and part hash of an NVMe fetch finished: on to the copy thread, or (an
        error, a cancelled fetch) its bounce buffer freed and the fetch marked enqueued."""
        if f._parts_left or f._hashes_left:
            return
        if f.error is None and f.parts and f.on_verified is not None:
            f.on_verified()
        if f.error is not None or f.cancelled:
            self._free_bounce.append(f._bounce)
            f._bounce = -1
            f.enqueued.set()
            self._admit()
        else:
            heapq.heappush(self._copies, (not f.demand, f.seq, f))
        self._lock.notify_all()

    # ---- the copy thread -----------------------------------------------------------------------------
    def _copy_loop(self) -> None:
        while True:
            with self._lock:
                while not self._copies and not self._closed:
                    if any(f is not None for _, f in self._window):
                        break                     # a bounce buffer frees when its copy completes
                    self._lock.wait()
                if self._closed:
                    return
                item = heapq.heappop(self._copies)[2] if self._copies else None
                if item is not None and item.cancelled:
                    self._release_bounce(item)
                    item.enqueued.set()
                    continue
            if item is None:                      # nothing new: wait for the oldest chunk in flight
                self._wait_oldest()
                continue
            src = self._bounce[item._bounce][1][:item.nbytes] if item.file is not None else item.ram
            try:
                self._enqueue_copy(item, src, windowed=True)
            except Exception as e:               # noqa: BLE001 - reported on the fetch, raised by the store
                item.error = FetchError(f"copy failed for {item.describe()}: {e}")
                item.enqueued.set()

    def _retire_done(self) -> None:
        """(lock held) Drop the window's finished chunks, oldest first, freeing their bounce buffers."""
        w = self._window
        while w and w[0][0].query():
            _, f = w.popleft()
            if f is not None:
                self._release_bounce(f)

    def _wait_oldest(self) -> None:
        """Wait (lock not held, the interpreter lock released) for the window's oldest chunk, then retire."""
        with self._lock:
            ev = self._window[0][0] if self._window else None
        if ev is not None:
            ev.synchronize()
        with self._lock:
            self._retire_done()

    def _release_bounce(self, f: Fetch) -> None:
        """(lock held) Return a fetch's bounce buffer and admit waiting reads."""
        if f._bounce >= 0:
            self._free_bounce.append(f._bounce)
            f._bounce = -1
            self._admit()
            self._lock.notify_all()

    def _enqueue_copy(self, f: Fetch, src: torch.Tensor, windowed: bool = False) -> None:
        dst = f.dst if f.dst is not None else self.arena[f.dst_offset:f.dst_offset + f.nbytes]
        if not self.cuda:
            dst.copy_(src)
            with self._lock:
                self._release_bounce(f)
            f.enqueued.set()
            return
        chunk = self.chunk_bytes if windowed else max(1, f.nbytes)     # copies from RAM: one piece
        with torch.cuda.stream(self.copy_stream):
            if f.after is not None:               # the slot's last reader first
                self.copy_stream.wait_event(f.after)
            for a in range(0, max(1, f.nbytes), chunk):
                b = min(f.nbytes, a + chunk)
                if not windowed:
                    f.event = self._copy_chunk(dst, src, a, b)
                    continue
                while True:                       # room in the shared window, then the chunk (lock held)
                    with self._lock:
                        self._retire_done()
                        if len(self._window) < self.chunks_in_flight:
                            f.event = self._copy_chunk(dst, src, a, b)
                            self._window.append((f.event, f if b == f.nbytes and f.file is not None else None))
                            break
                    self._wait_oldest()
        f.enqueued.set()                          # (`event`: after its last chunk)

    def _copy_chunk(self, dst: torch.Tensor, src: torch.Tensor, a: int, b: int):
        """(the copy stream current) Bytes [a, b) of src into dst; the event after the copy."""
        dst[a:b].copy_(src[a:b], non_blocking=True)
        end = torch.cuda.Event()
        end.record(self.copy_stream)
        return end
