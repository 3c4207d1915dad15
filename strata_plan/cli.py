"""The `strata-plan` command line: one subcommand per job, each registered by its own module.

A user's mistake (`UserError`) prints one line and exits 2; Ctrl-C exits 130 without a traceback.
With no arguments in a terminal it opens the wizard (TUI); without a terminal it prints help.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from strata_plan import __version__
from strata_plan.errors import UserError

# Each module defines `register(subparsers)`; the subcommand's handler is stored as `func`.
COMMAND_MODULES = (
    "strata_plan.commands",            # models, profiles, formats
    "strata_plan.planner.cli_stats",   # stats
    "strata_plan.planner.cli_plan",    # plan, compare-tables
    "strata_plan.profiler.cli",        # profile
    "strata_plan.engine.pack",          # pack
    "strata_plan.cli_export",          # export (llama.cpp), what-if
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors also exit 2, in one line
        self.exit(2, f"{self.prog}: error: {message}; fix: see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="strata-plan", description="Plan Mixture-of-Experts models far bigger than one GPU "
                     "(GPU + pinned RAM + NVMe): measure the machine, predict tok/s, search the placement. "
                     "Run without arguments in a terminal for the wizard.")
    parser.add_argument("--version", action="version", version=f"strata-plan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
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
    try:
        return args.func(args) or 0
    except UserError as e:
        print(f"strata-plan: error: {e.line()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("strata-plan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
