"""YAML at the edge: `safe_load` only, and files written atomically.

A profile or plan is written to a temporary file beside its target, flushed, fsynced and renamed over
it, so a reader never sees half a file; the temporary file is removed on any error, Ctrl-C included.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):   # libyaml's parser when installed (~4x faster)
    """`safe_load` that also reads YAML 1.2's float forms: PyYAML follows YAML 1.1, where a float needs a
    dot, so `1e308` or `5E-3` would load as strings. Out-of-range values (`1e999` is inf) are the schema's
    to refuse."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def read_yaml(path: str | os.PathLike) -> Any:
    """Parse a YAML file with `yaml.safe_load`; unreadable or malformed files raise `UserError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(str(path), "", "file not found", "check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(str(path), "", f"cannot read file ({e.__class__.__name__})", "pass a readable UTF-8 YAML file") from None
    try:
        return yaml.load(text, Loader=_Loader)   # safe constructors only (see _Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "not valid YAML"
        raise UserError(str(path), "", f"malformed YAML{at}: {problem}", "fix the YAML syntax (only plain YAML types are accepted)") from None


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically (temp file in the same folder, fsync, rename)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UserError(str(path), "", f"folder {folder} does not exist", "create the folder or choose another --out")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _FILE_MODE)   # mkstemp makes 0600; a plan or profile is an ordinary file
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C included: never leave the temporary file behind
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


class _Dumper(yaml.SafeDumper):
    """Short lists of plain numbers and strings (curve points, expert ids) stay on one line."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flat = all(isinstance(v, (int, float, str, bool)) or (isinstance(v, list) and all(
        isinstance(w, (int, float, str, bool)) for w in v)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat and len(data) > 0 and all(
        not isinstance(v, list) for v in data))


_Dumper.add_representer(list, _represent_list)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)


def atomic_write_yaml(path: str | os.PathLike, data: Any, header: str = "") -> Path:
    text = "".join(f"# {line}\n" for line in header.splitlines()) + dump_yaml(data)
    return atomic_write_text(path, text)
