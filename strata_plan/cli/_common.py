"""What every command's module shares: `--out`/`--force`, `--json`, and printing tables that never cut a
name the user must type next (at 80 columns, or piped, the widest other columns wrap first)."""
from __future__ import annotations

import json

from strata_plan.errors import UserError


def add_json(p, help: str = "machine-readable output") -> None:
    p.add_argument("--json", action="store_true", help=help)


def add_out(p, help: str, required: bool = False, metavar: str | None = None) -> None:
    """`--out PATH` and `--force` (replace an existing file; without it the command refuses before working)."""
    p.add_argument("--out", required=required, help=help, metavar=metavar)
    p.add_argument("--force", action="store_true", help="replace an existing --out (default: refuse, before any work)")


def print_json(data) -> None:
    print(json.dumps(data, indent=2))


def console(stderr: bool = False):
    """A rich Console whose `print` first fits tables to its width (see `fit`)."""
    from rich.console import Console
    from rich.table import Table

    class _Console(Console):
        def print(self, *objects, **kw) -> None:
            for o in objects:
                if isinstance(o, Table):
                    fit(o, self.width)
            super().print(*objects, **kw)
    return _Console(stderr=stderr)


def fit(t, width: int) -> None:
    """Give a table's columns widths that break lines between words, never inside one, when the table is
    wider than `width` (rich alone squeezes the widest columns and folds their words): each column gets its
    longest word, and what is left goes to the columns in proportion to what more they would use."""
    import re
    cols = t.columns
    lines = [[str(c.header)] + [str(x) for x in c.cells] for c in cols]
    longest = [max((len(w) for s in cells for w in re.split(r"\s+", s)), default=1) for cells in lines]
    natural = [max((len(line) for s in cells for line in s.splitlines()), default=1) for cells in lines]
    room = width - (3 * len(cols) + 1)                 # padding of one either side and a rule per column
    if sum(natural) <= room or sum(longest) > room:
        return                                         # fits as it is, or cannot without folding a word
    spare, want = room - sum(longest), [n - m for n, m in zip(natural, longest)]
    total = sum(want) or 1
    widths = [m + spare * w // total for m, w in zip(longest, want)]
    for c, w in zip(cols, widths):
        c.width = w


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


def gb_list(text: str | None, flag: str):
    """A GB figure, or one per GPU comma-separated (`24,24`) as a tuple; None stays None. Bad text: one line."""
    if text is None:
        return None
    parts = [t.strip() for t in str(text).split(",")]
    try:
        vals = [float(t) for t in parts]
    except ValueError:
        raise UserError(flag, str(text), "must be a number of GB, or one per GPU separated by commas",
                        f"pass e.g. {flag} 24 or {flag} 24,24") from None
    return vals[0] if len(vals) == 1 else tuple(vals)


def gb_figures(text: str):
    """argparse `type=` of a budget flag that takes one GB figure or one per GPU (`24,24`): gb_list's value."""
    import argparse
    try:
        return gb_list(text, "")
    except UserError as e:
        raise argparse.ArgumentTypeError(e.problem) from None
