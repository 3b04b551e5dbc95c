"""The reader's fast paths read what its general paths read: a flat record's values (``jsonlog._numeric``), verl's
step (``jsonlog.jsonl_row``), and rows of the last row's keys appended a block at a time (``columns._Layout``), on
random record streams whose repeated layouts are broken by a changed key, a non-numeric value, a NaN string, a
bool, a huge int, a nested object or a repeated step."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlguard.doctor import LogInputError, read_log
from rlguard.doctor import columns as columns_module
from rlguard.doctor.jsonlog import _MAX_DEPTH, _numeric, jsonl_row
from rlguard.doctor.readreport import ReadReport
from rlguard.doctor.steps import StepRule
from tests.helpers.profiles import examples

#: values a record may hold: numbers at the edges, text that is a number or not, null, bools, lists
SCALARS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -0.0, 1, 2**53 + 1, 2**63, -(2**70), 10**400, -(10**400), True, False, None]),
    st.sampled_from(["NaN", "nan", "-inf", "0.5", " 7 ", "", "  ", "abc", "1e999"]),
    st.integers(),
    st.lists(st.integers(), max_size=2),
)
KEYS = st.sampled_from(["step", "_step", "loss", "reward", "kl", "train/loss", "run", "data", "x"])
RECORDS = st.recursive(
    st.dictionaries(KEYS, SCALARS, max_size=6),
    lambda inner: st.dictionaries(KEYS, st.one_of(SCALARS, inner), max_size=6),
    max_leaves=12,
)


def _reference_numeric(
    record: Mapping[str, Any], report: ReadReport, prefix: str = "", depth: int = 0
) -> dict[str, float]:
    """The record's numbers read one value at a time (the documented definition: nested objects as ``outer/inner``
    keys, the rest counted by ``ReadReport.number``)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}" if prefix else key
        if type(value) is float:
            out[name] = value
        elif isinstance(value, Mapping) and depth < _MAX_DEPTH:
            out.update(_reference_numeric(value, report, f"{name}/", depth + 1))
        elif (number := report.number(name, value)) is not None:
            out[name] = number
    return out


def _account(report: ReadReport) -> list[Any]:
    """The report's counts, the order of its non-numeric keys included (``most_common`` breaks ties by it)."""
    return [report.nulls, list(report.non_numeric.items())]


@examples(quick=300, long=5000)
@given(record=RECORDS)
def test_numeric_reads_a_record_as_the_one_value_at_a_time_definition(record: dict[str, Any]) -> None:
    got_report, want_report = ReadReport(), ReadReport()
    got, want = _numeric(record, got_report), _reference_numeric(record, want_report)
    assert list(got) == list(want) and [repr(v) for v in got.values()] == [repr(v) for v in want.values()]
    assert all(type(v) is float for v in got.values())
    assert _account(got_report) == _account(want_report)


def _reference_verl_step(record: Mapping[str, Any], steps: StepRule, n: int) -> int | None:
    """verl's step read from the record's data with its step merged in (``jsonl_row``'s general path)."""
    data = record["data"]
    report = ReadReport()
    row = _reference_numeric(data, report)
    given = record.get("step")
    value = report.number("step", given) if given is not None else None
    view = {**row, **({} if value is None else {"step": value})}
    return steps.of(view, {**data, "step": given}, n, Path("log.jsonl"), "line 1")


@examples(quick=300, long=5000)
@given(
    step=SCALARS,
    data=st.dictionaries(KEYS, SCALARS, max_size=5),
    rule=st.sampled_from([StepRule(), StepRule(key="step"), StepRule(key="loss"), StepRule(row_steps=True)]),
)
def test_verl_s_step_is_read_as_from_the_merged_record(step: Any, data: dict[str, Any], rule: StepRule) -> None:
    record = {"step": step, "data": data}

    def outcome(read: Any) -> tuple[str, Any]:
        try:
            return "step", read()
        except LogInputError as err:
            return "error", str(err)

    got = outcome(lambda: jsonl_row(record, ReadReport(), rule, 3, Path("log.jsonl"), "line 1")[0])
    assert got == outcome(lambda: _reference_verl_step(record, rule, 3))


#: a stream's base record, and what each later record changes of it
_CHANGES = st.sampled_from(["same", "same", "same", "same", "key", "text", "nan", "bool", "huge", "nested", "again"])


def _stream(shape: str, changes: list[str], values: list[float]) -> list[str]:
    lines, step = [], 0
    for i, change in enumerate(changes):
        step += 0 if change == "again" else 1
        stats: dict[str, Any] = {"loss": values[i % len(values)], "reward": 0.5 + i, "kl": i * 0.25, "n": i}
        if change == "key":
            stats[f"extra{i % 3}"] = 1.0
        elif change == "text":
            stats["kl"] = "abc"
        elif change == "nan":
            stats["loss"] = "NaN"
        elif change == "bool":
            stats["reward"] = True
        elif change == "huge":
            stats["n"] = 10**400
        elif change == "nested":
            stats["kl"] = {"mean": 0.5, "max": None}
        if shape == "verl":
            record: dict[str, Any] = {"step": step, "data": stats}
        elif shape == "wandb":
            record = {"_step": step, "_runtime": 2.0 * step, **stats}
        else:
            record = {"step": step, **stats}
        lines.append(json.dumps(record))
    return lines


def _read(path: Path) -> tuple[str, Any]:
    try:
        log = read_log(path)
    except LogInputError as err:
        return "error", str(err)
    return "log", (log.rows, log.report.to_dict())


@examples(quick=60, long=600)
@given(
    shape=st.sampled_from(["flat", "verl", "wandb"]),
    changes=st.lists(_CHANGES, min_size=1, max_size=40),
    values=st.lists(st.floats(allow_nan=False), min_size=1, max_size=5),
    block=st.integers(1, 4),
)
def test_rows_of_a_repeated_layout_read_as_row_by_row(
    tmp_path_factory: pytest.TempPathFactory, shape: str, changes: list[str], values: list[float], block: int
) -> None:
    """The table and account read with rows of the last row's keys appended a block of ``block`` rows at a time
    equal those read with every row appended key by key (the layout's fast path never taken)."""
    path = tmp_path_factory.mktemp("fast") / "log.jsonl"
    path.write_text("\n".join(_stream(shape, changes, values)) + "\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columns_module, "_BLOCK_ROWS", block)
        fast = _read(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columns_module._Layout, "fits", lambda self, row, skip: False)
        slow = _read(path)
    assert fast[0] == slow[0]
    if fast[0] == "log":
        (rows, report), (rows_slow, report_slow) = fast[1], slow[1]
        assert rows == rows_slow and repr(list(rows)) == repr(list(rows_slow)) and report == report_slow
        assert [math.isnan(v) for _, row in rows for v in row.values()] == [
            math.isnan(v) for _, row in rows_slow for v in row.values()
        ]
    else:
        assert fast == slow
