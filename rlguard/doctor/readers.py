"""Readers of training logs: each returns a :class:`MetricLog` of raw keys by optimizer step.

Formats: TRL's ``trainer_state.json`` (``log_history``), verl's file-logger JSONL (``{"step": .., "data": {..}}``),
flat JSONL (one ``{"step": .., key: value}`` per line), a CSV exported from wandb, and a TensorBoard event folder
(or file). A missing value (JSON ``null``, an empty CSV cell) is dropped; a NaN or Inf is kept (it is evidence).
Rows of one step are merged, later values winning; evaluation-only rows and TRL's end-of-training summary are
skipped. Every problem a user can fix raises :class:`LogInputError` with a one-line message.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlguard.guards.events import Event

FORMATS: tuple[str, ...] = ("trl", "verl", "jsonl", "wandb-csv", "tensorboard")
_TB_GLOB = "events.out.tfevents.*"
#: step columns, most trusted first (TRL's ``train/global_step`` is the optimizer step; wandb's ``_step`` counts logs)
_STEP_KEYS: tuple[str, ...] = ("step", "train/global_step", "global_step", "_step", "Step", "training/global_step")
_WANDB_AGGREGATE = re.compile(r"__(MIN|MAX)$")


class LogInputError(ValueError):
    """A log the doctor cannot read; ``str(err)`` is one line a user can act on."""


@dataclass(frozen=True)
class MetricLog:
    """Raw metrics of a training log.

    Attributes:
        format: one of :data:`FORMATS`.
        path: the file or folder read.
        rows: ``(step, {raw key: value})`` by increasing step, one per step.
    """

    format: str
    path: Path
    rows: list[tuple[int, dict[str, float]]]

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
        "tensorboard": _read_tensorboard,
    }[fmt]
    rows = _merge(reader(path))
    if not rows:
        raise LogInputError(f"{path} ({fmt}) holds no training step with a numeric metric")
    return MetricLog(fmt, path, rows)


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
    if next(folder.rglob(_TB_GLOB), None) is not None:
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
        raise LogInputError(f"{path} is empty or not text")
    if not first.startswith("{"):
        return _unknown(path)
    try:
        record = json.loads(first)
    except json.JSONDecodeError:  # a multi-line JSON document
        return "trl" if _is_trainer_state(path) else _unknown(path)
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
    except UnicodeDecodeError:
        pass
    return ""


def _is_trainer_state(path: Path) -> bool:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and isinstance(data.get("log_history"), list)


def _number(value: Any) -> float | None:
    """A metric value as float; None for missing, booleans, strings and containers."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _numeric(record: Mapping[str, Any]) -> dict[str, float]:
    return {k: v for k, v in ((k, _number(v)) for k, v in record.items()) if v is not None}


def _step_of(record: Mapping[str, float], fallback: int) -> int:
    for key in _STEP_KEYS:
        value = record.get(key)
        if value is not None and math.isfinite(value):
            return int(value)
    return fallback


def _merge(rows: Iterable[tuple[int, dict[str, float]]]) -> list[tuple[int, dict[str, float]]]:
    merged: dict[int, dict[str, float]] = {}
    for step, row in rows:
        metrics = {k: v for k, v in row.items() if k not in _STEP_KEYS}
        if metrics:
            merged.setdefault(step, {}).update(metrics)
    return sorted(merged.items())


def _read_trainer_state(path: Path) -> Iterator[tuple[int, dict[str, float]]]:
    data = json.loads(path.read_text(encoding="utf-8"))  # Python's json reads TRL's NaN and Infinity
    for i, record in enumerate(data["log_history"]):
        if not isinstance(record, dict) or "train_runtime" in record:
            continue  # the end-of-training summary is not a step
        row = _numeric(record)
        if any(k.startswith("eval_") for k in row):
            continue  # evaluation rows share the step of a training row but are not one
        yield _step_of(row, i), row


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, float]]]:
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise LogInputError(f"{path}, line {i + 1}: not JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise LogInputError(f"{path}, line {i + 1}: expected a JSON object, got {type(record).__name__}")
            data = record.get("data")
            if isinstance(data, dict):  # verl's file logger
                row = _numeric(data)
                step = _number(record.get("step"))
                yield (int(step) if step is not None else _step_of(row, i)), row
            else:
                row = _numeric(record)
                yield _step_of(row, i), row


def _read_wandb_csv(path: Path) -> Iterator[tuple[int, dict[str, float]]]:
    """wandb's run-history export (``train/reward``, ``_step``) or a chart export (``Step``,
    ``<run> - train/reward``, ``<run> - train/reward__MIN``); ``__MIN``/``__MAX`` columns are skipped."""
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames:
            raise LogInputError(f"{path}: empty CSV, no header row")
        for i, record in enumerate(reader):
            row: dict[str, float] = {}
            for column, cell in record.items():
                if column is None or cell is None or not cell.strip() or _WANDB_AGGREGATE.search(column):
                    continue
                key = column.split(" - ", 1)[1] if " - " in column else column
                try:
                    row[key] = float(cell)
                except ValueError:
                    continue  # text columns (run names, tags)
            yield _step_of(row, i), row


def _read_tensorboard(path: Path) -> Iterator[tuple[int, dict[str, float]]]:
    try:
        from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
            EventAccumulator,
        )
    except ImportError:
        raise LogInputError(
            f"{path} is a TensorBoard log; reading it needs the tensorboard package (pip install tensorboard)"
        ) from None
    files = [path] if path.is_file() else sorted(path.rglob(_TB_GLOB))
    for file in files:
        acc = EventAccumulator(str(file), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        tags = acc.Tags()
        for tag in tags.get("scalars", []):
            for ev in acc.Scalars(tag):
                yield int(ev.step), {tag: float(ev.value)}
        for tag in tags.get("tensors", []):  # TF2-style scalars are stored as 0-dim tensors
            for tev in acc.Tensors(tag):
                values = tev.tensor_proto.float_val or tev.tensor_proto.double_val
                if len(values) == 1:
                    yield int(tev.step), {tag: float(values[0])}


def run_folder(given: Path, log_path: Path) -> Path:
    """The run folder of a log: the folder given, else the log's folder, or the one above a ``checkpoint-*``."""
    if given.is_dir():
        return given
    folder = log_path.parent
    if folder.name.startswith("checkpoint-") and not (folder / "events.jsonl").is_file():
        return folder.parent
    return folder


def read_events(path: Path) -> list[Event]:
    """Events of an ``events.jsonl`` (one ``Event.to_dict()`` per line), as the live guard writes them."""
    from rlguard.guards.events import Event

    events = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            try:
                events.append(Event.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError) as err:
                raise LogInputError(f"{path}, line {i + 1}: not a guard event ({err})") from None
    return events
