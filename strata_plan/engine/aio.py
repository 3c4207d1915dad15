"""Linux native AIO (io_setup / io_submit / io_getevents) through ctypes: many O_DIRECT reads handed to the kernel in
one system call, their completions reaped in another, without a thread per read.

    ctx = AioContext(depth=64)                        # OSError where the kernel refuses (`available()` asks first)
    ctx.submit([(tag, fd, address, nbytes, offset), ...])   # every read in flight at once: (started, error)
    ctx.wait(min_n=1, max_n=64, timeout_s=0.05)       # [(tag, result)]: bytes read, or -errno
    ctx.close()                                       # waits for the reads still in flight

The NVMe stager's `io="aio"` path (engine/stager.py): its reader threads start one read each, a thread hand-off
apart (on the GIL and the queue's lock), so a layer's demand reads reach the drive one after another; here the
poller submits a layer's reads together. ctypes releases the GIL for the system calls. O_DIRECT reads are
asynchronous in the kernel; on a file opened without O_DIRECT io_submit reads synchronously (correct, not
overlapped). x86-64 and aarch64 only (the system call numbers below).
"""
from __future__ import annotations

import ctypes
import os
import platform

_SYSCALLS = {"x86_64": (206, 207, 209, 208), "aarch64": (0, 1, 2, 4)}   # io_setup, io_destroy, io_submit, io_getevents
_IOCB_CMD_PREAD = 0


class _Iocb(ctypes.Structure):                   # struct iocb (linux/aio_abi.h), little-endian
    _fields_ = [("data", ctypes.c_uint64), ("key", ctypes.c_uint32), ("rw_flags", ctypes.c_int32),
                ("opcode", ctypes.c_uint16), ("reqprio", ctypes.c_int16), ("fildes", ctypes.c_uint32),
                ("buf", ctypes.c_uint64), ("nbytes", ctypes.c_uint64), ("offset", ctypes.c_int64),
                ("reserved2", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("resfd", ctypes.c_uint32)]


class _Event(ctypes.Structure):                  # struct io_event
    _fields_ = [("data", ctypes.c_uint64), ("obj", ctypes.c_uint64), ("res", ctypes.c_int64),
                ("res2", ctypes.c_int64)]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _call(nr: int, *args) -> int:
    r = _libc.syscall(ctypes.c_long(nr), *args)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


class AioContext:
    def __init__(self, depth: int):
        nrs = _SYSCALLS.get(platform.machine())
        if nrs is None:
            raise OSError(0, f"native AIO: no system call numbers for {platform.machine()}")
        self._setup, self._destroy, self._submit, self._getevents = nrs
        self.depth = depth
        self._ctx = ctypes.c_ulong(0)
        _call(self._setup, ctypes.c_long(depth), ctypes.byref(self._ctx))
        self._iocbs: dict[int, _Iocb] = {}       # tag -> its control block, alive until reaped
        self._events = (_Event * depth)()

    def submit(self, reads: list[tuple[int, int, int, int, int]]) -> tuple[int, OSError | None]:
        """Start every read (tag, fd, address, nbytes, offset); tags unique among those in flight. (reads started,
        None), or where the kernel refused one (the reads before it started, its error)."""
        if not reads:
            return 0, None
        cbs = []
        for tag, fd, addr, nbytes, offset in reads:
            cb = _Iocb(data=tag, opcode=_IOCB_CMD_PREAD, fildes=fd, buf=addr, nbytes=nbytes, offset=offset)
            self._iocbs[tag] = cb
            cbs.append(cb)
        ptrs = (ctypes.POINTER(_Iocb) * len(cbs))(*(ctypes.pointer(cb) for cb in cbs))
        done = 0
        try:
            while done < len(cbs):                # io_submit may take fewer than it was given
                done += _call(self._submit, self._ctx, ctypes.c_long(len(cbs) - done),
                              ctypes.byref(ptrs, done * ctypes.sizeof(ctypes.c_void_p)))
        except OSError as err:
            for tag, *_ in reads[done:]:
                del self._iocbs[tag]
            return done, err
        return done, None

    def wait(self, min_n: int, max_n: int, timeout_s: float | None) -> list[tuple[int, int]]:
        """Completed reads, at least `min_n` unless `timeout_s` passes first: (tag, bytes read or -errno)."""
        max_n = min(max_n, self.depth)
        ts = None
        if timeout_s is not None:
            ts = ctypes.byref(_Timespec(int(timeout_s), int((timeout_s % 1) * 1e9)))
        try:
            n = _call(self._getevents, self._ctx, ctypes.c_long(min_n), ctypes.c_long(max_n), self._events, ts)
        except InterruptedError:
            return []
        out = [(int(self._events[i].data), int(self._events[i].res)) for i in range(n)]
        for tag, _ in out:
            self._iocbs.pop(tag, None)
        return out

    def close(self) -> None:
        """Destroy the context (the kernel waits for the reads in flight)."""
        if self._ctx.value:
            _call(self._destroy, self._ctx)
            self._ctx = ctypes.c_ulong(0)
            self._iocbs.clear()


def available() -> bool:
    """Whether this kernel and machine give a native AIO context (a sandbox may forbid io_setup)."""
    try:
        AioContext(1).close()
        return True
    except OSError:
        return False
