"""What every command's module shares: `--out`/`--force`, `--json`, printing tables that never cut or split a
word (at 80 columns, or piped: columns wrap between words, a name the user types next not at all, and a table
whose words cannot sit side by side prints one block a row), and progress bars on stderr."""
from __future__ import annotations

import json
from contextlib import contextmanager

from strata_plan.errors import UserError


def add_json(p, help: str = "machine-readable output") -> None:
    p.add_argument("--json", action="store_true", help=help)


def add_out(p, help: str, required: bool = False, metavar: str | None = None) -> None:
    """`--out PATH` and `--force` (replace an existing file; without it the command refuses before working)."""
    p.add_argument("--out", required=required, help=help, metavar=metavar)
    p.add_argument("--force", action="store_true", help="replace an existing --out (default: refuse, before any work)")


def print_json(data) -> None:
    print(json.dumps(data, indent=2))


def console(stderr: bool = False, **kw):
    """A rich Console whose `print` first fits tables to its width (see `fit`); `kw` goes to rich's Console
    (e.g. `file=` and `width=` in tests)."""
    from rich.console import Console
    from rich.table import Table

    class _Console(Console):
        def print(self, *objects, **kw) -> None:
            super().print(*(fit(o, self.width) if isinstance(o, Table) else o for o in objects), **kw)
    return _Console(stderr=stderr, **kw)


def _texts(column) -> list[str]:
    return [str(column.header)] + [str(x) for x in column.cells]


def _longest_word(texts) -> int:
    """Terminal cells of the longest word in `texts` (at least 1)."""
    import re

    from rich.cells import cell_len
    return max((cell_len(w) for s in texts for w in re.split(r"\s+", s)), default=1)


def _longest_line(texts) -> int:
    """Terminal cells of the longest line in `texts` (at least 1)."""
    from rich.cells import cell_len
    return max((cell_len(line) for s in texts for line in s.splitlines()), default=1)


def fit(t, width: int, blocks: bool = True):
    """Fit a table to `width` columns breaking lines between words, never inside one (rich alone squeezes
    the widest columns and folds their words, and truncates a column that must not wrap). Returns what to
    print: the table itself when it fits as it is; the table with column widths set when it fits with its
    lines broken between words (a column that must not wrap (`no_wrap`) keeps its longest line, the others
    get their longest word, and what is left goes to the columns in proportion to what more they would
    use); else (`blocks`) one block a row, each of its figures on a line beside its header."""
    cols = t.columns
    lines = [_texts(c) for c in cols]
    natural = [_longest_line(cells) for cells in lines]
    longest = [n if c.no_wrap else _longest_word(cells) for c, n, cells in zip(cols, natural, lines)]
    room = width - (3 * len(cols) + 1)                 # padding of one either side and a rule per column
    if sum(natural) <= room:
        return t
    if sum(longest) > room:
        return _blocks(t, width) if blocks and len(cols) > 2 else t
    spare, want = room - sum(longest), [n - m for n, m in zip(natural, longest)]
    total = sum(want) or 1
    widths = [m + spare * w // total for m, w in zip(longest, want)]
    for c, w in zip(cols, widths):
        c.width = w
    return t


def _blocks(t, width: int):
    """The rows of `t` one after another, each a two-column table of (header, figure) lines headed by its
    first cell (empty figures left out), under the table's title; every block as wide as the others."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text
    cols = [_texts(c) for c in t.columns]
    keys, values = [c[0] for c in cols], [v for c in cols for v in c[1:]]
    room = width - 7                                   # two columns: padding either side, three rules
    key_w = max(_longest_word(keys), min(_longest_line(keys), room // 2, room - _longest_word(values)))
    value_w = max(1, min(_longest_line(values), room - key_w))
    out = [Text(str(t.title), justify="center")] if t.title else []
    for i in range(t.row_count):
        b = Table(show_header=True)
        b.add_column(keys[0] or " ", overflow="fold", width=key_w)
        b.add_column(cols[0][i + 1], overflow="fold", width=value_w)
        for c in cols[1:]:
            if c[i + 1].strip():
                b.add_row(c[0], c[i + 1])
        out.append(b)
    return Group(*out)


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


def progress_console():
    """Where progress bars go: stderr (tests replace this to read them)."""
    return console(stderr=True)


@contextmanager
def progress_bar(what: str, total: float, on: bool = True, unit: str = ""):
    """A rich progress bar (what, bar, done/total `unit`, elapsed, time left) on `progress_console()` while the
    work in the `with` block runs; yields `update(done, what=None, total=None)`. Nothing is drawn when not `on`
    (--json) or where that console is not a terminal (piped), and the bar is gone when the block ends."""
    con = progress_console() if on else None
    if con is None or not con.is_terminal:
        yield lambda done, what=None, total=None: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    count = TextColumn("{task.completed:.0f}/{task.total:.0f}" + (f" {unit}" if unit else ""))
    with Progress(TextColumn("{task.description}"), BarColumn(bar_width=20), count,
                  TimeElapsedColumn(), TimeRemainingColumn(), console=con, transient=True) as bar:
        task = bar.add_task(what, total=total)

        def update(done: float, what: str | None = None, total: float | None = None) -> None:
            bar.update(task, completed=done, **({"description": what} if what else {}),
                       **({"total": total} if total else {}))
        yield update


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
