"""What a newcomer hit (issue 25), each held by a test: output paths checked before any work, --force,
plans checked against their recorded sources, recorded paths that work from any folder, Ctrl-C without
Optuna's traceback, YAML's float forms, and small figures printed with enough digits. In-process
(`strata_plan.cli.main`), so each case costs milliseconds, not an interpreter start."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from strata_plan.cli import main
from strata_plan.errors import UserError

DATA = Path(__file__).parent / "data"
FIXTURE = str(DATA / "fixture-moe")
SMALL_PLAN = ["--profile", "rtx-4090", "--model", "mixtral-8x7b", "--vram-gb", "13", "--ram-gb", "16", "--trials", "4"]


def one_line_error(capsys, code: int, *words: str) -> str:
    """The command returned 2 and printed one line naming `words`, no traceback."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("strata-plan: error:") and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    return err


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A plan made in folder `a` from statistics named by a path relative to `a` (as a user in `a` types it)."""
    d = tmp_path_factory.mktemp("planned")
    (d / "a").mkdir()
    cwd = os.getcwd()
    try:
        os.chdir(d / "a")
        assert main(["stats", "mixtral-like", "--model", "mixtral-8x7b", "--tokens", "256", "--out", "s.yaml",
                     "--json"]) == 0
        assert main(["plan", *SMALL_PLAN, "--stats", "s.yaml", "--out", "plan.yaml", "--json"]) == 0
    finally:
        os.chdir(cwd)
    return d


@pytest.fixture
def work_forbidden(monkeypatch):
    """Any search, measurement or export fails the test: a bad output path must be refused before them."""
    def forbidden(*a, **k):
        raise AssertionError("the work started before the output path was checked")
    import strata_plan.planner.compare as compare
    import strata_plan.planner.make as make
    import strata_plan.core.routing.sources as sources
    import strata_plan.profiler.run as run
    monkeypatch.setattr(make, "make_plan", forbidden)
    monkeypatch.setattr(make, "load_plan_problem", forbidden)
    monkeypatch.setattr(compare, "compare_tables", forbidden)
    monkeypatch.setattr(sources, "stats_for", forbidden)
    monkeypatch.setattr(run, "profile_machine", forbidden)


def commands_with_out(tmp_path, plan: str) -> dict[str, list[str]]:
    return {"plan": ["plan", *SMALL_PLAN], "stats": ["stats", "uniform", "--model", "mixtral-8x7b"],
            "export": ["export", plan], "compare-tables": ["compare-tables", "--profiles", "rtx-4090"],
            "profile": ["profile", "--quick", "--nvme-dir", str(tmp_path)]}


def test_out_at_a_folder_or_an_existing_file_is_refused_before_the_work(tmp_path, capsys, planned, work_forbidden):
    existing = tmp_path / "old.yaml"
    existing.write_text("keep me\n")
    for name, argv in commands_with_out(tmp_path, str(planned / "a" / "plan.yaml")).items():
        one_line_error(capsys, main([*argv, "--out", str(tmp_path)]), "--out", "is a folder")
        one_line_error(capsys, main([*argv, "--out", str(existing)]), "--out", "already exists", "--force")
        one_line_error(capsys, main([*argv, "--out", str(tmp_path / "no" / "x.yaml")]), "does not exist")
        assert existing.read_text() == "keep me\n", name
    one_line_error(capsys, main(["stats", "uniform", "--model", "mixtral-8x7b", "--save-trace", str(existing)]),
                   "--save-trace", "already exists")


def test_force_replaces_an_existing_file(tmp_path, capsys, planned):
    out = tmp_path / "run.sh"
    out.write_text("old\n")
    assert main(["export", str(planned / "a" / "plan.yaml"), "--out", str(out), "--force"]) == 0
    assert out.read_text() == capsys.readouterr().out and out.read_text().startswith("# llama.cpp placement")


def test_pack_refuses_a_folder_that_is_not_empty(tmp_path, capsys, monkeypatch):
    out = tmp_path / "packed"
    out.mkdir()
    (out / "mine.txt").write_text("precious\n")
    one_line_error(capsys, main(["pack", FIXTURE, "--format", "q4_g128_f16", "--out", str(out)]),
                   "--out", "not empty", "--force")
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    one_line_error(capsys, main(["pack", FIXTURE, "--format", "q4_g128_f16", "--out", str(out / "mine.txt")]),
                   "is a file")
    import strata_plan.engine.pack as pack

    class Packing(Exception):
        pass

    def packing(checkpoint, folder, *a, **k):        # the work itself is test_fixture_moe_pack's
        raise Packing(folder)
    monkeypatch.setattr(pack, "pack_checkpoint", packing)
    (tmp_path / "empty").mkdir()
    for ok in (["--out", str(tmp_path / "empty")], ["--out", str(tmp_path / "new" / "deeper")],
               ["--out", str(out), "--force"]):
        with pytest.raises(Packing):
            main(["pack", FIXTURE, "--format", "q4_g128_f16", *ok])


def test_the_plan_records_its_statistics_relative_to_itself(planned, tmp_path, capsys, monkeypatch):
    """Made in folder a with `--stats s.yaml`: export and what-if work from any folder, and after moving the
    plan with its statistics; without them the message says the path came from the plan and --stats helps."""
    data = yaml.safe_load((planned / "a" / "plan.yaml").read_text())
    assert data["sources"]["statistics"]["path"] == "s.yaml"
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(planned / "a" / "plan.yaml"), "--json"]) == 0
    moved = tmp_path / "moved"
    shutil.copytree(planned / "a", moved)
    assert main(["export", str(moved / "plan.yaml"), "--json"]) == 0
    capsys.readouterr()
    (moved / "s.yaml").unlink()
    err = one_line_error(capsys, main(["export", str(moved / "plan.yaml")]), str(moved / "plan.yaml"),
                         "sources.statistics.path", "file not found", "--stats")
    assert str(moved / "s.yaml") in err
    assert main(["export", str(moved / "plan.yaml"), "--stats", str(planned / "a" / "s.yaml"), "--json"]) == 0


def _edited(planned, tmp_path, edit) -> str:
    data = yaml.safe_load((planned / "a" / "plan.yaml").read_text())
    edit(data)
    path = tmp_path / "edited.yaml"
    shutil.copy(planned / "a" / "s.yaml", tmp_path / "s.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.mark.parametrize("edit, field, words", [
    (lambda d: d.update(model="nowhere-9x9b"), "model", "mixtral-8x7b"),
    (lambda d: d["sources"]["model"].update(name="nowhere-9x9b", path="gone/config.json"), "sources.model",
     "nowhere-9x9b"),
    (lambda d: d["sources"]["model"].update(sha256="0" * 64), "sources.model", "not the model config"),
    (lambda d: d["sources"]["statistics"].update(sha256="0" * 64), "sources.statistics", "differ"),
    (lambda d: d.update(n_experts=16, top_k=2) or [l.update(nvme=l["nvme"] + list(range(8, 16)),
                                                           formats={**l["formats"], "bf16": list(range(8, 16))})
                                                   for l in d["layers"]], "n_experts", "plan again"),
    (lambda d: d["memory"]["budgets"].update(vram_bytes=1000), "memory.budgets", "working set"),
])
def test_a_plan_is_checked_against_its_recorded_sources(planned, tmp_path, capsys, edit, field, words):
    path = _edited(planned, tmp_path, edit)
    for cmd in ("export", "what-if"):
        err = one_line_error(capsys, main([cmd, path]), f"{path}: {field}:", words)
        assert "--model" not in err


def test_ctrl_c_during_the_search_prints_one_line_and_no_optuna_traceback(tmp_path, capfd, monkeypatch):
    """The KeyboardInterrupt comes from inside an Optuna trial (the case where Optuna logs the trial as failed
    with its whole traceback before re-raising)."""
    import logging

    import optuna

    import strata_plan.planner.search as search
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.logging.enable_default_handler()             # as in a fresh process (the wizard's tests drop it)
    for h in logging.getLogger("optuna").handlers:     # Optuna's handler writes where stderr was when it was made
        if isinstance(h, logging.StreamHandler):
            monkeypatch.setattr(h, "stream", sys.stderr)
    evaluate = search.evaluate

    def interrupted(*a, **k):
        frame = sys._getframe(1)
        while frame is not None and not frame.f_globals.get("__name__", "").startswith("optuna"):
            frame = frame.f_back
        if frame is not None:
            raise KeyboardInterrupt
        return evaluate(*a, **k)
    monkeypatch.setattr(search, "evaluate", interrupted)
    assert main(["plan", *SMALL_PLAN, "--out", str(tmp_path / "p.yaml")]) == 130
    err = capfd.readouterr().err
    assert err == "strata-plan: interrupted\n", err
    assert list(tmp_path.iterdir()) == []


def test_yaml_float_forms_are_numbers_and_out_of_range_is_said(tmp_path):
    from dataclasses import dataclass

    from strata_plan.schema import bounded, parse
    from strata_plan.yamlio import read_yaml

    @dataclass(frozen=True)
    class Budget:
        gb: float = bounded(0.0, 1e6, "GB")
    f = tmp_path / "b.yaml"
    for text, value in (("1e3", 1000.0), ("2.5E-1", 0.25), ("-0e0", 0.0), (".5e1", 5.0), ("1_000.5", 1000.5)):
        f.write_text(f"gb: {text}\n")
        assert parse(Budget, read_yaml(f), str(f)).gb == value, text
    for text in ("1e308", "1e999", "-1e-3"):
        f.write_text(f"gb: {text}\n")
        with pytest.raises(UserError, match="out of range") as e:
            parse(Budget, read_yaml(f), str(f))
        assert e.value.field == "gb"
    f.write_text("gb: '1e3'\n")                     # quoted: a string, still refused as one
    with pytest.raises(UserError, match="must be a number"):
        parse(Budget, read_yaml(f), str(f))


def test_small_figures_are_printed_with_enough_digits(capsys, tmp_path):
    from strata_plan.core.spec import load_spec
    from strata_plan.units import fmt_bytes, fmt_bytes_pair
    assert fmt_bytes(2e6) == "2 MB" and fmt_bytes(0) == "0 B" and fmt_bytes(1.5e12) == "1.5 TB"
    assert fmt_bytes_pair(24.0004e9, 24.001e9) == ("24.000 GB", "24.001 GB")
    assert fmt_bytes_pair(2e6, 2.097152e6) == ("2.00 MB", "2.10 MB")
    assert fmt_bytes_pair(96e9, 96e9) == ("96.0 GB", "96.0 GB") and fmt_bytes_pair(1, 999) == ("1 B", "999 B")
    emb = load_spec(FIXTURE).embedding_bytes
    err = one_line_error(capsys, main(["plan", "--profile", "rtx-4090", "--model", FIXTURE, "--ram-gb", "0.002",
                                       "--out", str(tmp_path / "p.yaml")]), "--ram-gb")
    have, need = fmt_bytes_pair(2e6, emb)
    assert have != need and f"{have}: below the {need} of embeddings" in err
