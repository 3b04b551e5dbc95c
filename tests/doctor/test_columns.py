"""The log's table kept by column (rlguard.doctor.columns.Columns) against rows kept as dicts, its memory per row,
and what merging by step refuses (two runs interleaved) or reports (a torn last line)."""

from __future__ import annotations

import json
import math
import random
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor import LogInputError, read_log
from rlguard.doctor.columns import Columns
from tests.helpers.logs_extra import jsonl_text, rows
from tests.helpers.profiles import examples

runner = CliRunner()


def _reference(records: list[tuple[int, dict[str, float]]]) -> tuple[list[tuple[int, dict[str, float]]], int]:
    """Rows merged by step as dicts (a later value replaces an earlier one) and the values replaced."""
    merged: dict[int, dict[str, float]] = {}
    replaced = 0
    for step, values in records:
        row = merged.setdefault(step, {})
        same = {k for k, v in values.items() if k in row and (row[k] == v or (math.isnan(row[k]) and math.isnan(v)))}
        replaced += sum(1 for k in values if k in row and k not in same)
        row.update(values)
    return sorted(merged.items()), replaced


def test_columns_read_back_what_dict_rows_hold() -> None:
    """Sparse keys, NaN values (evidence, never a gap), repeated steps merged, keys first seen late."""
    rng = random.Random(0)
    records: list[tuple[int, dict[str, float]]] = []
    step = 0
    for _ in range(300):
        step += rng.choice((0, 1, 1, 2))
        keys = rng.sample(["a", "b", "c", "d", "late"] if step > 100 else ["a", "b", "c"], rng.randint(1, 3))
        records.append((step, {k: rng.choice((math.nan, rng.random())) for k in keys}))
    table = Columns()
    replaced = sum(table.append(s, v) for s, v in records)
    expected, expected_replaced = _reference(records)
    got = list(table)
    assert [s for s, _ in got] == [s for s, _ in expected]
    for (_, a), (_, b) in zip(got, expected, strict=True):
        assert a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)
    assert replaced == expected_replaced
    assert (
        table[-1][0] == expected[-1][0]
        and [s for s, _ in table[5:7]] == [s for s, _ in got[5:7]]
        and table.names == {"a", "b", "c", "d", "late"}
    )
    assert table == table.copy()  # NaN values compared by their bytes: the same reading
    other = table.copy()
    other.append(table[-1][0], {"a": 12345.0})
    assert other != table
    with pytest.raises(ValueError, match="increasing step"):
        table.append(0, {"a": 1.0})


def test_a_row_costs_its_floats_not_a_dict() -> None:
    """10,000 rows of 20 keys logged at every row: about 8 + 20 * 8 bytes a row (float64s; no presence byte for a
    key no row lacks), where dicts cost about 950 bytes a row (its slots and 20 float objects)."""
    keys = [f"k{i}" for i in range(20)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    table = Columns()
    for step in range(10_000):
        table.append(step, dict.fromkeys(keys, float(step) + 0.5))
    per_row = (tracemalloc.get_traced_memory()[0] - before) / 10_000
    tracemalloc.stop()
    assert per_row < 8 + 20 * 8 + 16, per_row  # array growth slack (a presence byte per key: 8 + 20 * 9)
    assert sys.getsizeof(dict.fromkeys(keys, 0.5)) + 20 * sys.getsizeof(0.5) > 4 * per_row  # a dict and its floats


def test_a_key_missing_from_a_row_after_rows_that_had_it_reads_back_absent() -> None:
    """A key logged at every row keeps no presence bytes until a row lacks it: from then on it is absent exactly
    where it was not logged, merged rows and copies included."""
    table = Columns()
    given = [(0, {"a": 1.0, "b": 2.0}), (1, {"a": 3.0, "b": 4.0}), (2, {"a": 5.0}), (3, {"b": 6.0, "c": 7.0})]
    for step, row in given:
        table.append(step, row)
    table.append(3, {"a": 8.0})  # merged into the last row
    expected = [
        (0, {"a": 1.0, "b": 2.0}),
        (1, {"a": 3.0, "b": 4.0}),
        (2, {"a": 5.0}),
        (3, {"b": 6.0, "c": 7.0, "a": 8.0}),
    ]
    assert list(table) == expected and [table[k] for k in range(4)] == expected
    assert table.copy() == table and list(table.copy()) == expected


def test_two_runs_interleaved_without_a_run_column_are_refused(tmp_path: Path) -> None:
    """Two writers appending to one file, line by line: steps 1, 1, 2, 2, ... with different values. Merged, one
    writer's NaN at step 30 would be replaced by the other's healthy value."""
    first, second = rows(40, seed=1, nan_at=30), rows(40, seed=2)
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(r for pair in zip(first, second, strict=True) for r in pair), encoding="utf-8")
    with pytest.raises(LogInputError, match=r"40 steps \(1, 2, 3, 4, 5, \.\.\.\) are each logged twice"):
        read_log(path)


def test_one_step_logged_again_with_another_value_is_merged_and_counted(tmp_path: Path) -> None:
    """A record logged again after a restart at that step: merged, the later value kept, counted."""
    records = rows(20)
    records.insert(10, {**records[9], "loss": 9.0})
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(records), encoding="utf-8")
    log = read_log(path)
    assert log.report.overwritten == 1 and dict(log.rows)[int(records[9]["step"])]["loss"] == 9.0


def test_a_torn_last_line_is_no_clean_bill(tmp_path: Path) -> None:
    """A writer stopped mid-line: the doctor says so and exits 3 (a record unread), never 0."""
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(200)) + json.dumps(rows(201)[-1])[:30], encoding="utf-8")
    result = runner.invoke(app, ["doctor", str(path)])
    assert result.exit_code == 3, result.output
    assert "torn last line" in result.output
    path.write_text(jsonl_text(rows(200)), encoding="utf-8")
    assert runner.invoke(app, ["doctor", str(path)]).exit_code == 0


#: raw keys of one stat at several priorities (a --map, rlguard's own, a bare canonical name, TRL's, verl's), keys
#: tied in priority (rlguard/kl_ref under two namespaces), a key of no stat
_CANONICAL_KEYS = (
    "reward", "rlguard/reward_mean", "reward_mean", "critic/score/mean", "train/rlguard/kl_ref",
    "rlguard/kl_ref", "kl", "entropy", "actor/entropy", "my_stat", "epoch",
)  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_canonical_rows_equal_canonical_stats_of_every_row(seed: int) -> None:
    """CanonicalRows (stats read from the columns) equals canonical_stats of each dict row, steps without a stat
    left out: priorities, ties to the key first in the row, keys absent on some rows, NaN kept as evidence."""
    from rlguard.doctor.canonical import CanonicalRows
    from rlguard.metrics import canonical_stats

    rng = random.Random(seed)
    keys = rng.sample(_CANONICAL_KEYS, len(_CANONICAL_KEYS))  # the order keys are first logged: the row order
    key_map = {"my_stat": "grad_norm"} if seed % 2 else {}
    table = Columns()
    for step in range(1, 60):
        row = {k: rng.choice([rng.random(), math.nan]) for k in keys if rng.random() < 0.3}
        table.append(step, {"epoch": 0.5} if step % 7 == 0 else row)  # every 7th step: no stat
    expected = [(s, st) for s, raw in table if (st := canonical_stats(raw, key_map))]
    got = CanonicalRows(table, key_map)
    assert len(got) == len(expected) and len(expected) < len(table)  # some steps have no stat
    for (s1, a), (s2, b) in zip(got, expected, strict=True):
        assert s1 == s2 and list(a) == list(b)
        assert all(a[n] == b[n] or (math.isnan(a[n]) and math.isnan(b[n])) for n in a)
    assert list(got.steps) == [s for s, _ in expected]
    assert got.names == sorted({n for _, st in expected for n in st})
    for name in got.names:
        want = [st.get(name, math.nan) for _, st in expected]
        assert [repr(v) for v in got.series(name)] == [repr(v) for v in want]
    listed = CanonicalRows(list(table), key_map)  # rows as dicts: canonical_stats itself
    assert list(listed) == list(got) or all(
        s1 == s2 and list(a) == list(b) for (s1, a), (s2, b) in zip(listed, got, strict=True)
    )


_KEYS = ("a", "b", "c", "step", "late")


@examples(quick=100, long=2000)
@given(
    rows_given=st.lists(
        st.tuples(
            st.integers(0, 2),  # the step's increase (0: merged into the last row)
            st.permutations(_KEYS).flatmap(lambda keys: st.lists(st.sampled_from(keys), unique=True, max_size=5)),
            st.floats(allow_infinity=True),
            st.booleans(),  # a snapshot taken before the row
        ),
        max_size=40,
    ),
    same=st.integers(0, 8),  # rows repeating the first row's keys in its order (the layout's fast path)
)
def test_rows_appended_with_skipped_keys_read_back_as_dict_rows(
    rows_given: list[tuple[int, list[str], float, bool]], same: int
) -> None:
    """``Columns.append`` with the step counters skipped, rows of the last row's keys appended in one pass and the
    others key by key, snapshots in between: the table reads back the rows as dicts less the skipped keys, the
    values replaced counted, and every snapshot reads the rows it was taken at."""
    skip = frozenset({"step"})
    records: list[tuple[int, dict[str, float]]] = []
    step = 0
    if rows_given:
        rows_given = rows_given[:1] * same + rows_given
    table, snapshots = Columns(), []
    replaced = 0
    for k, (increase, keys, value, snap) in enumerate(rows_given):
        step += increase
        row = {key: value + i + k for i, key in enumerate(keys)}
        if not set(row) - skip:  # RunMerger drops a record of step counters alone
            continue
        if snap:
            snapshots.append((table.copy(), list(table)))
        replaced += table.append(step, row, skip)
        records.append((step, {key: v for key, v in row.items() if key not in skip}))
    expected, expected_replaced = _reference(records)
    got = list(table)
    assert [s for s, _ in got] == [s for s, _ in expected]
    for (_, a), (_, b) in zip(got, expected, strict=True):
        assert list(a) == list(b) or a.keys() == b.keys()
        assert [repr(a[key]) for key in b] == [repr(b[key]) for key in b]
    assert replaced == expected_replaced
    for snapshot, rows_then in snapshots:
        assert repr(list(snapshot)) == repr(rows_then)


def test_a_row_of_the_last_rows_keys_in_another_order_is_read_by_key() -> None:
    """The one-pass append needs the keys in the last row's order; the same keys in another order go to their own
    arrays, and a key missing after it leaves the others' arrays as they were."""
    table = Columns()
    table.append(1, {"a": 1.0, "b": 2.0, "step": 1.0}, frozenset({"step"}))
    table.append(2, {"a": 3.0, "b": 4.0, "step": 2.0}, frozenset({"step"}))
    table.append(3, {"b": 6.0, "a": 5.0, "step": 3.0}, frozenset({"step"}))
    table.append(4, {"a": 7.0, "step": 4.0}, frozenset({"step"}))
    table.append(5, {"a": 9.0, "b": 10.0, "step": 5.0}, frozenset({"step"}))
    assert list(table) == [
        (1, {"a": 1.0, "b": 2.0}),
        (2, {"a": 3.0, "b": 4.0}),
        (3, {"a": 5.0, "b": 6.0}),
        (4, {"a": 7.0}),
        (5, {"a": 9.0, "b": 10.0}),
    ]


@pytest.mark.parametrize("chunk", [3, 4096])
@pytest.mark.parametrize("seed", range(6))
def test_canonical_rows_read_in_one_pass_equal_rows_read_by_position(
    monkeypatch: pytest.MonkeyPatch, seed: int, chunk: int
) -> None:
    """``CanonicalRows.iter_from`` (the fold's reading, by chunks of rows) equals the rows read one by one, from any
    start to any stop: one key per stat, keys some rows lack or every row has, rows without a stat left out, NaN
    kept."""
    from rlguard.doctor import canonical
    from rlguard.doctor.canonical import CanonicalRows

    monkeypatch.setattr(canonical, "_CHUNK_READ", chunk)
    rng = random.Random(seed)
    keys = ["reward", "kl", "entropy", "grad_norm", "epoch"]
    table = Columns()
    share = (0.9, 0.4, 1.0)[seed % 3]  # 1.0: every row holds every key (no row left out, none lacks a stat)
    for step in range(1, 80):
        row = {k: rng.choice([rng.random(), math.nan]) for k in keys if rng.random() < share}
        table.append(step, row or {"epoch": 1.0})
    rows = CanonicalRows(table, {})
    want = [rows[k] for k in range(len(rows))]
    for start in (0, 1, len(rows) // 2, len(rows)):
        for stop in {start, min(start + 5, len(rows)), len(rows)}:
            got = list(rows.iter_from(start, stop))
            assert repr(got) == repr(want[start:stop])
    assert repr(list(rows)) == repr(want)
