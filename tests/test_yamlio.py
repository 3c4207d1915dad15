"""Atomic writes: a reader never sees half a file, and Ctrl-C leaves no temporary file."""
from __future__ import annotations

import os

import pytest

from strata_plan import yamlio
from strata_plan.errors import UserError


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "x.yaml"
    yamlio.atomic_write_yaml(p, {"a": 1})
    yamlio.atomic_write_yaml(p, {"a": [1, 2]}, header="hello")
    assert p.read_text().startswith("# hello\n") and yamlio.read_yaml(p) == {"a": [1, 2]}
    assert os.listdir(tmp_path) == ["x.yaml"]
    assert p.stat().st_mode & 0o777 == 0o666 & ~yamlio._umask()   # not mkstemp's 0600


def test_interrupted_write_leaves_no_temp_and_keeps_old(tmp_path, monkeypatch):
    p = tmp_path / "x.yaml"
    yamlio.atomic_write_yaml(p, {"old": True})

    def boom(fd):
        raise KeyboardInterrupt
    monkeypatch.setattr(yamlio.os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        yamlio.atomic_write_yaml(p, {"new": True})
    assert os.listdir(tmp_path) == ["x.yaml"] and yamlio.read_yaml(p) == {"old": True}


def test_missing_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        yamlio.atomic_write_text(tmp_path / "nope" / "x.yaml", "a: 1")


def test_read_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        yamlio.read_yaml(tmp_path / "missing.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError):
        yamlio.read_yaml(tmp_path / "bin.yaml")
