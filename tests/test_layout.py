"""The repository's map: folders match imports, and imports flow one way (ARCHITECTURE.md).

Every `import` and `from ... import` in the package counts, at module level or inside a function (a lazy
import is still a dependency). Refused: the engine importing the planner, the kernels importing anything
above them, the shared base (`strata_plan.core`) importing the planner or the engine, and any cycle
between modules."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "strata_plan"

# (importer prefix, refused prefixes)
FORBIDDEN = [
    ("strata_plan.engine", ("strata_plan.planner", "strata_plan.cli", "strata_plan.tui")),
    ("strata_plan.kernels", ("strata_plan.engine", "strata_plan.planner", "strata_plan.core", "strata_plan.profiler",
                             "strata_plan.cli", "strata_plan.tui")),
    ("strata_plan.core", ("strata_plan.planner", "strata_plan.engine", "strata_plan.profiler", "strata_plan.cli",
                          "strata_plan.tui")),
    ("strata_plan.planner", ("strata_plan.engine", "strata_plan.cli", "strata_plan.tui")),
    ("strata_plan.profiler", ("strata_plan.planner", "strata_plan.engine", "strata_plan.core", "strata_plan.cli",
                              "strata_plan.tui")),
    ("strata_plan.tui", ("strata_plan.cli",)),
    ("strata_plan.profiles", ("strata_plan.planner", "strata_plan.engine", "strata_plan.profiler", "strata_plan.cli",
                              "strata_plan.tui")),
]


def modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package modules it imports (a `from package import name` names the submodule when
    `name` is one, else the package)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            edges[mod].update(t for t in targets if t in mods and t != mod)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_folders_match_imports():
    """One package on disk, as imported: no package-dir mapping, and nothing at the repository's root that
    would shadow another distribution's package (`kernels`, `planner`, `profiler` are names on PyPI)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in cfg and cfg["packages"]["find"]["include"] == ["strata_plan*"]
    assert [p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()] == ["strata_plan"]
    for part in ("core", "planner", "profiler", "engine", "kernels", "profiles"):
        assert (PKG / part / "__init__.py").is_file(), part


def test_imports_flow_one_way():
    edges = imports(modules())
    wrong = [f"{a} -> {b}" for a, targets in edges.items() for b in sorted(targets)
             for src, refused in FORBIDDEN if a.startswith(src) and b.startswith(refused)]
    assert wrong == []


def test_no_import_cycles():
    assert cycles(imports(modules())) == []


def test_the_walker_sees_lazy_imports_and_cycles():
    """The checks above can fail: the walker finds a lazy import of the planner, and a cycle."""
    edges = imports(modules())
    assert "strata_plan.core.plan" in edges["strata_plan.planner.make"]     # module level
    assert "strata_plan.engine.bench" in edges["strata_plan.cli.bench"]     # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
