"""The demo on a terminal: a rich progress display while the runs train, then the summary table (``rlguard demo``)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from rlguard.demo import DemoConfig, DemoResult

__all__ = ["print_summary", "run_with_progress"]


def run_with_progress(config: DemoConfig, out: Path, *, console: Console, quiet: bool, command: str = "") -> DemoResult:
    """:func:`rlguard.demo.run_demo` under a rich progress display on ``console`` (on stderr with ``quiet``: the
    caller prints JSON on stdout); ``command`` is the command line recorded in the report."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from rlguard.demo import run_demo

    display = Console(stderr=True) if quiet else console
    with Progress(
        TextColumn("{task.description:<16}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
        console=display,
    ) as progress:
        tasks: dict[str, TaskID] = {}  # added when they start, so that each one's clock is its own
        shown: dict[str, dict[str, float]] = {}

        def on_progress(task: str, done: int, total: int, stats: dict[str, float]) -> None:
            if task not in tasks:
                tasks[task] = progress.add_task(task, total=total, stats="")
            latest = shown.setdefault(task, {})
            latest.update(stats)  # the reward is logged on generation steps only: keep the last one
            text = "  ".join(
                f"{k} {latest[k]:.3g}" for k in ("loss", "reward_mean", "entropy", "kl_ref") if k in latest
            )
            progress.update(tasks[task], completed=done, stats=escape(text))

        if not quiet:
            return run_demo(config, out, on_progress, command=command)
        # stdout is for the JSON only: what the frameworks print (DeepSpeed's logger, when installed) goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            return run_demo(config, out, on_progress, command=command)


def print_summary(result: DemoResult, console: Console) -> None:
    """The demo's summary table and where its report is, on ``console``."""
    from rlguard.demo import summary_rows

    rows = summary_rows(result.runs)
    table = Table(
        title=f"rlguard demo: {result.config.steps} GRPO steps per run (first fifth -> last fifth of the steps)",
        caption="exact answers: greedy decoding of the 100 sums, before -> after the run",
    )
    for col in rows[0]:
        table.add_column(col, justify="left" if col in ("run", "guard events") else "right")
    for row in rows:
        table.add_row(*(escape(v) for v in row.values()))
    console.print(table)
    console.print(
        f"report: [bold]{escape(str(result.report))}[/bold]  (took {result.seconds:.0f} s; each run's folder works "
        f"with `rlguard report` and `rlguard doctor`)"
    )
