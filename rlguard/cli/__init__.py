"""The ``rlguard`` command line (typer + rich): the app (:mod:`.app`), the log commands (:mod:`.logs`) and the
training commands (:mod:`.training`); ``main`` is the console script."""

from __future__ import annotations

from rlguard._extras import run_console_script
from rlguard.cli import logs, training
from rlguard.cli.app import app, console, plain_help
from rlguard.cli.logs import EXIT_INTERNAL
from rlguard.cli.training import _DEMO_RUNS

__all__ = ["EXIT_INTERNAL", "_DEMO_RUNS", "app", "console", "logs", "main", "training"]

plain_help(app)  # the commands' docstrings as --help shows them, once every command is registered


def main() -> None:
    """The console script: a module of a missing extra ends it in one line naming the extra, a plugin that failed
    to load warns in one line (:func:`rlguard._extras.run_console_script`)."""
    run_console_script(app)


if __name__ == "__main__":  # pragma: no cover
    main()
