"""Readers of training logs: each returns a :class:`MetricLog` of raw keys by optimizer step, with the account of
the read (:class:`~rlguard.doctor.readreport.ReadReport`).

Formats: TRL's ``trainer_state.json`` (``log_history``), verl's file-logger JSONL (``{"step": .., "data": {..}}``),
flat JSONL (one ``{"step": .., key: value}`` per line; nested objects are read as ``outer/inner`` keys), a CSV
exported from wandb, and a TensorBoard event folder (or file, :mod:`rlguard.doctor.tensorboard`).

What is read and what is not is counted, never silently: a missing value (JSON ``null``, an empty CSV cell) is a
null; text that is a number (``"NaN"``, ``"0.5"``) is read as one (a NaN is evidence); other values are counted as
non-numeric; evaluation-only rows, TRL's end-of-training summary and records whose values are all null are
dropped and counted. Rows of one step are merged, a later value replacing an earlier one (counted). A torn last
line of a JSONL file or CSV (a process stopped mid-write) is not read and is damage (a partial read: exit 3, not
0); a CSV row with more or fewer cells than the header (its values may have shifted) is not read and is damage. A
UTF-8 byte-order mark is read. Each file is read in one pass, record by record, into a table kept by column
(:class:`~rlguard.doctor.columns.Columns`): memory grows with the steps kept, not with the file's bytes. Every
problem a user can fix raises :class:`LogInputError` naming the file, the line or record, and the fix: a step that
is not a whole number, a record without a step (``--step-key``, ``--row-steps``), two runs in one file
(``--run``), JSON that is not valid or nested too deeply, bytes that are not UTF-8, a wandb export of several runs.

Where the step comes from and which run a row belongs to (two runs in one file are refused):
:mod:`rlguard.doctor.steps`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlguard.doctor.columns import Columns
from rlguard.doctor.csvlog import read_csv
from rlguard.doctor.inputs import open_input
from rlguard.doctor.jsonlog import ENCODING, TOO_MANY_DIGITS, read_jsonl, read_trainer_state
from rlguard.doctor.readreport import LogInputError, ReadReport
from rlguard.doctor.steps import StepRule, merge_runs
from rlguard.doctor.tensorboard import TB_GLOB, read_tensorboard
from rlguard.guards.events import EVENTS_FILE, METRICS_FILE

__all__ = [
    "FORMATS",
    "LogInputError",
    "MetricLog",
    "ReadReport",
    "detect_format",
    "events_file",
    "find_log",
    "read_log",
    "trainer_state",
]

FORMATS: tuple[str, ...] = ("trl", "verl", "jsonl", "wandb-csv", "tensorboard")


@dataclass(frozen=True)
class MetricLog:
    """Raw metrics of a training log.

    Attributes:
        format: one of :data:`FORMATS`.
        path: the file or folder read.
        rows: ``(step, {raw key: value})`` by increasing step, one per step (a :class:`~rlguard.doctor.columns.Columns`
            from the readers; any sequence of such pairs from elsewhere).
        report: what was read and what was not.
        streamed: whether the log was a stream (stdin, a pipe, a FIFO): it has no run folder.
    """

    format: str
    path: Path
    rows: Sequence[tuple[int, dict[str, float]]]
    report: ReadReport = field(default_factory=ReadReport)
    streamed: bool = False

    @property
    def keys(self) -> set[str]:
        """Every raw key seen."""
        if isinstance(self.rows, Columns):
            return self.rows.names
        return {k for _, row in self.rows for k in row}


def read_log(
    path: str | Path, *, step_key: str | None = None, row_steps: bool = False, run: str | None = None
) -> MetricLog:
    """Read the log at ``path`` (a file, a run folder: see :func:`find_log`, or ``-``, a pipe or a FIFO: read once
    and whole, :mod:`rlguard.doctor.inputs`), detecting its format.

    ``step_key``: the column that holds the step (``--step-key``); ``row_steps``: number the rows 1, 2, ... instead
    (``--row-steps``); ``run``: the run to judge of a file that holds several (``--run``, module docstring).
    """
    steps = StepRule(step_key, row_steps)
    with open_input(path) as given:
        try:
            return _read(given.path, steps, run, streamed=given.streamed, shown=given.shown)
        except LogInputError as err:
            if not given.streamed:
                raise
            raise LogInputError(str(err).replace(str(given.path), str(given.shown))) from None


def _read(path: Path, steps: StepRule, run: str | None, *, streamed: bool, shown: Path) -> MetricLog:
    if path.is_dir():
        path = find_log(path)
        if not path.is_file() and not path.is_dir():  # a FIFO or a device in the folder: never opened here
            raise LogInputError(
                f"{path} is not a regular file (a FIFO or a device file); give it as the path to read it as a pipe"
            )
    fmt = detect_format(path, sniff=streamed)
    report = ReadReport()
    if steps.row_steps:
        report.step_source = "row numbers (--row-steps), not logged steps"
    elif steps.key:
        report.step_source = f"column {steps.key} (--step-key)"
    try:
        if fmt == "tensorboard":
            rows = merge_runs(((s, r, w, None) for s, r, w in read_tensorboard(path, report)), report, steps, path, run)
        else:
            reader = {"trl": read_trainer_state, "verl": read_jsonl, "jsonl": read_jsonl, "wandb-csv": read_csv}
            rows = merge_runs(reader[fmt](path, report, steps), report, steps, path, run)
    except UnicodeDecodeError as err:
        raise LogInputError(_not_utf8(path, err)) from None
    except OSError as err:
        raise LogInputError(f"{path}: cannot be read ({err.strerror or err})") from None
    if not rows:
        raise LogInputError(
            f"{path} ({fmt}) holds no training step with a numeric metric ({'; '.join(report.lines())})"
        )
    return MetricLog(fmt, shown if streamed else path, rows, report, streamed)


def _not_utf8(path: Path, err: UnicodeDecodeError) -> str:
    line = path.read_bytes()[: err.start].count(b"\n") + 1 if path.is_file() else 0
    return f"{path}, line {line}: byte {err.start} is not UTF-8 ({err.reason}); save or export the log as UTF-8"


def trainer_state(folder: Path) -> Path | None:
    """A TRL run folder's ``trainer_state.json``, else its latest ``checkpoint-*/trainer_state.json``, else None."""
    if (folder / "trainer_state.json").is_file():
        return folder / "trainer_state.json"
    checkpoints = [p for p in folder.glob("checkpoint-*/trainer_state.json") if p.parent.name[11:].isdigit()]
    return max(checkpoints, key=lambda p: int(p.parent.name[11:])) if checkpoints else None


def find_log(folder: Path) -> Path:
    """The log of a run folder: rlguard's ``rlguard_metrics.jsonl`` (every record of a TRL run, written at each
    step), else ``trainer_state.json``, else the latest ``checkpoint-*/trainer_state.json``, else a metrics
    ``*.jsonl`` (not ``events.jsonl``), else a ``*.csv``, else the folder itself if it holds TensorBoard event files
    (at any depth)."""
    if (folder / METRICS_FILE).is_file():
        return folder / METRICS_FILE
    state = trainer_state(folder)
    if state is not None:
        return state
    jsonl = sorted(p for p in folder.glob("*.jsonl") if p.name != "events.jsonl")
    if jsonl:
        return jsonl[0]
    tables = sorted(folder.glob("*.csv"))
    if tables:
        return tables[0]
    if next(folder.rglob(TB_GLOB), None) is not None:
        return folder
    raise LogInputError(
        f"no training log in folder {folder}: expected trainer_state.json, checkpoint-*/trainer_state.json, "
        "a metrics .jsonl, a wandb .csv or TensorBoard event files"
    )


def detect_format(path: Path, *, sniff: bool = False) -> str:
    """The format of a log file (or TensorBoard folder), from its name and first record; with ``sniff`` (a stream,
    whose name says nothing), TensorBoard and CSV from the first bytes too."""
    if path.is_dir() or path.name.startswith("events.out.tfevents."):
        return "tensorboard"
    if path.suffix == ".csv":
        return "wandb-csv"
    if sniff:
        with path.open("rb") as fh:
            if b"brain.Event:" in fh.read(64):  # the first record of every event file: its version
                return "tensorboard"
    first = _first_line(path)
    if not first:
        raise LogInputError(f"{path} is empty")
    if sniff and not first.startswith("{") and "," in first:
        return "wandb-csv"
    if not first.startswith("{"):
        return _unknown(path)
    try:
        record = json.loads(first)
    except json.JSONDecodeError:  # a multi-line JSON document: TRL's is indented
        return "trl" if re.search(r'"log_history"\s*:', _head(path)) else _unknown(path)
    except RecursionError:
        raise LogInputError(f"{path}, line 1: JSON nested too deeply to read; one flat object per line") from None
    except ValueError:  # an integer of more digits than Python converts
        raise LogInputError(f"{path}, line 1: {TOO_MANY_DIGITS}") from None
    if not isinstance(record, dict):
        return _unknown(path)
    if "log_history" in record:
        return "trl"
    return "verl" if isinstance(record.get("data"), dict) and "step" in record else "jsonl"


def _unknown(path: Path) -> str:
    raise LogInputError(
        f"unknown log format: {path} (expected TRL's trainer_state.json, a verl or flat .jsonl, a wandb .csv "
        "or a TensorBoard event folder)"
    )


def _head(path: Path, size: int = 1_000_000) -> str:
    """The first ``size`` characters (not the whole file: a TRL state is found by its ``log_history`` key)."""
    with path.open(encoding=ENCODING, errors="replace") as fh:
        return fh.read(size)


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding=ENCODING) as fh:
            for line in fh:
                if line.strip():
                    return line.lstrip()
    except UnicodeDecodeError as err:
        raise LogInputError(_not_utf8(path, err)) from None
    return ""


def events_file(given: Path, log_path: Path) -> Path | None:
    """The run's ``events.jsonl`` (what the live guard recorded): in the folder given or the log's folder, or up to
    two levels above a ``checkpoint-*`` folder or a TensorBoard folder (``out/runs``, ``out/runs/<run>``, as the
    watch guide shows); None where there is none."""
    folder = given if given.is_dir() else log_path if log_path.is_dir() else log_path.parent
    tensorboard = log_path.is_dir() or log_path.name.startswith("events.out.tfevents.")
    for _ in range(3):
        if (folder / EVENTS_FILE).is_file():
            return folder / EVENTS_FILE
        if not (folder.name.startswith("checkpoint-") or tensorboard):
            return None
        folder = folder.parent
    return None
