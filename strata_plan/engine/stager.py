"""The NVMe stager of the device loop: reads the experts the GPU asks for (and those the lookahead guesses) with
O_DIRECT into a pinned staging cache, where the MoE kernel reads them in place.

    st = Stager(store, mem, base, n_slots, depth, guesses_per_layer)   # mem: pinned uint8
    ...the graph calls kernels.stage_wait / stage_done each MoE layer...
    st.check()            # after a token reaches the host: the first read error, as one line (UserError)
    st.counts.to_data(); st.close()

The GPU and the stager share a pinned block (`kernels.stage_wait`: words, ready table, request ring).
- *The poller* (one thread) follows the ring, polling at once while requests come and backing off to 1 ms polls
  after 0.2 s without one. A request row (REQ advanced) holds the NVMe ids the layer reads from staging: each one
  not staged or being read is queued as a demand read (also when it was queued as a guess). A finished layer (DONE
  advanced) carries the lookahead guesses of the next `depth` layers, queued behind every demand by depth, then by
  score; a guess whose layer the GPU has already asked for is dropped. With `early` (the engine's
  `lookahead_point="attention"`) the guesses were taken at the layer's router and come in the request's own row:
  they are queued with it, a whole MoE layer sooner. Lookahead precision and recall by depth are
  counted here, over the ids read from staging: the guesses of request s - d against request s's ids.
- *The readers* (`io="threads"`, the reference: `staging.nvme_in_flight` threads, at least 4) take the queue's best
  entry, pick a slot, read the blob (O_DIRECT into
  the slot: no bounce, no copy) in the plan's split (`staging.nvme_reads[f].batch_splits`, by how many of that format
  were queued together; the requests in flight at once on a pool as deep as the plan's queue), check every part's
  sha256 against index.json at the blob's first read in the run (`store.verified`; a re-read after eviction is not
  hashed again), then publish `ready[j, e]` = the slot's address (after the bytes: x86 stores are not reordered, and
  the GPU loads `ready` with acquire semantics). With `io="aio"` the poller itself takes as many entries as there
  would be readers and submits their reads together (engine/aio.py: one system call, no thread hand-off between
  one read's start and the next); one reaper thread takes the completions, checks and publishes them the same way
  and submits what the queue holds next.
- *Slots*: LRU by last use (a routed use stamps a slot with its request; a guess with the request it is for). A
  demand read takes a free slot or evicts the least recently used staged slot; a guess evicts only a slot whose stamp
  is in the past. Evicting (j, e): `ready[j, e]` = -1, a full fence, then REQ and the outstanding row (REQ > DONE)
  are read; if that row names (j, e) the GPU may be reading it: ready is put back and the next victim is tried (the
  GPU's side of this handshake is in `kernels.stage_wait`). A slot staged by a guess and evicted unused is wasted.
- *Errors* (a failed or short read, a checksum mismatch) become one `UserError` naming the file, the layer, the
  expert and the offset; `ready` of that expert is set to -2, so a GPU waiting for it goes on with the poison slot,
  and the host raises the error (`check`) before the token computed from it is shown.
"""
from __future__ import annotations

import errno
import heapq
import itertools
import os
import threading
import time
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from strata_plan.errors import UserError
from strata_plan.kernels import stage_wait as sw

from .directio import aligned_view, split_parts
from .packed import verify_part

FREE, READING, STAGED = 0, 1, 2
CLOSE_S = 30.0             # close(): how long the stager's threads get to stop, all together
PARTS = 64                 # io="aio": a read's tag is its blob read's id x PARTS + the part's index
RING_ROWS = 64
IDLE_SPIN_S = 0.005        # the poller yields and polls again while requests came this recently (a decode: every layer)
IDLE_S = 0.2               # ... sleeps POLL_S between polls up to this long without one, then IDLE_POLL_S
POLL_S, IDLE_POLL_S = 50e-6, 1e-3
_fence_lock = threading.Lock()


def full_fence() -> None:
    """A full memory barrier on this thread: a lock's acquire and release (locked read-modify-writes on x86)."""
    _fence_lock.acquire()
    _fence_lock.release()


@dataclass
class StagerCounters:
    """Per MoE layer: reads issued on demand and on a guess, their bytes, staged reads evicted unused (wasted),
    the reader threads' busy seconds, routed NVMe uses the stager found staged already (host view) or still being
    read, and the fate of the lookahead's reads (queued, dropped as stale or for want of a slot). The host's
    part of a demand read's latency (`lat`, seconds summed over the demand reads): from the poller seeing the
    request to a reader taking it (queue), and from there to the ready word published (read: the drive, the
    checksum at a blob's first read, the split's hand-offs); `by_rank`: the queue time of a request's first,
    second, .. demand read taken (how the readers' turns add up). `poll`: while decoding, for each look at the ring
    that found a request, the gap since the look before (count, seconds, the longest): the request came within it,
    so a long gap is the poller kept from running. Counted per request found, not per look (the spin stays bare)."""

    reads_demand: np.ndarray
    reads_guess: np.ndarray
    read_bytes: np.ndarray
    guess_bytes: np.ndarray
    wasted_reads: np.ndarray
    wasted_bytes: np.ndarray
    found_staged: np.ndarray
    routed: np.ndarray
    guess_queued: np.ndarray       # lookahead reads queued (an NVMe guess not staged, not queued yet)
    guess_stale: np.ndarray        # ... taken by a reader after their layer's request: not read (the layer read them)
    guess_no_slot: np.ndarray      # ... taken when every staged slot was stamped for the present or a later request
    found_reading: np.ndarray      # routed NVMe uses whose read (a guess's) was still running: the GPU waits for its end
    guesses: np.ndarray            # [depth, L] lookahead guesses for layer j (NVMe ids not in VRAM)
    right: np.ndarray              # [depth, L] of those, routed
    hinted_used: np.ndarray        # [depth, L] ids read from staging where a guess existed
    busy_s: list = field(default_factory=lambda: [0.0])
    lat: dict = field(default_factory=lambda: {"n": 0, "queue_s": 0.0, "read_s": 0.0, "land_s": 0.0})
    by_rank: dict = field(default_factory=dict)    # k -> [reads, queue seconds]: the k-th demand read a request took
    poll: dict = field(default_factory=lambda: {"n": 0, "s": 0.0, "max_s": 0.0})

    @classmethod
    def zeros(cls, L: int, depth: int = 0) -> "StagerCounters":
        return cls(*(np.zeros(L, dtype=np.int64) for _ in range(12)),
                   *(np.zeros((depth, L), dtype=np.int64) for _ in range(3)))

    def to_data(self) -> dict:
        tot = lambda a: int(a.sum())      # noqa: E731
        return {"reads_demand": tot(self.reads_demand), "reads_guess": tot(self.reads_guess),
                "read_bytes": tot(self.read_bytes), "guess_bytes": tot(self.guess_bytes),
                "wasted_reads": tot(self.wasted_reads), "wasted_bytes": tot(self.wasted_bytes),
                "found_staged": tot(self.found_staged), "routed": tot(self.routed),
                "staging_hit_rate": tot(self.found_staged) / max(1, tot(self.routed)),
                "guess_queued": tot(self.guess_queued), "guess_stale": tot(self.guess_stale),
                "guess_no_slot": tot(self.guess_no_slot), "found_reading": tot(self.found_reading),
                "read_busy_s": self.busy_s[0],
                "demand_queue_ms_mean": 1e3 * self.lat["queue_s"] / max(1, self.lat["n"]),
                "demand_read_ms_mean": 1e3 * self.lat["read_s"] / max(1, self.lat["n"]),
                # ... of which the drive's: taken until the host saw the last part in (the rest: check and publish)
                "demand_land_ms_mean": 1e3 * self.lat["land_s"] / max(1, self.lat["n"]),
                "demand_queue_ms_by_rank": [round(1e3 * self.by_rank[k][1] / self.by_rank[k][0], 4)
                                            for k in sorted(self.by_rank)],
                "demand_reads_by_rank": [self.by_rank[k][0] for k in sorted(self.by_rank)],
                "poll_gap_ms_mean": 1e3 * self.poll["s"] / max(1, self.poll["n"]),
                "poll_gap_ms_max": 1e3 * self.poll["max_s"]}


@dataclass
class _Read:
    """A blob read a reader (or the AIO poller) took: (layer j, expert e) into `slot`, its queue priority (0: demand),
    its turn among its request's demand reads, when it was queued and taken. io="aio": its parts (start, bytes) in
    the blob, how many are still out, the first error."""
    slot: int
    prio: int
    j: int
    e: int
    split: int
    queued_at: float
    rank: int
    taken: float
    landed: float = 0.0            # when the host saw its last part in (before the check and the ready word)
    parts: list = field(default_factory=list)
    left: int = 0
    error: OSError | None = None


def read_splits(plan) -> dict[str, tuple[int, ...]]:
    """Per format, the plan's split of a blob when i experts of that format are read together (i = 1, 2, ..;
    `staging.nvme_reads[f].batch_splits`, else its full-batch `split`): the requests the stager reads a blob in."""
    return {f: tuple(r.batch_splits) or (r.split,) for f, r in (plan.staging.nvme_reads or {}).items()}


class Stager:
    def __init__(self, store, mem: torch.Tensor, base: int, n_slots: int, depth: int,
                 guesses_per_layer: int, read_depths: str = "all", io: str = "threads", early: bool = False):
        L, E = store.nbytes.shape
        self.store, self.L, self.E, self.K = store, L, E, store.top_k
        self.depth, self.W = depth, guesses_per_layer
        # early: the guesses come with the request (taken at its layer's router), not with the layer's end
        self.early = early and depth > 0
        # the guesses read ahead: "all" of depths 1..depth, or the "deepest" alone (the cost model's count; an A/B)
        self.first_read_depth = depth if read_depths == "deepest" else 1
        self.G = depth * guesses_per_layer
        self.R = RING_ROWS
        self.slot_bytes = store.slot_bytes
        if n_slots < 2 * self.K:
            raise ValueError(f"the staging cache needs at least 2 x top_k = {2 * self.K} slots, got {n_slots}")
        self.n_slots = n_slots
        self.mem, self.base = mem, base
        staging = n_slots * self.slot_bytes
        self.layout = {k: staging + v for k, v in sw.block_layout(L, E, self.K, self.G, self.R).items()}
        self.hv = sw.host_views(mem[staging:], L, E, self.K, self.G, self.R)
        self._view = aligned_view(mem[:staging])
        self.nvme = np.array([[store.tier[j][e] == "nvme" for e in range(E)] for j in range(L)])
        self.state = np.full(n_slots, FREE, dtype=np.int8)
        self.key: list[tuple[int, int] | None] = [None] * n_slots
        self.used = np.zeros(n_slots, dtype=bool)
        self.stamp = np.zeros(n_slots, dtype=np.int64)
        # `_take`'s candidates without a scan of the slots: the FREE ones (a min-heap: the lowest first), and the
        # STAGED ones by (stamp, slot) (a min-heap; an entry whose slot left STAGED or was stamped again is stale)
        self._free = list(range(n_slots))
        self._lru: list[tuple[int, int]] = []
        self.where: dict[tuple[int, int], int] = {}
        self.queued: dict[tuple[int, int], int] = {}       # queued reads: the best priority (0: demand)
        self._taken: dict[int, int] = {}                   # request -> its demand reads taken by readers so far
        self._guesses: dict[int, dict[int, set[int]]] = {}  # request -> depth -> the ids guessed for it
        self._heap: list = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self.counts = StagerCounters.zeros(L, depth)
        # a blob read as the plan's split: its requests in flight at once on a pool as deep as the plan's queue
        self.splits = read_splits(store.plan)
        staging = store.plan.staging
        blobs = max(4, staging.nvme_in_flight or self.K)                  # blobs read at once: the reader threads
        depth_q = max([r.queue_depth for r in (staging.nvme_reads or {}).values()] + [1])
        max_split = max((max(v) for v in self.splits.values()), default=1)
        if io == "aio":
            if max_split > PARTS:
                raise ValueError(f"a blob split {max_split} ways: io='aio' takes at most {PARTS} parts")
            from .aio import AioContext
            try:
                self._aio = AioContext(blobs * max_split + 8)
            except OSError as err:          # the system's AIO events used up (fs.aio-max-nr), or refused here
                warnings.warn(f"NVMe stager: native AIO refused ({err.strerror or err}); reading with a thread a "
                              "read (raise fs.aio-max-nr, or pass --stager-io threads)", stacklevel=2)
                io = "threads"
        self.io = io
        self._pool = ThreadPoolExecutor(depth_q, thread_name_prefix="stager-part") \
            if max_split > 1 and io == "threads" else None
        self.error: UserError | None = None
        self._stop = False
        self.seen_req = self.seen_done = 0
        self._threads = [threading.Thread(target=self._poll, name="stager-poll", daemon=True)]
        if io == "aio":                     # the poller submits, one thread reaps (engine/aio.py)
            self._max_blobs = blobs
            self._reads: dict[int, _Read] = {}      # blob read id -> its record (`_submit_next`), until published
            self._tags = itertools.count(1)
            self._retry = False             # a demand read found no slot it may take: try again soon
            self._threads.append(threading.Thread(target=self._reap, name="stager-reap", daemon=True))
        elif io == "threads":
            self._threads += [threading.Thread(target=self._reader, name=f"stager-read-{i}", daemon=True)
                              for i in range(blobs)]
        else:
            raise ValueError(f"stager io {io!r}: 'threads' or 'aio'")
        for t in self._threads:
            t.start()

    # ---- what the device loop needs ------------------------------------------------------------------------
    def offsets(self) -> dict[str, int]:
        """Arena-relative byte offsets of the block's parts (for `kernels.stage_wait.ControlBlock`)."""
        return {k: self.base + self.layout[k] for k in ("words", "ready", "ring", "scores")}

    def check(self) -> None:
        """Raise the first read error (one line); or, if the GPU gave up waiting for an expert without one, say so."""
        if self.error is not None:
            raise self.error
        if int(self.hv.words[sw.ERR]):
            raise UserError("NVMe stager", f"request {int(self.hv.words[sw.ERR])}", "the GPU waited "
                            f"{sw.TIMEOUT_NS / 1e9:.0f} s for an expert the stager never staged "
                            f"({self.state_line(int(self.hv.words[sw.ERR]))})",
                            "report this with the plan and the command (the stager stopped reading)")

    def state_line(self, s: int) -> str:
        """What the stager knew of request s (for the timeout's message: which side lost it)."""
        row = self.hv.ring[s % self.R]
        j = int(row[1])
        with self._cv:
            ids = [int(e) for e in row[2:2 + self.K] if e >= 0] if int(row[0]) == s else []
            per = [f"{e}: ready {int(self.hv.ready[j, e])}, slot {self._slot_line(self.where.get((j, e)))}, queued "
                   f"{self.queued.get((j, e))}" for e in ids]
            alive = sum(t.is_alive() for t in self._threads)
            states = np.bincount(self.state, minlength=3)
            return (f"layer {j}, row {'ours' if int(row[0]) == s else f'of request {int(row[0])}'}; REQ "
                    f"{int(self.hv.words[sw.REQ])} DONE {int(self.hv.words[sw.DONE])}, seen {self.seen_req}/"
                    f"{self.seen_done}; {'; '.join(per) or 'no ids'}; {len(self._heap)} reads queued, slots free "
                    f"{states[FREE]} reading {states[READING]} staged {states[STAGED]}, "
                    f"{alive}/{len(self._threads)} threads alive")

    def _slot_line(self, slot: int | None) -> str:
        """(lock held) A slot's state for `state_line`: None, or its number, state and stamp."""
        if slot is None:
            return "None"
        return f"{slot} ({('free', 'reading', 'staged')[int(self.state[slot])]}, stamp {int(self.stamp[slot])})"

    def reset_counters(self) -> None:
        with self._cv:
            self.counts = StagerCounters.zeros(self.L, self.depth)

    def close(self) -> None:
        """Stop: waits the GPU still has queued (a step queued ahead of the last token read) end at once on the poison
        slot (ABORT), the device's queued work ends, then the threads stop."""
        self.hv.words[sw.ABORT] = 1
        try:
            if self.store.device.type == "cuda":
                torch.cuda.synchronize(self.store.device)
        finally:                                # (a CUDA error here still stops the threads)
            with self._cv:
                self._stop = True
                self._cv.notify_all()
        end = time.perf_counter() + CLOSE_S                 # one deadline for all the threads, not one each
        for t in self._threads:
            t.join(timeout=max(0.0, end - time.perf_counter()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:       # a read the drive never finished holds its thread (daemon: it dies with the process)
            warnings.warn(f"NVMe stager: {', '.join(stuck)} still running {CLOSE_S:.0f} s after close "
                          "(a read the drive has not finished?)", stacklevel=2)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self.io == "aio":
            self._aio.close()

    # ---- the poller ------------------------------------------------------------------------------------------
    def _row(self, s: int) -> np.ndarray | None:
        """Request s's ring row, or None when the ring has moved past it (the GPU is more than R rows ahead)."""
        row = self.hv.ring[s % self.R].copy()
        if int(row[0]) != s or int(self.hv.words[sw.REQ]) >= s + self.R - 1:
            return None
        return row

    def _poll(self) -> None:
        """Follow the ring in request order: request s's routed ids (REQ >= s), then its guesses (DONE >= s; `early`:
        with the request), so a layer's guesses are known before the request they are for."""
        hv = self.hv
        at_done = self.depth and not self.early          # guesses known when DONE advances
        last = look = time.perf_counter()
        while not self._stop:
            req, done = int(hv.words[sw.REQ]), int(hv.words[sw.DONE])
            if not at_done:
                done = req                               # (no news in DONE: the guesses, if any, are in the request)
            now = time.perf_counter()
            if req == self.seen_req and (not at_done or done == self.seen_done):
                idle, look = now - last, now               # decoding: poll at once; idle (prefill, between runs):
                time.sleep(0 if idle < IDLE_SPIN_S else (POLL_S if idle < IDLE_S else IDLE_POLL_S))    # back off
                continue
            if now - last < IDLE_SPIN_S:                   # decoding: the gap the news came in (counted per news)
                p = self.counts.poll
                p["n"], p["s"], p["max_s"] = p["n"] + 1, p["s"] + now - look, max(p["max_s"], now - look)
            last = look = now
            s = max(min(self.seen_req, self.seen_done) + 1, req - self.R + 2)
            while s <= req:
                row = self._row(s)
                if s > self.seen_req:
                    if row is not None:
                        self._routed(s, row)
                    self.seen_req = s
                if s <= done and s > self.seen_done:     # (early: at once, the request's own guesses)
                    if row is not None and self.depth:
                        self._guessed(s, row)
                    self.seen_done = s
                elif s > done:
                    break
                s += 1

    def _routed(self, s: int, row: np.ndarray) -> None:
        j = int(row[1])
        used = {int(e) for e in row[2:2 + self.K] if e >= 0}   # read from staging (not VRAM, RAM, a cached one)
        with self._cv:
            for old in [t for t in self._taken if t < s - self.R]:
                del self._taken[old]
            for d, guessed in self._guesses.pop(s, {}).items():   # the lookahead for this request, by depth
                c = self.counts
                c.guesses[d - 1, j] += len(guessed)
                c.right[d - 1, j] += len(guessed & used)
                c.hinted_used[d - 1, j] += len(used)
            reads = []
            for e in used:
                self.counts.routed[j] += 1
                slot = self.where.get((j, e))
                if slot is not None:
                    self.used[slot], self.stamp[slot] = True, s
                    self._touch(slot)
                    self.counts.found_staged[j] += self.state[slot] == STAGED
                    self.counts.found_reading[j] += self.state[slot] == READING
                elif self.queued.get((j, e), 1) != 0:     # not queued, or only as a guess: a demand read
                    reads.append(e)
            for e, split in self._batch(j, reads):
                self._queue(0, 0.0, s, j, e, split)
            self._start_reads()

    def _guessed(self, s: int, row: np.ndarray) -> None:
        j = int(row[1])
        guesses = row[2 + self.K:2 + self.K + self.G].reshape(self.depth, self.W)
        scores = self.hv.scores[s % self.R].reshape(self.depth, self.W)
        with self._cv:
            for d in range(1, self.depth + 1):
                jj = j + d
                if jj >= self.L:
                    break
                self._guesses.setdefault(s + d, {})[d] = {int(e) for e in guesses[d - 1] if e >= 0}
                if d < self.first_read_depth:
                    continue                               # counted for precision and recall, not read
                reads, score = [], {}
                for e, sc in zip(guesses[d - 1], scores[d - 1]):
                    e = int(e)
                    if e < 0 or not self.nvme[jj, e] or (jj, e) in self.queued:
                        continue
                    slot = self.where.get((jj, e))
                    if slot is not None:
                        self.stamp[slot] = max(self.stamp[slot], s + d)
                        self._touch(slot)
                    else:
                        reads.append(e)
                        score[e] = -float(sc)
                for e, split in self._batch(jj, reads):
                    self._queue(d, score[e], s + d, jj, e, split)
                self.counts.guess_queued[jj] += len(reads)
            self._start_reads()

    def _batch(self, j: int, experts: list[int]) -> list[tuple[int, int]]:
        """(expert, split) for reads of layer j's `experts` queued together: i of one format split
        `batch_splits[i - 1]` ways (PLANNER.md, "What the engine must do")."""
        fmt = [self.store.entries[j][e].format for e in experts]
        n = Counter(fmt)
        out = []
        for e, f in zip(experts, fmt):
            sp = self.splits.get(f, (1,))
            out.append((e, sp[min(n[f], len(sp)) - 1]))
        return out

    def _queue(self, prio: int, score: float, target: int, j: int, e: int, split: int = 1,
               at: float | None = None) -> None:
        at = time.perf_counter() if at is None else at                  # queued first at (a demand read's latency)
        heapq.heappush(self._heap, (prio, score, next(self._order), target, j, e, split, at))
        self.queued[(j, e)] = min(prio, self.queued.get((j, e), prio))

    # ---- the readers ---------------------------------------------------------------------------------------
    def _touch(self, slot: int) -> None:
        """(lock held) A STAGED slot's stamp set: its `_lru` entry (live while the slot is STAGED with that stamp)."""
        if self.state[slot] == STAGED:
            heapq.heappush(self._lru, (int(self.stamp[slot]), slot))
            if len(self._lru) > 4 * self.n_slots + 64:          # stale entries: rebuilt from the live ones
                self._lru = [(int(self.stamp[v]), int(v)) for v in np.flatnonzero(self.state == STAGED)]
                heapq.heapify(self._lru)

    def _take(self, demand: bool, now: int) -> int | None:
        """A slot for a new read (lock held): a free one (the lowest), else the least recently used staged one (by
        stamp, then slot) the GPU cannot be reading (guesses: only slots last used before request `now`)."""
        if self._free:
            return heapq.heappop(self._free)
        kept = []                                          # candidates the GPU may be reading: back in the heap
        try:
            while self._lru:
                st, v = self._lru[0]
                if self.state[v] != STAGED or self.stamp[v] != st:
                    heapq.heappop(self._lru)               # stale
                    continue
                if not demand and st >= now:
                    return None
                heapq.heappop(self._lru)
                j, e = self.key[v]
                old = int(self.hv.ready[j, e])
                self.hv.ready[j, e] = sw.NOT_STAGED
                full_fence()
                req, done = int(self.hv.words[sw.REQ]), int(self.hv.words[sw.DONE])
                if req > done:
                    row = self.hv.ring[req % self.R]
                    if int(row[0]) == req and int(row[1]) == j and e in row[2:2 + self.K].tolist():
                        self.hv.ready[j, e] = old          # the GPU may be reading it: keep it
                        kept.append((st, v))
                        continue
                if not self.used[v]:
                    self.counts.wasted_reads[j] += 1
                    self.counts.wasted_bytes[j] += int(self.store.nbytes[j, e])
                del self.where[(j, e)]
                self.state[v], self.key[v] = FREE, None
                return v
            return None
        finally:
            for item in kept:
                heapq.heappush(self._lru, item)

    def _start_reads(self) -> None:
        """(lock held) The queue has new entries: wake the readers, or with `io="aio"` submit them."""
        if self.io == "aio":
            self._submit_next()
        else:
            self._cv.notify_all()

    def _claim(self) -> "_Read | str | None":
        """(lock held) The queue's best entry that is still to be read, with its slot taken and marked READING; None
        when the queue is empty, "retry" when a demand read found no slot it may take (it is queued again)."""
        while self._heap:
            prio, _, _, target, j, e, split, queued_at = heapq.heappop(self._heap)
            if self.queued.get((j, e)) == prio:
                del self.queued[(j, e)]
            if (j, e) in self.where:
                continue                           # staged meanwhile
            if prio and int(self.hv.words[sw.REQ]) >= target:
                self.counts.guess_stale[j] += 1    # a guess for a layer already asked
                continue
            slot = self._take(prio == 0, int(self.hv.words[sw.REQ]))
            if slot is None:
                if prio == 0:                      # every slot is being read or read by the GPU: try again
                    self._queue(prio, 0.0, target, j, e, split, queued_at)
                    return "retry"
                self.counts.guess_no_slot[j] += 1
                continue
            self.state[slot], self.key[slot] = READING, (j, e)
            self.used[slot], self.stamp[slot] = prio == 0, target
            self.where[(j, e)] = slot
            rank = 0
            if prio == 0:                          # its turn among the request's demand reads
                rank = self._taken.get(target, 0)
                self._taken[target] = rank + 1
            return _Read(slot, prio, j, e, split, queued_at, rank, time.perf_counter())
        return None

    def _finish(self, r: _Read, ok: bool) -> None:
        """(lock held) A blob read ended: counted, and published (ok) or its slot freed and its ready word FAILED."""
        slot, prio, j, e, queued_at, taken = r.slot, r.prio, r.j, r.e, r.queued_at, r.taken
        c = self.counts
        nb = int(self.store.nbytes[j, e])
        (c.reads_demand if prio == 0 else c.reads_guess)[j] += 1
        c.read_bytes[j] += nb
        if prio:
            c.guess_bytes[j] += nb
        if ok:
            self.state[slot] = STAGED
            self._touch(slot)
            self.hv.ready[j, e] = self.base + slot * self.slot_bytes     # after the bytes: published
            if prio == 0:
                lat = c.lat
                lat["n"], lat["queue_s"] = lat["n"] + 1, lat["queue_s"] + taken - queued_at
                lat["read_s"] += time.perf_counter() - taken
                lat["land_s"] += r.landed - taken        # (set by `_read` or the reaper before any publish)
                n = c.by_rank.setdefault(r.rank, [0, 0.0])
                n[0], n[1] = n[0] + 1, n[1] + taken - queued_at
        else:
            self.state[slot], self.key[slot] = FREE, None
            heapq.heappush(self._free, slot)
            del self.where[(j, e)]
            self.hv.ready[j, e] = sw.FAILED

    def _reader(self) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                r = self._claim()
                if r == "retry":
                    self._cv.wait(0.0005)
                if not isinstance(r, _Read):
                    continue
            r.taken = time.perf_counter()              # once out of the lock, as the queue time always counted
            ok = self._read(r)
            with self._cv:
                self._finish(r, ok)

    # ---- io="aio": the poller submits, the reaper publishes --------------------------------------------------
    def _submit_next(self) -> None:
        """(lock held) Claim queued reads up to the readers' count of blobs in flight and submit all their parts in
        one call."""
        batch = []
        while len(self._reads) < self._max_blobs:
            r = self._claim()
            if r == "retry":
                self._retry = True
            if not isinstance(r, _Read):
                break
            ent = self.store.entries[r.j][r.e]
            f = self.store.files[ent.file]
            rid = next(self._tags)
            r.parts = split_parts(ent.nbytes, r.split)
            r.left = len(r.parts)
            addr = self.mem.data_ptr() + r.slot * self.slot_bytes
            for k, (a, n) in enumerate(r.parts):
                if not f.direct:
                    os.posix_fadvise(f.fd, ent.offset + a, n, os.POSIX_FADV_DONTNEED)
                batch.append((rid * PARTS + k, f.fd, addr + a, n, ent.offset + a))
            self._reads[rid] = r
        if not batch:
            return
        started, err = self._aio.submit(batch)
        if err is not None:                        # the kernel refused a read: it and those after it never start
            first = self._reads[batch[started][0] // PARTS]
            self._fail(self._read_error(first.j, first.e, err))
            for tag, *_ in batch[started:]:
                r = self._reads[tag // PARTS]
                r.error, r.left = r.error or err, r.left - 1
                if r.left == 0:                    # (a blob with parts started ends when the reaper has them)
                    del self._reads[tag // PARTS]
                    self._finish(r, False)

    def _reap(self) -> None:
        """Completed parts: a blob whose parts are all in is checked (at its first read, outside the lock) and
        published, and the queue's next reads are submitted."""
        while True:
            events = self._aio.wait(1, self._aio.depth, 0.0005 if self._retry else 0.005)
            landed = time.perf_counter()
            done = []
            with self._cv:
                if self._stop:
                    return
                for tag, res in events:
                    rid, k = divmod(tag, PARTS)
                    r = self._reads[rid]
                    a, want = r.parts[k]
                    if res != want and r.error is None:
                        off = self.store.entries[r.j][r.e].offset + a
                        r.error = OSError(-res, os.strerror(-res)) if res < 0 else OSError(
                            errno.EIO, f"short read: {max(res, 0)} of {want} bytes at offset {off}")
                    r.left -= 1
                    if r.left == 0:
                        r.landed = landed
                        done.append(self._reads.pop(rid))
            ok = []
            for r in done:
                if r.error is not None:
                    self._fail(self._read_error(r.j, r.e, r.error))
                ok.append(r.error is None and self._verify(r.slot, r.j, r.e))
            with self._cv:
                for r, good in zip(done, ok):
                    self._finish(r, good)
                    self.counts.busy_s[0] += time.perf_counter() - r.taken
                self._retry = False
                self._submit_next()

    # ---- reading and checking a blob ---------------------------------------------------------------------------
    def _read(self, r: _Read) -> bool:
        """Read r's blob (layer j, expert e) into its slot as its split's requests in flight at once and check its
        parts (at its first read in the run); False (and `error` set) on a failure."""
        slot, j, e, split = r.slot, r.j, r.e, r.split
        ent = self.store.entries[j][e]
        f = self.store.files[ent.file]
        a = slot * self.slot_bytes
        t0 = time.perf_counter()
        try:
            f.read_split(self._pool, self._view[a:a + ent.nbytes], ent.offset, ent.nbytes, split)
        except OSError as err:
            self._fail(self._read_error(j, e, err))
            return False
        finally:
            r.landed = time.perf_counter()
            self.counts.busy_s[0] += r.landed - t0
        return self._verify(slot, j, e)

    def _verify(self, slot: int, j: int, e: int) -> bool:
        """Check the blob's parts at its first read in the run (once, as every tier: engine/PACK.md); False (and
        `error` set) on a mismatch."""
        if self.store.verified[j, e]:
            return True
        ent = self.store.entries[j][e]
        a = slot * self.slot_bytes
        data = np.frombuffer(self._view[a:a + ent.nbytes], dtype=np.uint8)
        try:
            for k in range(len(ent.parts)):
                verify_part(self.store.index, ent, data, k)
        except UserError as err:
            self._fail(err)
            return False
        self.store.verified[j, e] = True
        return True

    def _read_error(self, j: int, e: int, err: OSError) -> UserError:
        ent = self.store.entries[j][e]
        return UserError(str(self.store.files[ent.file].path), f"layer {ent.layer} expert {ent.expert}",
                         f"reading {ent.nbytes} bytes at offset {ent.offset} failed: {err.strerror or err}",
                         "check the disk (dmesg) and the file; copy it again or pack again if it is damaged")

    def _fail(self, err: UserError) -> None:
        if self.error is None:
            self.error = err
