"""Commands that work for a while draw a progress bar (on stderr; none with --json): `pack` by MoE layer, as the
packer reports them (`compare-tables` is checked in test_cli_narrow.py, beside its 80-column output)."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from strata_plan.cli import _common, main

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "fixture-moe"


def test_pack_draws_a_bar_by_moe_layer_and_none_with_json(tmp_path, monkeypatch, capsys, one_torch_thread):
    bar = io.StringIO()
    monkeypatch.setattr(_common, "progress_console", lambda: Console(file=bar, force_terminal=True, width=80))
    assert main(["pack", str(FIXTURE), "--out", str(tmp_path / "a"), "--format", "bf16", "--device", "cpu"]) == 0
    drawn = bar.getvalue()
    assert "5/5 MoE layers" in drawn and "writing dense weights" in drawn       # the fixture's 5 MoE layers
    assert "packed fixture-moe" in capsys.readouterr().out

    def no_bar():
        pytest.fail("a progress bar with --json")
    monkeypatch.setattr(_common, "progress_console", no_bar)
    assert main(["pack", str(FIXTURE), "--out", str(tmp_path / "b"), "--format", "bf16", "--device", "cpu",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["experts"] == 160


def test_a_bar_off_or_piped_draws_nothing(monkeypatch):
    monkeypatch.setattr(_common, "progress_console", lambda: pytest.fail("drawn"))
    with _common.progress_bar("work", 3, on=False) as update:
        update(1, "more", 4)
    piped = io.StringIO()                                 # not a terminal: not even a blank line
    monkeypatch.setattr(_common, "progress_console", lambda: Console(file=piped))
    with _common.progress_bar("work", 3) as update:
        update(1, "more", 4)
    assert piped.getvalue() == ""
