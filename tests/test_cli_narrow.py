"""At 80 columns (or piped) no table cuts a name the user types next, or any figure: tables wrap, and
compare-tables prints one block per profile when its rows do not fit."""
from __future__ import annotations

from strata_plan.cli import main


def whole(text: str, *values: str) -> None:
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    words = text.split()
    for v in values:
        for token in v.split():
            assert token in words or any(token in w for w in words), token


def test_lists_keep_every_name_whole_at_80_columns(capsys, monkeypatch):
    from strata_plan.core.spec import shipped_models
    from strata_plan.profiles.schema import load_profile, shipped_profiles
    monkeypatch.setenv("COLUMNS", "80")
    for argv, names in ((["profiles"], shipped_profiles()), (["models"], shipped_models())):
        assert main(argv) == 0
        out = capsys.readouterr().out
        whole(out)
        assert set(names) <= set(out.replace("│", " ").split()), argv      # never folded either
    assert main(["profiles"]) == 0
    whole(capsys.readouterr().out, *(load_profile(n).gpu.name for n in shipped_profiles()))


def test_compare_tables_at_80_columns_prints_every_cell_whole_and_writes_the_table(tmp_path, capsys, monkeypatch):
    from strata_plan.planner import compare
    results, real = [], compare.compare_tables

    def kept(**kw):
        results.append(real(**kw))
        return results[-1]
    monkeypatch.setattr(compare, "compare_tables", kept)
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "table.md"
    assert main(["compare-tables", "--profiles", "rtx-pro-6000", "--trials", "2", "--tokens", "256",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| rtx-pro-6000 |" in out.read_text()
    assert "wrote" in text and str(out) in text.replace("\n", "")       # a long path wraps at 80 columns
    for phase in ("decode", "prefill"):
        headers, rows = compare.table_cells(results[0], phase)
        whole(text, *headers, *(c for r in rows for c in r))
    assert "rtx-pro-6000" in text.split()
    assert main(["compare-tables", "--profiles", "rtx-9999", "--trials", "2"]) == 2
    assert "unknown profile name" in capsys.readouterr().err
