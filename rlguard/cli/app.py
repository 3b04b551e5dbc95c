"""The ``rlguard`` typer app, its console and its root options; the commands are in :mod:`rlguard.cli.logs` (the
doctor, the watch, the report) and :mod:`rlguard.cli.training` (objectives, detectors, the demo, benchmarks)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

__all__ = ["app", "bad_input", "console"]

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
    """One line on stderr, exit code 2."""
    typer.echo(f"rlguard {command}: {err}", err=True)
    return typer.Exit(2)
