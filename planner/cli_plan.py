"""Subcommands of this package (being written; registers nothing yet)."""


def register(sub) -> None:
    pass
