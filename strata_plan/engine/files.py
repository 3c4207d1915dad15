"""Writing a packed folder's files: atomically, in large sequential writes, hashed as they are written.

    with AtomicFolder(out) as tmp: ...                 # a temp folder beside `out`, renamed into place when complete
    with AtomicFile(path) as f: f.write(...)            # temp name in the same folder, renamed when closed cleanly
    nbytes, parts = write_safetensors(path, specs, get, part_bytes)   # one tensor in memory at a time
    parts = part_digests(data, part_bytes)             # sha256 of each part_bytes slice (the index's `parts`)

`write_safetensors` writes the safetensors format (8-byte little-endian header length, JSON header with
dtype/shape/data_offsets, then the tensors back to back) itself, so a 40 GB dense file never sits in memory;
`safetensors.safe_open` and `load_file` read it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import struct
import tempfile
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path


class AtomicFile:
    """A file written under a temporary name in the same folder and renamed into place when closed cleanly
    (removed on any error, Ctrl-C included)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __enter__(self):
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self.f = os.fdopen(fd, "wb", buffering=0)
        return self.f

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                os.fsync(self.f.fileno())
        finally:
            self.f.close()
            if exc_type is None:
                os.chmod(self.tmp, 0o666 & ~_umask())         # what open() would have given, not mkstemp's 0600
                os.replace(self.tmp, self.path)
            else:
                Path(self.tmp).unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class AtomicFolder:
    """A folder filled under a temporary name beside its target (`.NAME.XXXXXXXX.tmp`, the same file system) and
    renamed into place when the block ends cleanly; an error or Ctrl-C inside the block removes the temporary
    folder and any parent folders it created, so the target is as it was: absent, or the old folder intact.

        with AtomicFolder(out, keep=lambda name: ...) as tmp:   # write everything into tmp
            ...

    An existing target is replaced whole (renamed aside, the new folder renamed in, the old one removed), its
    entries for which `keep(name)` is true (files the writer never writes, e.g. a user's notes) moved into the
    new folder. The swap runs with Ctrl-C held back until it is done (in the main thread), and a failed swap
    puts the old folder back."""

    def __init__(self, path: str | os.PathLike, keep=lambda name: False):
        p = Path(path).absolute()
        self.path = p.resolve() if p.is_symlink() else p
        self.keep = keep
        self.tmp: Path | None = None
        self._made: list[Path] = []         # parent folders created here, innermost last

    def check(self) -> None:
        """Refuse (one line) a target that is a file, or a folder on another file system than its parent (a mount
        point): the temporary folder beside it would fill the parent's disk and could not be renamed into it."""
        from strata_plan.errors import UserError
        p = self.path
        if os.path.lexists(p) and not p.is_dir():
            raise UserError(str(p), "", "is a file, not a folder", "choose a new folder to write into")
        if p.is_dir() and p.parent.exists() and os.stat(p).st_dev != os.stat(p.parent).st_dev:
            raise UserError(str(p), "", f"is a mount point (another file system than {p.parent}): the folder is "
                            "written beside it and renamed into place", f"name a folder inside it, e.g. {p / 'packed'}")

    def __enter__(self) -> Path:
        self.check()
        missing = [a for a in [self.path.parent, *self.path.parent.parents] if not a.exists()]
        for folder in reversed(missing):
            folder.mkdir()
            self._made.append(folder)
        try:
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent))
        except BaseException:
            self._discard()
            raise
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._discard()
            return
        with interrupts_deferred():
            try:
                self._commit()
            except BaseException:
                self._discard()
                raise

    def _commit(self) -> None:
        os.chmod(self.tmp, 0o777 & ~_umask())          # what mkdir would have given, not mkdtemp's 0700
        target = self.path
        if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
            target.rmdir()
        if not os.path.lexists(target):
            os.rename(self.tmp, target)
            return
        old = self.tmp.with_suffix(".old")
        os.rename(target, old)
        try:
            os.rename(self.tmp, target)
        except BaseException:
            os.rename(old, target)
            raise
        left = []
        for entry in sorted(old.iterdir()):
            if self.keep(entry.name) and not os.path.lexists(target / entry.name):
                try:
                    os.rename(entry, target / entry.name)
                except OSError:
                    left.append(entry.name)
        if left:                                        # never delete what could not be carried over
            warnings.warn(f"{target}: could not move {', '.join(left)} from the old folder; they are in {old}")
        else:
            shutil.rmtree(old, ignore_errors=True)

    def _discard(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        for folder in reversed(self._made):
            try:
                folder.rmdir()
            except OSError:
                break


@contextmanager
def interrupts_deferred():
    """Ctrl-C (SIGINT) held back until the block ends, then raised; outside the main thread (where Python runs
    no signal handler) a plain block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = signal.signal(signal.SIGINT, lambda sig, frame: got.append(sig))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old if old is not None else signal.default_int_handler)
    if got:
        if callable(old) and old is not signal.default_int_handler:
            old(signal.SIGINT, None)
        elif old in (signal.default_int_handler, None):
            raise KeyboardInterrupt


def _st_dtypes():
    import torch
    return {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
            torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
            torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def write_safetensors(path: str | os.PathLike, specs: list[tuple[str, object, tuple[int, ...]]], get,
                      part_bytes: int, metadata: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Write tensors `specs` [(name, torch dtype, shape), ...] in that order, each produced by `get(name)` (a CPU
    or GPU tensor of exactly that dtype and shape) only when it is written. Returns (file bytes, the sha256 of
    each `part_bytes` slice of the file)."""
    import torch
    names = _st_dtypes()
    header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    off = 0
    for name, dtype, shape in specs:
        n = dtype.itemsize
        for s in shape:
            n *= s
        header[name] = {"dtype": names[dtype], "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)                       # the data starts 8-byte aligned
    h = PartHasher(part_bytes)
    total = 0
    with AtomicFile(path) as f:
        for part in (struct.pack("<Q", len(blob)), blob):
            _write_all(f, memoryview(part))
            h.update(part)
            total += len(part)
        for name, dtype, shape in specs:
            t = get(name)
            if t.dtype != dtype or tuple(t.shape) != tuple(shape):
                raise ValueError(f"write_safetensors: {name} is {t.dtype} {tuple(t.shape)}, expected {dtype} {shape}")
            data = memoryview(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
            _write_all(f, data)
            h.update(data)
            total += len(data)
    return total, h.digests()


def _write_all(f, data: memoryview) -> None:
    """os-level write of all of `data` (unbuffered writes may be short)."""
    view = memoryview(data).cast("B")
    while len(view):
        n = f.write(view)
        view = view[n:]


class BlobWriter:
    """Writes blobs to an open file in the order given, on one background thread, while up to `hashers` threads
    compute the sha256 of each `part_bytes` slice (hashlib releases the GIL): the caller (quantizing or
    generating on the GPU) overlaps with both. `put(array)` returns a future of the blob's part digests; at
    most `depth` blobs wait in memory."""

    def __init__(self, f, part_bytes: int, depth: int = 4, hashers: int = 2):
        from concurrent.futures import ThreadPoolExecutor
        self.f, self.depth, self.part_bytes = f, depth, part_bytes
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="pack-write")
        self.hasher = ThreadPoolExecutor(max(1, hashers), thread_name_prefix="pack-hash")
        self.pending: list = []

    def put(self, data):
        while len(self.pending) >= self.depth:
            for fut in self.pending.pop(0):
                fut.result()
        w = self.writer.submit(_write_all, self.f, memoryview(data))
        h = self.hasher.submit(part_digests, data, self.part_bytes)
        self.pending.append((w, h))
        return h

    def close(self) -> None:
        try:
            for w, h in self.pending:
                w.result(), h.result()
        finally:
            self.pending = []
            self.writer.shutdown(wait=True, cancel_futures=True)
            self.hasher.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def part_digests(data, part_bytes: int) -> list[str]:
    """sha256 of each `part_bytes` slice of a bytes-like object, the last one shorter if it must be."""
    view = memoryview(data).cast("B")
    return [hashlib.sha256(view[a:a + part_bytes]).hexdigest() for a in range(0, len(view), part_bytes)]


class PartHasher:
    """`part_digests` of a stream fed in pieces of any size."""

    def __init__(self, part_bytes: int):
        self.part_bytes, self.parts, self.h, self.filled = part_bytes, [], hashlib.sha256(), 0

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            n = min(len(view), self.part_bytes - self.filled)
            self.h.update(view[:n])
            self.filled += n
            view = view[n:]
            if self.filled == self.part_bytes:
                self.parts.append(self.h.hexdigest())
                self.h, self.filled = hashlib.sha256(), 0

    def digests(self) -> list[str]:
        return self.parts + ([self.h.hexdigest()] if self.filled else [])
