"""What every command's module shares: `--out`/`--force`, `--json`, and printing tables that never cut a
name the user must type next (at 80 columns, or piped, the widest other columns wrap first)."""
from __future__ import annotations

import json


def add_json(p, help: str = "machine-readable output") -> None:
    p.add_argument("--json", action="store_true", help=help)


def add_out(p, help: str, required: bool = False, metavar: str | None = None) -> None:
    """`--out PATH` and `--force` (replace an existing file; without it the command refuses before working)."""
    p.add_argument("--out", required=required, help=help, metavar=metavar)
    p.add_argument("--force", action="store_true", help="replace an existing --out (default: refuse, before any work)")


def print_json(data) -> None:
    print(json.dumps(data, indent=2))


def console(stderr: bool = False):
    from rich.console import Console
    return Console(stderr=stderr)


def table(*columns: str, title: str | None = None, keep: int = 1):
    """A rich Table whose first `keep` columns (the names to type next) never wrap or truncate; the others
    fold when the terminal is narrow."""
    from rich.table import Table
    t = Table(title=title)
    for i, c in enumerate(columns):
        if i < keep:
            t.add_column(c, no_wrap=True, min_width=len(c))
        else:
            t.add_column(c, overflow="fold")
    return t


def emit(args, data, t) -> None:
    """`--json`: the data; else the table."""
    if args.json:
        print_json(data)
    else:
        console().print(t)
