"""The ``rlguard`` typer app, its console and its root options; the commands are in :mod:`rlguard.cli.logs` (the
doctor, the watch, the report) and :mod:`rlguard.cli.training` (objectives, detectors, the demo, benchmarks)."""

from __future__ import annotations

import inspect
import re
import sys
from typing import Annotated

import typer
from rich.console import Console

__all__ = ["app", "bad_input", "console", "help_text", "plain_help"]

app = typer.Typer(
    name="rlguard",
    help="Exact GRPO-family objectives and stability guards for RL on LLMs.",
    no_args_is_help=True,
    add_completion=False,
)
# Piped output (CI logs, files) gets a fixed width instead of rich's 80-column default.
console = Console() if sys.stdout.isatty() else Console(width=150)


def _print_version(value: bool) -> None:
    if value:
        from rlguard import __version__

        console.print(f"rlguard {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print rlguard's version and exit.", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    """Exact GRPO-family objectives and stability guards for RL on LLMs."""


def bad_input(command: str, err: Exception) -> typer.Exit:
    """One line on stderr, exit code 2; its text (file names, keys and values read from the log) with every
    control character shown as an escape (:func:`rlguard.terminal.safe_text`): a name cannot clear the screen or
    plant a link."""
    from rlguard.terminal import safe_text

    typer.echo(f"rlguard {command}: {safe_text(err, markup=False)}", err=True)
    return typer.Exit(2)


#: a docstring's code quotes and roles (RST ``x``, Markdown `x`, :mod:`x`), shown at the terminal as 'x'
_CODE = re.compile(r"(?::[a-z]+:)?``?([^`]+?)``?")


def help_text(doc: str) -> str:
    """A command's docstring as its ``--help`` shows it: each paragraph on one line (rich keeps a docstring's line
    breaks, so a paragraph wrapped in the source would break mid-sentence at every terminal width but one), code
    quoted as 'x' instead of RST or Markdown markup."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(_CODE.sub(r"'\1'", p).split()) for p in paragraphs)


def plain_help(typer_app: typer.Typer) -> None:
    """Set the help of each command of ``typer_app`` (its sub-apps' too) that has none from its docstring, through
    :func:`help_text`."""
    for command in typer_app.registered_commands:
        if command.help is None and command.callback is not None and command.callback.__doc__:
            command.help = help_text(command.callback.__doc__)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            plain_help(group.typer_instance)
