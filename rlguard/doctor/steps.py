"""Where a record's step comes from, and which run a row belongs to: the readers' rows merged by step, one run's.

A record's step is its first step column (:data:`STEP_KEYS`), or the column ``--step-key`` names, or its row
number where ``--row-steps`` asks; a record with values and no step is refused, naming its columns and both flags
(row numbers are never used unasked: a NaN at step 450 would be reported at row 44).

**Two runs in one file are refused, not split.** A run is the rows of one value of a run column (``run``,
``run_name``, ``run_id``, ``name``) or, without one, a stretch of rows whose step never goes back (two TRL runs
appended to one JSONL; a run resumed from a checkpoint into the same file). Merged by step, the later run's rows
would replace the earlier's (a NaN at step 30 gone). The doctor refuses with exit 2, naming the runs, their steps
and where each starts, and ``--run NAME`` judges one of them. It does not judge each run separately: a verdict per
run has no single exit code a CI script can trust, and which stretch of a resumed run is the run the user means
(the steps logged before the crash, or their replay after the resume) is the user's to say, not a guess. A step
repeated with another value (not going back) stays a merge, counted as values replaced. TensorBoard files are
exempt: a resumed TensorBoard run writes a new event file, and its folder is one run by TensorBoard's own rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlguard.doctor.readreport import LogInputError, ReadReport

__all__ = ["RUN_KEYS", "STEP_KEYS", "Row", "StepRule", "merge_runs", "run_name"]

#: step columns, most trusted first (TRL's ``train/global_step`` is the optimizer step; wandb's ``_step`` counts logs)
STEP_KEYS: tuple[str, ...] = ("step", "train/global_step", "global_step", "_step", "Step", "training/global_step")
#: columns that name the run a row belongs to (a wandb export of several runs' histories)
RUN_KEYS: tuple[str, ...] = ("run", "run_name", "run_id", "name", "Name")
#: (step, raw key -> value, where, run name or None); the step is None for a record with values and no step
Row = tuple[int | None, dict[str, float], str, str | None]


@dataclass(frozen=True)
class StepRule:
    """Where a record's step comes from: ``key`` (``--step-key``), else the first of :data:`STEP_KEYS`; or the row
    number (``row_steps``, ``--row-steps``)."""

    key: str | None = None
    row_steps: bool = False

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,) if self.key else STEP_KEYS

    def of(self, row: Mapping[str, float], raw: Mapping[str, Any], n: int, path: Path, where: str) -> int | None:
        """The step of record ``n`` (0-based); None for a record with values and no step; LogInputError for a step
        that is not a whole number >= 0."""
        if self.row_steps:
            return n + 1
        for key in self.keys:
            if key in raw and raw[key] is not None:
                value = row.get(key)
                if value is None or not math.isfinite(value) or not float(value).is_integer() or value < 0:
                    raise LogInputError(
                        f"{path}, {where}: {key} {raw[key]!r} is not a whole number of steps >= 0; the step column "
                        "must count optimizer steps (fix the record, or rename the column if it holds something else, "
                        "e.g. epochs)"
                    )
                return int(value)
        if not any(k not in STEP_KEYS for k in row):
            return 0  # nothing to judge in it: dropped as a record without a numeric value
        return None  # values and no step: a configuration or summary record, or a log without steps (merge_runs)

    def no_step(self, path: Path, where: str, raw: Mapping[str, Any]) -> LogInputError:
        """The error of a log none of whose records has a step (``raw``: the first record with values)."""
        if self.key:
            return LogInputError(
                f"{path}, {where}: --step-key {self.key}: no record has {self.key} (the first one's columns: "
                f"{_shown(raw)}); pass the column that counts optimizer steps"
            )
        return LogInputError(
            f"{path}, {where}: no step column (none of {', '.join(STEP_KEYS)}; its columns: {_shown(raw)}): pass "
            "--step-key COLUMN to read one as the step, or --row-steps to number the rows 1, 2, ... (said in the "
            "output)"
        )


def _shown(keys: Iterable[str], most: int = 8) -> str:
    names = sorted(keys)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def merge_runs(
    rows: Iterator[Row], report: ReadReport, steps: StepRule, path: Path, run: str | None
) -> list[tuple[int, dict[str, float]]]:
    """Rows of one step merged (a later value replaces an earlier one, counted), one run's (module docstring):
    LogInputError for a file of several runs unless ``run`` names one."""
    runs: dict[str, _Run] = {}
    stretch, last, named, current = 1, -1, False, None
    stepless: list[tuple[str, dict[str, float]]] = []  # records with values and no step
    for step, row, where, name in rows:
        metrics = {k: v for k, v in row.items() if k not in STEP_KEYS and k not in steps.keys}
        if not metrics:
            report.drop("records with no numeric value (all null, text or step counters only)")
            continue
        if step is None:
            stepless.append((where, row))
            continue
        if name is None and named:
            name = current  # a row without a run name belongs to the run of the rows before it
        named, current = named or name is not None, name
        back = ""
        if name is None:
            if step < last:  # the step goes back: another run starts here
                stretch, back = stretch + 1, f"the step goes back from {last} to {step} at {where}"
            last, name = step, str(stretch)
        into = runs.get(name)
        if into is None:
            into = runs[name] = _Run(name, step, where, restart=back)
        elif step < into.last:
            raise LogInputError(
                f"{path}, {where}: run {name}'s step goes back from {into.last} to {step}: two runs of that name in "
                "one file; split the file, one run each"
            )
        into.last = step
        if run is not None and name != run:
            into.rows += 1
            continue
        report.rows += 1
        into.rows += 1
        merged = into.merged
        values = merged.setdefault(step, {})
        report.overwritten += sum(1 for k, v in metrics.items() if k in values and not _same(values[k], v))
        values.update(metrics)
    if stepless:
        if not runs:  # no record has a step: the log has no step column
            raise steps.no_step(path, *stepless[0])
        # among records with a step, one without is no training step (the run's arguments, a summary)
        report.drop("records without a step among records with one (configuration or summary records)", len(stepless))
    if run is not None:
        if run not in runs:
            raise LogInputError(f"{path}: no run {run} in the file; its runs: {_runs(runs, 8)}")
        if len(runs) > 1:
            report.drop(f"rows of other runs than --run {run}", sum(r.rows for n, r in runs.items() if n != run))
            report.run = run
        return sorted(runs[run].merged.items())
    if len(runs) > 1:
        names = ", ".join(list(runs)[:5]) + (", ..." if len(runs) > 5 else "")
        why = (
            f"named in its run column: {names}"
            if named
            else "; ".join(r.restart for r in list(runs.values())[1:3]) + ("; ..." if len(runs) > 3 else "")
        )
        raise LogInputError(
            f"{path} holds {len(runs)} runs ({why}): {_runs(runs, 5)}; merged by step, one run's rows would replace "
            f"another's: pass --run {next(iter(runs))} (or another) to judge one run, or split the file"
        )
    return sorted(next(iter(runs.values())).merged.items()) if runs else []


@dataclass
class _Run:
    name: str
    first: int
    where: str
    restart: str
    last: int = -1
    rows: int = 0
    merged: dict[int, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.last = self.first


def _runs(runs: Mapping[str, _Run], most: int) -> str:
    shown = [f"run {r.name}: steps {r.first}-{r.last} from {r.where}" for r in list(runs.values())[:most]]
    return ", ".join(shown) + (f" and {len(runs) - most} more" if len(runs) > most else "")


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def run_name(record: Mapping[str, Any]) -> str | None:
    """The value of the record's run column, or None."""
    for key in RUN_KEYS:
        value = record.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()
    return None
