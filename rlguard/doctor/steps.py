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
(the steps logged before the crash, or their replay after the resume) is the user's to say, not a guess.

Records of one step are merged into one row (TRL logs a step's loss and its generation stats in two records). A
writer logs each key once per step, so a key logged again at the same step with another value is a second writer:
at one step it may be a record logged again after a restart there (merged, the later value kept, counted as
replaced); at two steps or more it is two runs interleaved line by line without a run column (two processes
appending to one file: steps 1, 1, 2, 2, ...), refused as two runs are, since a merge would keep one writer's
values and drop the other's. The merged rows are kept by column (:class:`~rlguard.doctor.columns.Columns`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlguard.doctor.columns import Columns
from rlguard.doctor.readreport import LogInputError, ReadReport

__all__ = ["RUN_KEYS", "STEP_KEYS", "MergedRows", "Row", "RunMerger", "StepRule", "merge_runs", "run_name"]

#: the largest step read: a float step is exact below 2**53, where 2**53 + 1 reads as 2**53 (and no trainer counts
#: that many optimizer steps)
MAX_STEP = 2**53 - 1
#: step columns, most trusted first (TRL's ``train/global_step`` is the optimizer step; wandb's ``_step`` counts logs)
STEP_KEYS: tuple[str, ...] = ("step", "train/global_step", "global_step", "_step", "Step", "training/global_step")
#: columns that name the run a row belongs to (a wandb export of several runs' histories)
RUN_KEYS: tuple[str, ...] = ("run", "run_name", "run_id", "name", "Name")
#: (step, raw key -> value, where, run name or None); the step is None for a record with values and no step
Row = tuple[int | None, dict[str, float], str, str | None]
#: what :func:`merge_runs` returns: one run's rows, one per step, by increasing step
MergedRows = Columns


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
        for key in (self.key,) if self.key else STEP_KEYS:
            if key in raw and raw[key] is not None:
                value = row.get(key)
                # a NaN or an infinity fails the bounds
                if value is None or not 0 <= value <= MAX_STEP or not float(value).is_integer():
                    raise LogInputError(
                        f"{path}, {where}: {key} {raw[key]!r} is not a whole number of steps from 0 to 2**53 - 1; "
                        "the step column must count optimizer steps (fix the record, or rename the column if it holds "
                        "something else, e.g. epochs)"
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


def merge_runs(rows: Iterator[Row], report: ReadReport, steps: StepRule, path: Path, run: str | None) -> Columns:
    """Rows of one step merged (a later value replaces an earlier one, counted), one run's (module docstring):
    LogInputError for a file of several runs unless ``run`` names one, or of two runs interleaved. One pass over
    ``rows``; memory is the merged table's (:class:`~rlguard.doctor.columns.Columns`)."""
    merger = RunMerger(report, steps, path, run)
    for row in rows:
        merger.add(row)
    return merger.finish(report)


class RunMerger:
    """:func:`merge_runs` one row at a time (``rlguard watch`` adds the rows appended since its last poll): the
    cost of :meth:`add` does not grow with the rows before it."""

    def __init__(self, report: ReadReport, steps: StepRule, path: Path, run: str | None) -> None:
        self.report, self.steps, self.path, self.run = report, steps, path, run
        self.runs: dict[str, _Run] = {}
        self._stretch, self._last, self._named = 1, -1, False
        self._stretch_name = "1"  # str(self._stretch)
        self._current: str | None = None
        self._stepless: tuple[str, dict[str, float]] | None = None  # the first record with values and no step
        self._stepless_count = 0
        self._excluded = frozenset(STEP_KEYS) | frozenset(steps.keys)  # step counters are not metrics

    def add(self, item: Row) -> None:
        """Merge one reader's row (LogInputError for a named run whose step goes back)."""
        step, row, where, name = item
        excluded = self._excluded  # step counters are not metrics: left out of the table (Columns.append's skip)
        if len(row) <= len(excluded) and row.keys() <= excluded:
            self.report.drop("records with no numeric value (all null, text or step counters only)")
            return
        if step is None:
            self._stepless = self._stepless or (where, row)
            self._stepless_count += 1
            return
        if name is None and self._named:
            name = self._current  # a row without a run name belongs to the run of the rows before it
        self._named, self._current = self._named or name is not None, name
        back = ""
        if name is None:
            if step < self._last:  # the step goes back: another run starts here
                self._stretch, back = self._stretch + 1, f"the step goes back from {self._last} to {step} at {where}"
                self._stretch_name = str(self._stretch)
            self._last, name = step, self._stretch_name
        into = self.runs.get(name)
        if into is None:
            into = self.runs[name] = _Run(name, step, where, restart=back)
        elif step < into.last:
            raise LogInputError(
                f"{self.path}, {where}: run {name}'s step goes back from {into.last} to {step}: two runs of that name "
                "in one file; split the file, one run each"
            )
        into.last = step
        into.rows += 1
        if self.run is not None and name != self.run:
            return
        self.report.rows += 1
        self.report.overwritten += into.merged.append(step, row, excluded)

    def finish(self, report: ReadReport) -> Columns:
        """The run's merged rows so far, their account completed in ``report`` (this merger's report, or a copy of
        it: the merger is not changed and can go on adding); LogInputError for several runs (module docstring)."""
        runs, run, path = self.runs, self.run, self.path
        if self._stepless is not None:
            if not runs:  # no record has a step: the log has no step column
                raise self.steps.no_step(path, *self._stepless)
            # among records with a step, one without is no training step (the run's arguments, a summary)
            report.drop(
                "records without a step among records with one (configuration or summary records)",
                self._stepless_count,
            )
        if run is not None:
            if run not in runs:
                raise LogInputError(f"{path}: no run {run} in the file; its runs: {_runs(runs, 8)}")
            if len(runs) > 1:
                report.drop(f"rows of other runs than --run {run}", sum(r.rows for n, r in runs.items() if n != run))
                report.run = run
            return _one_writer(runs[run], path)
        if len(runs) > 1:
            names = ", ".join(list(runs)[:5]) + (", ..." if len(runs) > 5 else "")
            why = (
                f"named in its run column: {names}"
                if self._named
                else "; ".join(r.restart for r in list(runs.values())[1:3]) + ("; ..." if len(runs) > 3 else "")
            )
            raise LogInputError(
                f"{path} holds {len(runs)} runs ({why}): {_runs(runs, 5)}; merged by step, one run's rows would "
                f"replace another's: pass --run {next(iter(runs))} (or another) to judge one run, or split the file"
            )
        return _one_writer(next(iter(runs.values())), path) if runs else Columns()


def _one_writer(run: _Run, path: Path) -> Columns:
    """The run's rows; LogInputError where keys were logged twice with different values at two steps or more."""
    merged = run.merged
    if merged.conflict_steps >= 2:
        more = ", ..." if merged.conflict_steps > len(merged.conflicts) else ""
        shown = ", ".join(map(str, merged.conflicts)) + more
        raise LogInputError(
            f"{path}: {merged.conflict_steps} steps ({shown}) are each logged twice with different values of the same "
            "key: two runs written into one file line by line, with no run column to tell them apart; merged by step, "
            "one run's values would replace the other's: write each run to its own file, or log a run column (run, "
            "run_name) and pass --run"
        )
    return merged


@dataclass
class _Run:
    name: str
    first: int
    where: str
    restart: str
    last: int = -1
    rows: int = 0
    merged: Columns = field(default_factory=Columns)

    def __post_init__(self) -> None:
        self.last = self.first


def _runs(runs: Mapping[str, _Run], most: int) -> str:
    shown = [f"run {r.name}: steps {r.first}-{r.last} from {r.where}" for r in list(runs.values())[:most]]
    return ", ".join(shown) + (f" and {len(runs) - most} more" if len(runs) > most else "")


def run_name(record: Mapping[str, Any]) -> str | None:
    """The value of the record's run column, or None."""
    if record.keys().isdisjoint(RUN_KEYS):  # most records: none of them
        return None
    for key in RUN_KEYS:
        value = record.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()
    return None
