"""The `strata-plan` command line: one module per subcommand in this package, argument parsing and printing
only; the work is done by the package that owns it (planner, profiler, kernels, engine).

A user's mistake (`UserError`) prints one line and exits 2; Ctrl-C exits 130 without a traceback.
With no arguments in a terminal it opens the wizard (TUI); without a terminal it prints help.

Adding a command: write `strata_plan/cli/NAME.py` with `register(subparsers)` (which adds the subparser and
sets `func`), and add NAME to `COMMANDS` below (CONTRIBUTING.md).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from strata_plan import __version__
from strata_plan.errors import UserError

# Modules of this package, in the order `--help` lists their commands.
COMMANDS = (
    "models",           # models
    "profiles",         # profiles
    "formats",          # formats
    "profile",          # profile (measure this machine)
    "stats",            # stats (routing statistics)
    "plan",             # plan
    "compare_tables",   # compare-tables
    "what_if",          # what-if
    "export",           # export (llama.cpp)
    "pack",             # pack
    "run",              # run (generate text with a plan)
    "bench",            # bench (measured against predicted)
    "eval",             # eval (fidelity of a packed model against its reference)
    "calibrate",        # calibrate (measure the per-layer overhead from engine runs)
)

# Commands that compute with torch: its thread count is set once before they start (strata_plan/threads.py).
TORCH_COMMANDS = ("pack", "run", "bench", "eval", "profile")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors also exit 2, in one line
        self.exit(2, f"{self.prog}: error: {message}; fix: see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="strata-plan", description="Plan Mixture-of-Experts models far bigger than one GPU "
                     "(GPU + pinned RAM + NVMe): measure the machine, predict tok/s, search the placement. "
                     "Run without arguments in a terminal for the wizard.")
    parser.add_argument("--version", action="version", version=f"strata-plan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:
        if sys.stdin.isatty() and sys.stdout.isatty():
            try:
                tui = importlib.import_module("strata_plan.tui")
            except ImportError:
                tui = None
            if tui is not None:
                return tui.run() or 0
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    if args.command in TORCH_COMMANDS:
        from strata_plan.threads import limit_torch_threads
        limit_torch_threads()
    try:
        return args.func(args) or 0
    except UserError as e:
        print(f"strata-plan: error: {e.line()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("strata-plan: interrupted", file=sys.stderr)
        return 130
