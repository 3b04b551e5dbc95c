"""``rlguard bench collapse`` and ``benchmarks/collapse/run.py``: run or resume the grid and write the results.

See :mod:`rlguard.bench.collapse` for the design, the stressors and the collapse definition.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlguard.bench.collapse.grid import _table, build_grid, run_grid, write_results
from rlguard.bench.collapse.spec import GUARDS, OBJECTIVES, STRESSORS, RunConfig, RunResult, numerics, same_numerics

# -- command line -------------------------------------------------------------------------------------------------
QUICK_OBJECTIVES, QUICK_STRESSORS, QUICK_ITERATIONS = ("grpo", "gspo"), ("none", "high_lr"), 30


def run_benchmark(
    *,
    quick: bool = False,
    workers: int = 2,
    seeds: int = 8,
    out: str | Path = "benchmarks/collapse/results",
    objectives: Sequence[str] = OBJECTIVES,
    guards: Sequence[str] = GUARDS,
    stressors: Sequence[str] = STRESSORS,
    iterations: int | None = None,
    resume: bool = False,
) -> list[dict[str, Any]]:
    """Run the grid with a rich progress bar, print the table, write the results; returns the summary rows.

    ``quick``: objectives grpo and gspo, stressors none and high_lr, 1 seed, 30 rollout batches (CI smoke test);
    explicit ``objectives``/``stressors``/``iterations`` still override it. Every finished run is appended to
    ``out/runs.jsonl`` at once; ``resume`` keeps the runs already there and runs only the missing ones.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    for name, values, known in (
        ("objectives", objectives, None),
        ("guards", guards, GUARDS),
        ("stressors", stressors, STRESSORS),
    ):
        if not values:
            raise ValueError(f"{name} must name at least one entry; got none.")
        bad = [v for v in values if known is not None and v not in known]
        if bad:
            raise ValueError(f"unknown {name} {bad}; choose from {list(known or ())}.")
    for name, value in (
        ("workers", workers),
        ("seeds", seeds),
        ("iterations", 1 if iterations is None else iterations),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1; got {value}.")
    if quick:
        objectives = QUICK_OBJECTIVES if tuple(objectives) == OBJECTIVES else objectives
        stressors = QUICK_STRESSORS if tuple(stressors) == STRESSORS else stressors
        seeds = 1
        iterations = iterations or QUICK_ITERATIONS
    overrides: dict[str, Any] = {} if iterations is None else {"iterations": iterations}
    configs = build_grid(objectives, guards, stressors, seeds, **overrides)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "runs.jsonl"
    done = {_key(r.config): r for r in _read_log(log)} if resume else {}
    todo = [c for c in configs if _key(c) not in done]
    console = Console(width=160)
    foreign = [r for r in done.values() if not same_numerics(r.numerics, numerics())]
    if foreign:  # kept runs are not recomputed: say when they would not reproduce here
        console.print(
            f"warning: {len(foreign)} of the {len(done)} runs kept from {log} were recorded on other numerics "
            f"(torch build, CPU, MKL mode) or before runs recorded them; here: {numerics()}. Their curves will "
            "not reproduce bit for bit on this machine: rerun them into another --out to compare."
        )
    start = time.perf_counter()
    with (
        log.open("a" if resume else "w") as fh,
        Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress,
    ):
        task = progress.add_task("runs", total=len(todo))

        def record(result: RunResult) -> None:
            fh.write(json.dumps(result.to_json()) + "\n")
            fh.flush()
            progress.advance(task)
            if not console.is_terminal:  # a log file: one line per run instead of the bar
                row = result.row()
                print(f"{progress.tasks[0].completed:.0f}/{len(todo)}", *list(row.values())[:8], flush=True)

        for result in run_grid(todo, workers=workers, on_result=record):
            done[_key(result.config)] = result
    results = [done[_key(c)] for c in configs]
    summary = write_results(results, folder)
    console.print(_table(summary))
    console.print(f"{len(todo)} runs on {workers} workers in {time.perf_counter() - start:.0f} s; results in {out}")
    return summary


def _key(config: RunConfig) -> str:
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


def _read_log(path: Path) -> list[RunResult]:
    if not path.is_file():
        return []
    return [RunResult.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def split_names(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]`` (the comma-separated options of the command line)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """``python benchmarks/collapse/run.py [--quick] [--workers 2] [--seeds 8] [--out DIR] ...``; returns the exit
    code (2 on bad input)."""
    args = build_parser().parse_args(argv)
    try:
        run_benchmark(
            quick=args.quick,
            workers=args.workers,
            seeds=args.seeds,
            out=args.out,
            objectives=split_names(args.objectives),
            guards=split_names(args.guards),
            stressors=split_names(args.stressors),
            iterations=args.iterations,
            resume=args.resume,
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(
        prog="rlguard bench collapse", description="Collapse benchmark: collapse rate per objective x guard x stressor."
    )
    parser.add_argument("--quick", action="store_true", help="grpo+gspo, stressors none+high_lr, 1 seed, 30 batches")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (one torch thread each)")
    parser.add_argument("--seeds", type=int, default=8, help="seeds per cell")
    parser.add_argument("--out", default="benchmarks/collapse/results", help="folder for CSVs, summary and plots")
    parser.add_argument("--objectives", default=",".join(OBJECTIVES), help="comma-separated objective names")
    parser.add_argument("--guards", default=",".join(GUARDS), help="comma-separated: off, default, stable")
    parser.add_argument("--stressors", default=",".join(STRESSORS), help=f"comma-separated: {', '.join(STRESSORS)}")
    parser.add_argument("--iterations", type=int, default=None, help="rollout batches per run (default 100)")
    parser.add_argument("--resume", action="store_true", help="keep the finished runs of --out/runs.jsonl")
    return parser
