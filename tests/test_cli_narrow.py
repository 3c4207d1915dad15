"""At 80 columns (or piped) no table cuts a name the user types next, or any figure: tables wrap, and
compare-tables prints one block per profile when its rows do not fit."""
from __future__ import annotations

import io

from strata_plan.cli import main


def whole(text: str, *values: str) -> None:
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    words = text.split()
    for v in values:
        for token in v.split():
            assert token in words or any(token in w for w in words), token


def test_lists_keep_every_name_whole_at_80_columns(capsys, monkeypatch):
    from strata_plan.planner.spec import shipped_models
    from strata_plan.profiles.schema import load_profile, shipped_profiles
    monkeypatch.setenv("COLUMNS", "80")
    for argv, names in ((["profiles"], shipped_profiles()), (["models"], shipped_models())):
        assert main(argv) == 0
        out = capsys.readouterr().out
        whole(out)
        assert set(names) <= set(out.replace("│", " ").split()), argv      # never folded either
    assert main(["profiles"]) == 0
    whole(capsys.readouterr().out, *(load_profile(n).gpu.name for n in shipped_profiles()))


def test_compare_tables_at_80_columns_prints_every_cell_whole():
    from rich.console import Console

    from strata_plan.cli.compare_tables import print_comparison
    from strata_plan.planner.compare import compare_tables, table_cells, to_markdown
    result = compare_tables(profiles=["rtx-pro-6000"], trials=2, tokens=256)
    con = Console(width=80, file=io.StringIO(), color_system=None)
    print_comparison(result, to_markdown(result), con)
    text = con.file.getvalue()
    for phase in ("decode", "prefill"):
        headers, rows = table_cells(result, phase)
        whole(text, *headers, *(c for r in rows for c in r))
    assert "rtx-pro-6000" in text.split()
