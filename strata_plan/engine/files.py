"""Writing a packed folder's files: atomically, in large sequential writes, hashed as they are written.

    with AtomicFile(path) as f: f.write(...)            # temp name in the same folder, renamed when closed cleanly
    nbytes, sha = write_safetensors(path, specs, get)  # one tensor in memory at a time, sha256 of the whole file

`write_safetensors` writes the safetensors format (8-byte little-endian header length, JSON header with
dtype/shape/data_offsets, then the tensors back to back) itself, so a 40 GB dense file never sits in memory;
`safetensors.safe_open` and `load_file` read it.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
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


def _st_dtypes():
    import torch
    return {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
            torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
            torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def write_safetensors(path: str | os.PathLike, specs: list[tuple[str, object, tuple[int, ...]]], get,
                      metadata: dict[str, str] | None = None) -> tuple[int, str]:
    """Write tensors `specs` [(name, torch dtype, shape), ...] in that order, each produced by `get(name)` (a CPU
    or GPU tensor of exactly that dtype and shape) only when it is written. Returns (file bytes, sha256)."""
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
    h = hashlib.sha256()
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
    return total, h.hexdigest()


def _write_all(f, data: memoryview) -> None:
    """os-level write of all of `data` (unbuffered writes may be short)."""
    view = memoryview(data).cast("B")
    while len(view):
        n = f.write(view)
        view = view[n:]


class BlobWriter:
    """Writes blobs to an open file in the order given, on one background thread, while up to `hashers` threads
    compute their sha256 (hashlib releases the GIL): the caller (quantizing or generating on the GPU) overlaps
    with both. `put(array)` returns a future of the blob's sha256; at most `depth` blobs wait in memory."""

    def __init__(self, f, depth: int = 4, hashers: int = 2):
        from concurrent.futures import ThreadPoolExecutor
        self.f, self.depth = f, depth
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="pack-write")
        self.hasher = ThreadPoolExecutor(max(1, hashers), thread_name_prefix="pack-hash")
        self.pending: list = []

    def put(self, data):
        while len(self.pending) >= self.depth:
            for fut in self.pending.pop(0):
                fut.result()
        w = self.writer.submit(_write_all, self.f, memoryview(data))
        h = self.hasher.submit(sha256_bytes, data)
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


def sha256_bytes(data) -> str:
    """sha256 of a bytes-like object (numpy arrays and memoryviews included)."""
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()
