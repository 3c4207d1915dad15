"""One kind of error for a user's mistake: it names the file, the field and the fix.

The command line catches `UserError`, prints its one line and exits with code 2; anything else is a bug
and keeps its traceback.
"""
from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input: bad file, bad field, bad flag."""

    def __init__(self, where: str, field: str, problem: str, fix: str):
        self.where, self.field, self.problem, self.fix = where, field, problem, fix
        super().__init__(self.line())

    def line(self) -> str:
        field = f" {self.field}:" if self.field else ""
        return f"{self.where}:{field} {self.problem}; fix: {self.fix}"
