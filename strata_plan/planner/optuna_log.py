"""Optuna's log, kept out of the user's way. Optuna is imported here, lazily.

A trial stopped by Ctrl-C is logged by Optuna as a failed trial with its whole traceback (a warning with
exc_info, then "failed with value None") before the KeyboardInterrupt reaches the command line, which then
prints its one line: `drop_interrupted_trials()` removes those records and nothing else. The wizard draws over the terminal, so
`silence()` drops Optuna's log altogether.
"""
from __future__ import annotations

import logging


class _DropInterrupted(logging.Filter):
    """Drops the record of a trial that failed by KeyboardInterrupt, and the line Optuna logs after it
    ("Trial N failed with value None.")."""

    def __init__(self) -> None:
        super().__init__()
        self.trial = ""                   # "Trial N " of the last interrupted trial

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        if isinstance(exc, KeyboardInterrupt):
            self.trial = " ".join(message.split()[:2]) + " "
            return False
        return not (self.trial and message.startswith(self.trial + "failed with value"))


def drop_interrupted_trials() -> None:
    import optuna
    optuna.logging.set_verbosity(optuna.logging.get_verbosity())    # makes Optuna set up its handler now
    for h in logging.getLogger("optuna").handlers:
        if not any(isinstance(f, _DropInterrupted) for f in h.filters):
            h.addFilter(_DropInterrupted())


def silence() -> None:
    """Drop Optuna's handler (and give its logger a silent one, or Python's last-resort handler prints
    warnings anyway)."""
    import optuna
    optuna.logging.disable_default_handler()
    log = logging.getLogger("optuna")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())
