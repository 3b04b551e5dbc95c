"""Readers of training logs: each returns a :class:`MetricLog` of raw keys by optimizer step, with the account of
the read (:class:`~rlguard.doctor.readreport.ReadReport`).

Formats: TRL's ``trainer_state.json`` (``log_history``), verl's file-logger JSONL (``{"step": .., "data": {..}}``),
flat JSONL (one ``{"step": .., key: value}`` per line; nested objects are read as ``outer/inner`` keys), a CSV
exported from wandb, and a TensorBoard event folder (or file, :mod:`rlguard.doctor.tensorboard`).

What is read and what is not is counted, never silently: a missing value (JSON ``null``, an empty CSV cell) is a
null; text that is a number (``"NaN"``, ``"0.5"``) is read as one (a NaN is evidence); other values are counted as
non-numeric; evaluation-only rows, TRL's end-of-training summary and records whose values are all null are
dropped and counted. Rows of one step are merged, a later value replacing an earlier one (counted). A torn last
line of a JSONL file (a process stopped mid-write) is skipped with a warning; a CSV row with more or fewer cells
than the header (its values may have shifted) is not read and is damage. A UTF-8 byte-order mark is read. Every
problem a user can fix raises :class:`LogInputError` naming the file, the line or record, and the fix: a step that
is not a whole number, a record without a step (``--step-key``, ``--row-steps``), two runs in one file
(``--run``), JSON that is not valid or nested too deeply, bytes that are not UTF-8, a wandb export of several runs.

Where the step comes from and which run a row belongs to (two runs in one file are refused):
:mod:`rlguard.doctor.steps`.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlguard.doctor.inputs import open_input
from rlguard.doctor.readreport import LogInputError, ReadReport
from rlguard.doctor.steps import Row, StepRule, merge_runs, run_name
from rlguard.doctor.tensorboard import TB_GLOB, read_tensorboard

__all__ = [
    "FORMATS",
    "LogInputError",
    "MetricLog",
    "ReadReport",
    "detect_format",
    "events_file",
    "find_log",
    "read_log",
]

FORMATS: tuple[str, ...] = ("trl", "verl", "jsonl", "wandb-csv", "tensorboard")
#: the live guard's events beside a run's logs (:data:`rlguard.guards.events.EVENTS_FILE`)
EVENTS_FILE = "events.jsonl"
_WANDB_AGGREGATE = re.compile(r"__(MIN|MAX)$")
#: an integer of more digits than Python converts (``sys.get_int_max_str_digits()``, 4300 by default)
TOO_MANY_DIGITS = "an integer of more digits than can be read (4300), not a value a trainer logs; fix or delete it"
#: a UTF-8 byte-order mark is read as nothing
_ENCODING = "utf-8-sig"
#: nesting of a flat JSONL record read as ``outer/inner`` keys; deeper values are counted as non-numeric
_MAX_DEPTH = 4


@dataclass(frozen=True)
class MetricLog:
    """Raw metrics of a training log.

    Attributes:
        format: one of :data:`FORMATS`.
        path: the file or folder read.
        rows: ``(step, {raw key: value})`` by increasing step, one per step.
        report: what was read and what was not.
        streamed: whether the log was a stream (stdin, a pipe, a FIFO): it has no run folder.
    """

    format: str
    path: Path
    rows: list[tuple[int, dict[str, float]]]
    report: ReadReport = field(default_factory=ReadReport)
    streamed: bool = False

    @property
    def keys(self) -> set[str]:
        """Every raw key seen."""
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
            reader = {"trl": _read_trainer_state, "verl": _read_jsonl, "jsonl": _read_jsonl, "wandb-csv": _read_csv}
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


def find_log(folder: Path) -> Path:
    """The log of a run folder: ``trainer_state.json``, else the latest ``checkpoint-*/trainer_state.json``, else
    a metrics ``*.jsonl`` (not ``events.jsonl``), else a ``*.csv``, else the folder itself if it holds TensorBoard
    event files (at any depth)."""
    if (folder / "trainer_state.json").is_file():
        return folder / "trainer_state.json"
    checkpoints = [p for p in folder.glob("checkpoint-*/trainer_state.json") if p.parent.name[11:].isdigit()]
    if checkpoints:
        return max(checkpoints, key=lambda p: int(p.parent.name[11:]))
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
    with path.open(encoding=_ENCODING, errors="replace") as fh:
        return fh.read(size)


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding=_ENCODING) as fh:
            for line in fh:
                if line.strip():
                    return line.lstrip()
    except UnicodeDecodeError as err:
        raise LogInputError(_not_utf8(path, err)) from None
    return ""


def _numeric(record: Mapping[str, Any], report: ReadReport, prefix: str = "", depth: int = 0) -> dict[str, float]:
    """The numeric values of a record (nested objects as ``outer/inner`` keys), the rest counted in ``report``."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and depth < _MAX_DEPTH:
            out.update(_numeric(value, report, f"{name}/", depth + 1))
        elif (number := report.number(name, value)) is not None:
            out[name] = number
    return out


def _load_json(text: str, path: Path, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise LogInputError(
            f"{path}, {where} line {err.lineno} column {err.colno}: not valid JSON ({err.msg}); the file may be "
            "truncated: use the last complete checkpoint's copy"
        ) from None
    except RecursionError:
        raise LogInputError(f"{path}, {where}: JSON nested too deeply to read; log flat records") from None
    except ValueError:  # an integer of more digits than Python converts (sys.set_int_max_str_digits)
        raise LogInputError(f"{path}, {where}: {TOO_MANY_DIGITS}") from None


def _read_trainer_state(path: Path, report: ReadReport, steps: StepRule) -> Iterator[Row]:
    data = _load_json(path.read_text(encoding=_ENCODING), path, "")  # Python's json reads TRL's NaN and Infinity
    history = data.get("log_history") if isinstance(data, dict) else None
    if not isinstance(history, list):
        got = type(history).__name__ if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise LogInputError(
            f"{path}: log_history is {'null' if history is None and isinstance(data, dict) else got}, expected the "
            "list of logged steps TRL writes; use a checkpoint's trainer_state.json"
        )
    for i, record in enumerate(history):
        report.records += 1
        where = f"log_history[{i}]"
        if not isinstance(record, dict):
            report.drop("log_history entries that are not objects")
            continue
        if "train_runtime" in record:
            report.drop("end-of-training summary")
            continue
        row = _numeric(record, report)
        if any(k.startswith("eval_") for k in row):
            report.drop("evaluation rows")  # they share the step of a training row but are not one
            continue
        yield steps.of(row, record, i, path, where), row, where, None


class NotJson(LogInputError):
    """A JSONL line that is not JSON: bad input, or the torn last line of a writer stopped mid-line."""


def jsonl_record(line: str, path: Path, where: str) -> dict[str, Any]:
    """One line of a JSONL log as its JSON object: :class:`NotJson` for a line that is not JSON, LogInputError for
    one that is not an object or cannot be read."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise NotJson(f"{path}, {where}: not JSON ({err.msg}); fix or delete the line") from None
    except RecursionError:
        raise LogInputError(f"{path}, {where}: JSON nested too deeply to read; log flat records") from None
    except ValueError:  # an integer of more digits than Python converts
        raise LogInputError(f"{path}, {where}: {TOO_MANY_DIGITS}") from None
    if not isinstance(record, dict):
        raise LogInputError(
            f"{path}, {where}: expected a JSON object, got {type(record).__name__}; one object per line"
        )
    return record


def jsonl_row(record: Mapping[str, Any], report: ReadReport, steps: StepRule, n: int, path: Path, where: str) -> Row:
    """Record ``n`` (0-based) of a JSONL log as a row: verl's file logger (``{"step", "data"}``) or a flat record."""
    data = record.get("data")
    if isinstance(data, dict):  # verl's file logger: the step beside the data
        row = _numeric(data, report)
        given = record.get("step")
        value = report.number("step", given) if given is not None else None
        view = {**row, **({} if value is None else {"step": value})}
        step = steps.of(view, {**data, "step": given}, n, path, where)
    else:
        row = _numeric(record, report)
        step = steps.of(row, record, n, path, where)
    return step, row, where, run_name(record)


def _read_jsonl(path: Path, report: ReadReport, steps: StepRule) -> Iterator[Row]:
    with path.open(encoding=_ENCODING) as fh:
        lines = [(i + 1, line) for i, line in enumerate(fh) if line.strip()]
    for n, (number, line) in enumerate(lines):
        report.records += 1
        where = f"line {number}"
        try:
            record = jsonl_record(line, path, where)
        except NotJson:
            if n == len(lines) - 1:
                report.warnings.append(f"{where}: a torn last line (the writer was stopped mid-line), skipped")
                report.drop("torn last line")
                continue
            raise
        yield jsonl_row(record, report, steps, n, path, where)


def _read_csv(path: Path, report: ReadReport, steps: StepRule) -> Iterator[Row]:
    """wandb's run-history export (``train/reward``, ``_step``) or a chart export of one run (``Step``,
    ``<run> - train/reward``, ``<run> - train/reward__MIN``); ``__MIN``/``__MAX`` columns are skipped. A chart
    export of several runs, or a column name given twice, is refused: their values would collapse onto one key. A
    row with more or fewer cells than the header is not read (its cells may have shifted columns): damage, or a
    warning for a short last row (a torn write)."""
    with path.open(encoding=_ENCODING, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise LogInputError(f"{path}: empty CSV, no header row")
        columns = [c for c in header if not _WANDB_AGGREGATE.search(c)]
        runs = sorted({c.split(" - ", 1)[0] for c in columns if " - " in c})
        if len(runs) > 1:
            shown = ", ".join(runs[:5]) + (", ..." if len(runs) > 5 else "")
            raise LogInputError(
                f"{path} is a wandb chart export of {len(runs)} runs ({shown}): their columns would collapse onto one "
                "key per stat; export one run (its run page's history), or delete the other runs' columns"
            )
        keys = [c.split(" - ", 1)[1] if " - " in c else c for c in header]
        twice = sorted({k for i, k in enumerate(keys) if k in keys[:i] and not _WANDB_AGGREGATE.search(header[i])})
        if twice:
            raise LogInputError(
                f"{path}: column(s) {', '.join(twice)} appear twice: their values would collapse onto one key; "
                "keep one column per stat"
            )
        ragged: dict[str, list[int]] = {"more": [], "fewer": []}
        n = 0
        for cells in reader:
            if not cells:
                continue  # a blank line
            report.records += 1
            line = reader.line_num
            if len(cells) != len(header):
                ragged["more" if len(cells) > len(header) else "fewer"].append(line)
                report.drop("rows with more or fewer cells than the header")
                continue
            where = f"line {line}"
            row: dict[str, float] = {}
            raw: dict[str, Any] = {}
            for column, key, cell in zip(header, keys, cells, strict=True):
                if _WANDB_AGGREGATE.search(column):
                    continue
                raw[key] = cell if cell.strip() else None
                number = report.number(key, cell)
                if number is not None:
                    row[key] = number
            yield steps.of(row, raw, n, path, where), row, where, run_name(raw)
            n += 1
        _report_ragged(report, ragged, len(header), reader.line_num)


def _report_ragged(report: ReadReport, ragged: dict[str, list[int]], cells: int, last_line: int) -> None:
    if ragged["fewer"] and ragged["fewer"][-1] == last_line:
        report.warnings.append(f"line {last_line}: a torn last row (fewer cells than the header), skipped")
        ragged["fewer"].pop()
    for kind, lines in ragged.items():
        if lines:
            shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
            report.damage.append(
                f"{len(lines)} rows with {kind} cells than the header's {cells} (line {shown}), not read: a cell "
                "holding the separator may have shifted their values; quote such cells, or fix the rows"
            )


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
