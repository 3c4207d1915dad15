"""Output paths checked before the work: a command that searches or measures for minutes must not fail,
or silently replace a file, only when it writes its result.

    check_out_file(path, "--out", force)     a file to write: its folder exists and is writable, it is not a
                                             folder, and an existing file is replaced only with force
    check_out_folder(path, "--out", force)   a folder to fill (`pack`): an existing non-empty folder only
                                             with force

Both raise `UserError` (one line naming the flag, the path and the fix) and return the path. The CLI passes
`--force`; the wizard asks before replacing (`existing` lists what would be).
"""
from __future__ import annotations

import os
from pathlib import Path

from strata_plan.errors import UserError


def _writable_folder(folder: Path, flag: str, path: str) -> None:
    if not folder.is_dir():
        raise UserError(flag, path, f"folder {folder} does not exist", f"create the folder or choose another {flag}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(flag, path, f"folder {folder} is not writable", "choose a folder you can write to")


def check_out_file(path: str | os.PathLike, flag: str = "--out", force: bool = False) -> Path:
    p = Path(path)
    if p.is_dir():
        raise UserError(flag, str(path), "is a folder", f"name a file, e.g. {p / 'out.yaml'}")
    _writable_folder(p.parent if str(p.parent) else Path("."), flag, str(path))
    if p.exists() and not force:
        raise UserError(flag, str(path), "already exists", f"pass --force to replace it, or choose another {flag}")
    return p


def check_out_folder(path: str | os.PathLike, flag: str = "--out", force: bool = False) -> Path:
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(flag, str(path), "is a file, not a folder", f"choose a new folder for {flag}")
    if p.is_dir():
        _writable_folder(p, flag, str(path))
        if any(p.iterdir()) and not force:
            raise UserError(flag, str(path), "is a folder that is not empty",
                            f"pass --force to write into it (files of the same name are replaced), or choose a "
                            f"new folder for {flag}")
        return p
    parent = next((a for a in p.absolute().parents if a.exists()), Path("/"))
    _writable_folder(parent, flag, str(path))
    return p


def existing(paths) -> list[str]:
    """Those of `paths` that exist already (what writing them would replace)."""
    return [str(p) for p in paths if Path(p).exists()]
