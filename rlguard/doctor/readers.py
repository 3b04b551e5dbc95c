"""Readers of training logs: each returns a :class:`MetricLog` of raw keys by optimizer step, with the account of
the read (:class:`~rlguard.doctor.readreport.ReadReport`).

Formats: TRL's ``trainer_state.json`` (``log_history``), verl's file-logger JSONL (``{"step": .., "data": {..}}``),
flat JSONL (one ``{"step": .., key: value}`` per line; nested objects are read as ``outer/inner`` keys), a CSV
exported from wandb, and a TensorBoard event folder (or file, :mod:`rlguard.doctor.tensorboard`).

What is read and what is not is counted, never silently: a missing value (JSON ``null``, an empty CSV cell) is a
null; text that is a number (``"NaN"``, ``"0.5"``) is read as one (a NaN is evidence); other values are counted as
non-numeric; evaluation-only rows, TRL's end-of-training summary and records whose values are all null are
dropped and counted. Rows of one step are merged, a later value replacing an earlier one (counted). A torn last
line of a JSONL file (a process stopped mid-write) is skipped with a warning. Every problem a user can fix raises
:class:`LogInputError` naming the file, the line or record, and the fix: a step that is not a whole number, JSON
that is not valid or nested too deeply, bytes that are not UTF-8, a wandb export of several runs.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlguard.doctor.readreport import LogInputError, ReadReport
from rlguard.doctor.tensorboard import TB_GLOB, read_tensorboard

__all__ = ["FORMATS", "LogInputError", "MetricLog", "ReadReport", "detect_format", "find_log", "read_log", "run_folder"]

FORMATS: tuple[str, ...] = ("trl", "verl", "jsonl", "wandb-csv", "tensorboard")
#: step columns, most trusted first (TRL's ``train/global_step`` is the optimizer step; wandb's ``_step`` counts logs)
_STEP_KEYS: tuple[str, ...] = ("step", "train/global_step", "global_step", "_step", "Step", "training/global_step")
_WANDB_AGGREGATE = re.compile(r"__(MIN|MAX)$")
#: nesting of a flat JSONL record read as ``outer/inner`` keys; deeper values are counted as non-numeric
_MAX_DEPTH = 4
Row = tuple[int, dict[str, float], str]  # (step, raw key -> value, where: the line or record)


@dataclass(frozen=True)
class MetricLog:
    """Raw metrics of a training log.

    Attributes:
        format: one of :data:`FORMATS`.
        path: the file or folder read.
        rows: ``(step, {raw key: value})`` by increasing step, one per step.
        report: what was read and what was not.
    """

    format: str
    path: Path
    rows: list[tuple[int, dict[str, float]]]
    report: ReadReport = field(default_factory=ReadReport)

    @property
    def keys(self) -> set[str]:
        """Every raw key seen."""
        return {k for _, row in self.rows for k in row}


def read_log(path: str | Path) -> MetricLog:
    """Read the log at ``path`` (a file, or a run folder: see :func:`find_log`), detecting its format."""
    path = Path(path)
    if not path.exists():
        raise LogInputError(f"no such file or folder: {path}")
    if path.is_dir():
        path = find_log(path)
    fmt = detect_format(path)
    reader = {
        "trl": _read_trainer_state,
        "verl": _read_jsonl,
        "jsonl": _read_jsonl,
        "wandb-csv": _read_wandb_csv,
        "tensorboard": read_tensorboard,
    }[fmt]
    report = ReadReport()
    try:
        rows = _merge(reader(path, report), report)
    except UnicodeDecodeError as err:
        raise LogInputError(_not_utf8(path, err)) from None
    except OSError as err:
        raise LogInputError(f"{path}: cannot be read ({err.strerror or err})") from None
    if not rows:
        raise LogInputError(
            f"{path} ({fmt}) holds no training step with a numeric metric ({'; '.join(report.lines())})"
        )
    return MetricLog(fmt, path, rows, report)


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


def detect_format(path: Path) -> str:
    """The format of a log file (or TensorBoard folder), from its name and first record."""
    if path.is_dir() or path.name.startswith("events.out.tfevents."):
        return "tensorboard"
    if path.suffix == ".csv":
        return "wandb-csv"
    first = _first_line(path)
    if not first:
        raise LogInputError(f"{path} is empty")
    if not first.startswith("{"):
        return _unknown(path)
    try:
        record = json.loads(first)
    except json.JSONDecodeError:  # a multi-line JSON document: TRL's is indented
        return (
            "trl" if re.search(r'"log_history"\s*:', path.read_text(encoding="utf-8")[:1_000_000]) else _unknown(path)
        )
    except RecursionError:
        raise LogInputError(f"{path}, line 1: JSON nested too deeply to read; one flat object per line") from None
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


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8") as fh:
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


def _step(row: Mapping[str, float], raw: Mapping[str, Any], fallback: int, path: Path, where: str) -> int:
    """The record's step: its first step key (:data:`_STEP_KEYS`) that holds a value, else ``fallback``; a step
    that is not a finite whole number >= 0 is bad input."""
    for key in _STEP_KEYS:
        if key in raw and raw[key] is not None:
            value = row.get(key)
            if value is None or not math.isfinite(value) or not float(value).is_integer() or value < 0:
                raise LogInputError(
                    f"{path}, {where}: {key} {raw[key]!r} is not a whole number of steps >= 0; the step column must "
                    "count optimizer steps (fix the record, or rename the column if it holds something else, e.g. "
                    "epochs)"
                )
            return int(value)
    return fallback


def _merge(rows: Iterator[Row], report: ReadReport) -> list[tuple[int, dict[str, float]]]:
    merged: dict[int, dict[str, float]] = {}
    for step, row, _ in rows:
        metrics = {k: v for k, v in row.items() if k not in _STEP_KEYS}
        if not metrics:
            report.drop("records with no numeric value (all null, text or step counters only)")
            continue
        report.rows += 1
        into = merged.setdefault(step, {})
        report.overwritten += sum(1 for k, v in metrics.items() if k in into and not _same(into[k], v))
        into.update(metrics)
    return sorted(merged.items())


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


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


def _read_trainer_state(path: Path, report: ReadReport) -> Iterator[Row]:
    data = _load_json(path.read_text(encoding="utf-8"), path, "")  # Python's json reads TRL's NaN and Infinity
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
        yield _step(row, record, i, path, where), row, where


def _read_jsonl(path: Path, report: ReadReport) -> Iterator[Row]:
    with path.open(encoding="utf-8") as fh:
        lines = [(i + 1, line) for i, line in enumerate(fh) if line.strip()]
    for n, (number, line) in enumerate(lines):
        report.records += 1
        where = f"line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if n == len(lines) - 1:
                report.warnings.append(f"{where}: a torn last line (the writer was stopped mid-line), skipped")
                report.drop("torn last line")
                continue
            raise LogInputError(f"{path}, {where}: not JSON ({err.msg}); fix or delete the line") from None
        except RecursionError:
            raise LogInputError(f"{path}, {where}: JSON nested too deeply to read; log flat records") from None
        if not isinstance(record, dict):
            raise LogInputError(
                f"{path}, {where}: expected a JSON object, got {type(record).__name__}; one object per line"
            )
        data = record.get("data")
        if isinstance(data, dict):  # verl's file logger
            row = _numeric(data, report)
            given = record.get("step")
            value = report.number("step", given) if given is not None else None
            step = _step({} if value is None else {"step": value}, {"step": given}, n, path, where)
        else:
            row = _numeric(record, report)
            step = _step(row, record, n, path, where)
        yield step, row, where


def _read_wandb_csv(path: Path, report: ReadReport) -> Iterator[Row]:
    """wandb's run-history export (``train/reward``, ``_step``) or a chart export of one run (``Step``,
    ``<run> - train/reward``, ``<run> - train/reward__MIN``); ``__MIN``/``__MAX`` columns are skipped. A chart
    export of several runs, or a column name given twice, is refused: their values would collapse onto one key."""
    with path.open(encoding="utf-8", newline="") as fh:
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
        for i, cells in enumerate(reader):
            report.records += 1
            where = f"line {i + 2}"
            row: dict[str, float] = {}
            raw: dict[str, Any] = {}
            for column, key, cell in zip(header, keys, cells, strict=False):
                if _WANDB_AGGREGATE.search(column):
                    continue
                raw[key] = cell if cell.strip() else None
                number = report.number(key, cell)
                if number is not None:
                    row[key] = number
            yield _step(row, raw, i, path, where), row, where


def run_folder(given: Path, log_path: Path) -> Path:
    """The run folder of a log: the folder given, else the log's folder, or the one above a ``checkpoint-*``."""
    if given.is_dir():
        return given
    folder = log_path.parent
    if folder.name.startswith("checkpoint-") and not (folder / "events.jsonl").is_file():
        return folder.parent
    return folder
