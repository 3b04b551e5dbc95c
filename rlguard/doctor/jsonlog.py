"""The JSON readers: TRL's ``trainer_state.json`` (``log_history``) and JSONL logs (verl's file logger, flat
records), read record by record (a JSONL file line by line: memory does not grow with the file's length).

A missing value (JSON ``null``) is a null; text that is a number (``"NaN"``, ``"0.5"``) is read as one (a NaN is
evidence); other values are counted as non-numeric; nested objects of a flat record are read as ``outer/inner`` keys
(at most :data:`_MAX_DEPTH` deep). A torn last line of a JSONL file (a writer stopped mid-line) is not read and is
damage (:meth:`~rlguard.doctor.readreport.ReadReport.torn`); a bad line with lines after it is bad input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rlguard.doctor.readreport import LogInputError, ReadReport
from rlguard.doctor.steps import Row, StepRule, run_name
from rlguard.guards.state import long_integer_at

_fast_loads: Callable[[str], Any] | None
try:  # optional: about 4x faster than json on a log's records; the records read are the same (loads_exact)
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - the core's dependencies do not include it
    _fast_loads = None

__all__ = [
    "TOO_MANY_DIGITS",
    "NotJson",
    "jsonl_record",
    "jsonl_row",
    "load_json",
    "loads_exact",
    "read_jsonl",
    "read_trainer_state",
]

#: an integer of more digits than Python converts (``sys.get_int_max_str_digits()``, 4300 by default)
TOO_MANY_DIGITS = "an integer of more digits than can be read (4300), not a value a trainer logs; fix or delete it"
#: a UTF-8 byte-order mark is read as nothing
ENCODING = "utf-8-sig"
#: nesting of a flat JSONL record read as ``outer/inner`` keys; deeper values are counted as non-numeric
_MAX_DEPTH = 4


def _numeric(record: Mapping[str, Any], report: ReadReport, prefix: str = "", depth: int = 0) -> dict[str, float]:
    """The numeric values of a record (nested objects as ``outer/inner`` keys), the rest counted in ``report``."""
    if not prefix:
        # a record without nested objects (the common case): a copy, in which each value that is not a float is
        # read (or deleted) in place, in the record's order: the keys, values, order and counts of the loop below
        others = [key for key, value in record.items() if type(value) is not float]
        if not any(isinstance(record[key], Mapping) for key in others):
            out = dict(record)
            for key in others:
                number = report.number(key, record[key])
                if number is None:
                    del out[key]
                else:
                    out[key] = number
            return out
    out = {}
    for key, value in record.items():
        if type(value) is float and not prefix:  # the common case, without the account's checks
            out[key] = value
            continue
        name = f"{prefix}{key}" if prefix else key
        if type(value) is float:
            out[name] = value
        elif isinstance(value, Mapping) and depth < _MAX_DEPTH:
            out.update(_numeric(value, report, f"{name}/", depth + 1))
        elif (number := report.number(name, value)) is not None:
            out[name] = number
    return out


def load_json(text: str, path: Path, where: str) -> Any:
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
        at = long_integer_at(text)
        place = f"{where} line {at[0]} column {at[1]}" if at is not None else where or "a value"
        raise LogInputError(f"{path}, {place.strip()}: {TOO_MANY_DIGITS}") from None


def read_trainer_state(path: Path, report: ReadReport, steps: StepRule) -> Iterator[Row]:
    data = load_json(path.read_text(encoding=ENCODING), path, "")  # Python's json reads TRL's NaN and Infinity
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
            # an evaluation row shares the step of a training row but is not one: its eval_* metrics join that step
            # (the doctor reads one beside the reward), its epoch and step stay the training row's
            evaluation = {k: v for k, v in row.items() if k.startswith("eval_")}
            yield steps.of(row, record, i, path, where), evaluation, where, None
            continue
        yield steps.of(row, record, i, path, where), row, where, None


#: orjson reads an integer beyond 64 bits as a float (json: an int); a float this large sends the record to json
_WIDE = float(2**63)


#: a dict of at most this many values is read one by one by _narrow (verl's ``{"step", "data"}``: no TypeError)
_SMALL = 4


def _narrow(value: Any) -> bool:
    """Whether no float in ``value`` (a parsed record) is at least 2**63 in magnitude."""
    if type(value) is dict and len(value) > _SMALL:
        # a flat record of numbers (the common case) in one call: its Euclidean norm bounds every magnitude, so a
        # norm under half the bound (a margin far beyond its rounding error) says every value is narrow; else the
        # values are read one by one. A value that is not a number raises TypeError, an int beyond float's range
        # OverflowError.
        try:
            if math.hypot(*value.values()) < _WIDE / 2:
                return True
        except (TypeError, OverflowError):
            pass
    for item in value.values() if type(value) is dict else value if type(value) is list else (value,):
        if type(item) is float:
            if not -_WIDE < item < _WIDE:
                return False
        elif (type(item) is dict or type(item) is list) and not _narrow(item):
            return False
    return True


def loads_exact(line: str) -> Any:
    """``json.loads(line)``, read by orjson where it is installed and reads the same: a line orjson refuses (NaN,
    Infinity, an out-of-range float, a lone surrogate, deep nesting) or whose record holds a float of at least
    2**63 in magnitude (orjson's reading of an integer beyond 64 bits) is read by json, errors included."""
    if _fast_loads is not None:
        try:
            record = _fast_loads(line)
            if _narrow(record):
                return record
        except (ValueError, RecursionError):  # orjson.JSONDecodeError, or nesting _narrow cannot walk: json decides
            pass
    return json.loads(line)


class NotJson(LogInputError):
    """A JSONL line that is not JSON: bad input, or the torn last line of a writer stopped mid-line."""


def jsonl_record(line: str, path: Path, where: str) -> dict[str, Any]:
    """One line of a JSONL log as its JSON object: :class:`NotJson` for a line that is not JSON, LogInputError for
    one that is not an object or cannot be read."""
    try:
        record = loads_exact(line)
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
        if value is not None and not steps.key:
            # "step" is the rule's first key and it holds a number: the step is read from it alone, as from the
            # merged views below (no copy of the data)
            step = steps.of({"step": value}, {"step": given}, n, path, where)
        else:
            view = {**row, **({} if value is None else {"step": value})}
            step = steps.of(view, {**data, "step": given}, n, path, where)
    else:
        row = _numeric(record, report)
        step = steps.of(row, record, n, path, where)
    return step, row, where, run_name(record)


def read_jsonl(path: Path, report: ReadReport, steps: StepRule) -> Iterator[Row]:
    """The rows of a JSONL log, one line at a time; a line that is not JSON is bad input unless it is the last
    (torn: damage)."""
    suspect: tuple[str, NotJson] | None = None  # the last line read, if not JSON: torn unless a line follows
    n = 0
    with path.open(encoding=ENCODING) as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            if suspect is not None:
                raise suspect[1]
            report.records += 1
            where = f"line {number}"
            try:
                record = jsonl_record(line, path, where)
            except NotJson as err:
                suspect = (where, err)
                continue
            yield jsonl_row(record, report, steps, n, path, where)
            n += 1
    if suspect is not None:
        report.torn(suspect[0])
