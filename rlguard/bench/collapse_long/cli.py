"""``rlguard bench collapse --task long`` and ``benchmarks/collapse_long/run.py``: the harness's command line
(:func:`rlguard.bench.collapse.main`) with ``--task long``."""

from __future__ import annotations

from collections.abc import Sequence

from rlguard.bench.collapse.cli import main as _main


def main(argv: Sequence[str] | None = None) -> int:
    """:func:`rlguard.bench.collapse.main` with the long task as the default; returns the exit code."""
    return _main(argv, task="long")
