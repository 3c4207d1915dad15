"""At 80 columns (or piped) no table cuts a name the user types next, or any figure: tables wrap, and
compare-tables prints one block per profile when its rows do not fit."""
from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path

import pytest

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
    from rich.console import Console

    from strata_plan.cli import _common
    bar = io.StringIO()                                   # the progress bar, on a terminal of 80 columns
    monkeypatch.setattr(_common, "progress_console", lambda: Console(file=bar, force_terminal=True, width=80))
    out = tmp_path / "table.md"
    assert main(["compare-tables", "--profiles", "rtx-pro-6000", "--trials", "2", "--tokens", "256",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rtx-pro-6000, 2x RAM" in bar.getvalue() and "6/6 trials" in bar.getvalue()    # 3 searches of 2 trials
    assert "| rtx-pro-6000 |" in out.read_text()
    assert "wrote" in text and str(out) in text.replace("\n", "")       # a long path wraps at 80 columns
    for phase in ("decode", "prefill"):
        headers, rows = compare.table_cells(results[0], phase)
        whole(text, *headers, *(c for r in rows for c in r))
    assert "rtx-pro-6000" in text.split()
    assert main(["compare-tables", "--profiles", "rtx-9999", "--trials", "2"]) == 2
    assert "unknown profile name" in capsys.readouterr().err


# ---- every word of every table whole at 80 columns: plan, what-if, bench, calibrate ----------------------------
# Each table a command prints is caught on its way to `fit` and rendered again alone at 80 columns: the words of
# that rendering must be the words of its title, headers and cells (a word cut ("decod…") or split ("measur ed")
# leaves a fragment), and every one of them must be in the command's output.
ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "fixture-moe"
BOX = re.compile(r"[\u2500-\u257f]")                 # box-drawing characters: the tables' rules


@pytest.fixture
def printed(monkeypatch):
    """The tables printed through `cli._common.console` while a test runs, at 80 columns."""
    from strata_plan.cli import _common
    tables, real = [], _common.fit

    def spy(t, width, blocks=True):
        tables.append(t)
        return real(t, width, blocks)
    monkeypatch.setattr(_common, "fit", spy)
    monkeypatch.setenv("COLUMNS", "80")
    return tables


def words_whole(text: str, tables) -> None:
    from strata_plan.cli._common import console
    whole(text)
    out = set(BOX.sub(" ", text).split())
    assert tables
    for t in list(tables):
        want = set(str(t.title or "").split())
        for c in t.columns:
            want |= {w for s in (str(c.header), *map(str, c.cells)) for w in s.split()}
        buf = io.StringIO()
        console(file=buf, width=80).print(t)
        alone = buf.getvalue()
        assert max(map(len, alone.splitlines())) <= 80
        fragments = set(BOX.sub(" ", alone).split()) - want
        assert not fragments, (t.title, sorted(fragments))
        assert want <= out, (t.title, sorted(want - out))


def test_plan_and_what_if_keep_every_word_whole_at_80_columns(tmp_path, capsys, printed):
    plan = tmp_path / "plan.yaml"
    assert main(["plan", "--profile", "rtx-pro-6000", "--model", str(FIXTURE / "config.json"), "--prior",
                 "mixtral-like", "--trials", "4", "--out", str(plan)]) == 0
    text = capsys.readouterr().out
    assert "machine bound: decode / prefill" in text                  # a label of one line: not cut
    words_whole(text, printed)
    printed.clear()
    assert main(["what-if", str(plan), "--trials", "2"]) == 0
    text = capsys.readouterr().out
    assert "Titanium" in text.split()                                  # the profile's sources: whole words
    words_whole(text, printed)


def test_fit_breaks_between_words_or_prints_one_block_a_row():
    """A table that fits with its lines broken between words keeps its columns; one whose longest words cannot
    all sit side by side becomes one block a row (header, figure), none of its words split."""
    from rich.table import Table

    from strata_plan.cli._common import fit, table
    t = table("name", "what it says", "and more")
    t.add_row("machine bound: decode / prefill", "a few words that wrap " * 3, "x")
    assert fit(t, 80) is t and t.columns[0].width == len("machine bound: decode / prefill")
    wide = table("run", "mode", "measured", "predicted before", "predicted after", "residual")
    wide.add_row("engine-20261203T000000Z.json:ramrich/on-demand", "on-demand", "16.035", "12.601", "16.035", "+0.0%")
    blocks = fit(wide, 80)
    assert not isinstance(blocks, Table)
    buf = io.StringIO()
    from rich.console import Console
    Console(file=buf, width=80).print(blocks)
    words = set(BOX.sub(" ", buf.getvalue()).split())
    assert {"engine-20261203T000000Z.json:ramrich/on-demand", "measured", "predicted", "before", "16.035"} <= words


# ---- bench: the fixture packed in BF16, a plan of three tiers ----------------------------------------------------
@pytest.fixture(scope="module")
def bench_args(tmp_path_factory, one_torch_thread):
    import sys
    from strata_plan.core.plan import save_plan
    sys.path.insert(0, str(ROOT / "tests"))
    from test_engine_run import bf16_plan          # a test module beside this one
    d = tmp_path_factory.mktemp("bench")
    assert main(["pack", str(FIXTURE), "--out", str(d / "packed"), "--format", "bf16", "--device", "cpu",
                 "--json"]) == 0
    save_plan(dataclasses.replace(bf16_plan(4, 10, 3, 2), context=64), d / "plan.yaml")
    return ["bench", "--packed", str(d / "packed"), "--plan", str(d / "plan.yaml"), "--tokens", "3", "--warmup", "2",
            "--replay", "olmoe-like"]


def test_bench_on_the_cpu_prints_no_ratio_and_says_why(bench_args, tmp_path, capsys, printed):
    """The fixture's plan predicts an RTX 4090 computing the experts; measured on the CPU, the ratio would compare
    two machines: the JSON keeps both figures, the ratio null with the reason; the table has no ratio column."""
    from strata_plan.cli.bench import NO_RATIO_ON_CPU
    assert main([*bench_args, "--device", "cpu", "--json", "--results", str(tmp_path)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["device"] == "cpu" and r["ratio_measured_to_predicted"] is None
    assert "CPU" in r["ratio_null_because"] and "no mode" in r["ratio_null_because"]
    assert r["measured"]["decode_tok_s"] > 0 and r["predicted"]["decode_tok_s"] > 0
    saved = json.loads(next(tmp_path.glob("bench-*.json")).read_text())
    assert saved["run"]["ratio_measured_to_predicted"] is None and saved["run"]["ratio_null_because"]
    assert main([*bench_args, "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "measured / predicted" not in " ".join(str(c.header) for t in printed for c in t.columns)
    assert " ".join(NO_RATIO_ON_CPU.split()) in " ".join(text.split())
    assert "decode thread CPU ms/tok" in text
    words_whole(text, printed)


def test_bench_on_a_gpu_prints_the_ratio_whole_at_80_columns(bench_args, capsys, printed, monkeypatch):
    """Where the engine computed on a GPU (the measurement's device stood in for here), the ratio column is
    printed, and at 80 columns its words and the labels' stay whole."""
    from strata_plan.engine import bench
    real = bench.measure

    def on_gpu(*a, **kw):
        return {**real(*a, **kw), "device": "cuda:0"}
    monkeypatch.setattr(bench, "measure", on_gpu)
    assert main([*bench_args, "--device", "cpu", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    m, pred = r["measured"]["decode_tok_s"], r["predicted"]["decode_tok_s"]
    assert r["ratio_measured_to_predicted"] == pytest.approx(m / pred)
    assert r["ratio_null_because"] is None
    assert main([*bench_args, "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "measured / predicted" in " ".join(str(c.header) for t in printed for c in t.columns)
    assert "no measured / predicted ratio" not in text
    words_whole(text, printed)


def test_calibrate_keeps_every_word_whole_at_80_columns(tmp_path, capsys, printed):
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    from test_planner_calibrate import FIXTURE_PLAN, TRUE, _run, with_cal     # a test module beside this one

    from strata_plan.profiles.schema import load_profile
    true = with_cal(load_profile("h200"), **TRUE)
    files = []
    for mode in ("plan", "lru"):
        files.append(tmp_path / f"bench-20261203T00000{len(files)}Z.json")
        run = _run(FIXTURE_PLAN, mode, true, "path")
        files[-1].write_text(json.dumps({"benchmark": "bench", "metrics": {}, "run": run}))
    assert main(["calibrate", *map(str, files), "--profile", "h200", "--out", str(tmp_path / "fit.yaml"),
                 "--check", str(files[1])]) == 0
    text = capsys.readouterr().out
    assert "measured" in text.split() and "residual" in text.split()
    words_whole(text, printed)
