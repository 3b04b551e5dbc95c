"""What the mapping of keys by their values reads of a log (:mod:`rlguard.doctor.keyvalues`): the summaries kept up to
date as rows are appended equal, at each read, what reading every row gives: the values of each key in the step
records (``keys.step_records``), their number, first, min, max (the first of equal extremes: ``-0.0`` and ``0.0``
print differently), whether they moved, their median (``statistics.median``), and the first steps the key was logged
at; and so the keys mapped, refused and their printed evidence. On random logs grown in random chunks (records
merged into the last row, keys that cross the per-step boundary, NaN, infinities, signed zeros) and on the real logs
of ``../shared`` read in place."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlguard.doctor.columns import Columns
from rlguard.doctor.keys import KeyReport, classify_keys, eval_direction, step_records, suggest_canonical
from rlguard.doctor.keyvalues import KeyValues, ValueIndex
from rlguard.doctor.readers import LogInputError, read_log
from tests.helpers.profiles import examples

#: ``shared/`` beside the checkout or an ancestor of it (as tests/doctor/test_fold.py finds it)
SHARED = next(
    (p / "shared" for p in Path(__file__).resolve().parents if (p / "shared" / "doctor_foreign").is_dir()),
    Path("/nonexistent/shared"),
)

Rows = Sequence[tuple[int, Mapping[str, float]]]


def _from_every_row(rows: Rows, key: str) -> tuple[object, ...]:
    """What the mapping reads of ``key``, from every row, by the definitions (``repr``: a signed zero is told)."""
    values = [r[key] for r in step_records(rows) if key in r and math.isfinite(r[key])]
    at = [step for step, r in rows if key in r][:3]
    if not values:
        return (0, at)
    median = statistics.median(values)
    return tuple(map(repr, (len(values), values[0], len(set(values)) > 1, min(values), max(values), at, median)))


def _read(v: KeyValues) -> tuple[object, ...]:
    if not v.count:
        return (0, v.at)
    return tuple(map(repr, (v.count, v.first, v.moved, v.low, v.high, v.at, v.median())))


def _report(r: KeyReport) -> tuple[object, ...]:
    return (r.mapped, r.known, r.unrecognised, r.suggestions, r.auto_mapped, r.evidence, r.refused)


#: keys the rules read (a stat by its words, evaluation keys, a configuration key) and keys they do not
KEYS = ("reward_avg", "policy_ratio", "eval_accuracy", "test_loss", "args/kl_coef", "kl_value", "other", "loss")
VALUES = st.sampled_from([0.0, -0.0, 0.5, 1.5, -2.0, 3.0, math.nan, math.inf])
#: the records of a log: a step's stats, an evaluation or a configuration record of its own, or any keys at all
TEMPLATES = (
    ("loss", "reward_avg", "policy_ratio"),
    ("loss", "kl_value"),
    ("eval_accuracy", "test_loss"),
    ("args/kl_coef", "other"),
    ("reward_avg",),
)
RECORDS = st.one_of(
    st.sampled_from(TEMPLATES).flatmap(lambda keys: st.fixed_dictionaries(dict.fromkeys(keys, VALUES))),
    st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1),
)


@given(
    chunks=st.lists(
        st.lists(
            st.tuples(st.integers(0, 2), RECORDS),
            min_size=1,
            max_size=6,
        ),
        min_size=1,
        max_size=12,
    )
)
@examples(quick=200, long=2000)
def test_the_summaries_kept_equal_a_reading_of_every_row(
    chunks: list[list[tuple[int, dict[str, float]]]],
) -> None:
    """Records appended in chunks (a step forward of 0 merges a record into the last row), read after each chunk
    through a snapshot by one index: equal to the definitions on every row, and the keys mapped, refused and their
    evidence equal to those of a reading from scratch (of a new table and of the rows as dicts)."""
    table, index, step = Columns(), ValueIndex(), 0
    watch = dict.fromkeys(KEYS, True)  # every summary's median kept (to be compared)
    report_index = ValueIndex()
    for chunk in chunks:
        for forward, record in chunk:
            step += forward if len(table) else 1
            table.append(step, record)
        snapshot = table.copy()
        rows = [(s, dict(r)) for s, r in snapshot]
        got = index.read(snapshot, watch)
        assert {k: _read(v) for k, v in got.items()} == {k: _from_every_row(rows, k) for k in KEYS}
        kept = classify_keys(snapshot.names, rows=snapshot, index=report_index)
        assert _report(kept) == _report(classify_keys(snapshot.names, rows=rows))
        assert _report(kept) == _report(classify_keys(snapshot.names, rows=table.copy()))


def test_a_table_read_again_from_its_start_is_not_read_as_an_extension() -> None:
    """An index that read one table reads another (a log rotated or truncated is read into a new table) from its
    first row."""
    index, first, second = ValueIndex(), Columns(), Columns()
    for step in range(1, 6):
        first.append(step, {"eval_accuracy": 0.1 * step, "loss": 1.0})
        second.append(step, {"eval_accuracy": 0.5, "loss": 1.0})
    assert index.read(first.copy(), {"eval_accuracy": False})["eval_accuracy"].moved
    assert not index.read(second.copy(), {"eval_accuracy": False})["eval_accuracy"].moved


def _real_logs() -> list[Path]:
    return sorted(p for d in ("doctor_foreign", "doctor_foreign2") for p in (SHARED / d).glob("*") if p.suffix != ".md")


@pytest.mark.skipif(not _real_logs(), reason="needs ../shared/doctor_foreign")
@pytest.mark.parametrize("path", _real_logs(), ids=lambda p: p.name)
def test_the_summaries_of_a_real_log_grown_row_by_row_equal_a_reading_of_every_row(path: Path) -> None:
    """Each real log's rows appended in 25 chunks: at each, every key the rules read (a stat by its words, an
    evaluation key) summarised as from every row, and the keys mapped and refused as from scratch."""
    try:
        log = read_log(path)
    except LogInputError:
        pytest.skip(f"{path.name} is not read as a log")
    names = sorted(log.keys)
    watch = {k: True for k in names if suggest_canonical(k) or eval_direction(k)}
    rows = list(log.rows)
    table, index, report_index = Columns(), ValueIndex(), ValueIndex()
    cuts = sorted({*range(1, len(rows), max(len(rows) // 25, 1)), len(rows)})
    at = 0
    for cut in cuts:
        for step, row in rows[at:cut]:
            table.append(step, row)
        at = cut
        snapshot, prefix = table.copy(), rows[:cut]
        got = index.read(snapshot, watch)
        assert {k: _read(v) for k, v in got.items()} == {k: _from_every_row(prefix, k) for k in watch}, cut
        kept = classify_keys(snapshot.names, rows=snapshot, index=report_index)
        assert _report(kept) == _report(classify_keys(snapshot.names, rows=prefix)), cut


def test_a_key_at_every_other_record_does_not_have_every_row_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """No key at every row (a first record of the run's arguments) and an evaluation key at every other step: the
    evaluation key is per-step when its records are half the most frequent key's or more, so it comes and goes
    with the parity of the rows. Its rows do not change class (each holds the step's stats too): past the first
    reads (where the arguments' record stops being read as a step's), no read reads every row again (before: every
    other read did), and the summaries equal a reading of every row at each read."""
    from rlguard.doctor import keyvalues

    bulk_rows = [0]
    bulk = keyvalues._bulk

    def counted(rows: Columns, *args: object) -> KeyValues:
        bulk_rows[0] += len(rows)
        return bulk(rows, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(keyvalues, "_bulk", counted)
    table, index = Columns(), ValueIndex()
    table.append(0, {"args/kl_coef": 0.1})
    watch = {"eval_accuracy": True, "reward_avg": True}
    per_read = []
    for step in range(1, 201):
        table.append(
            step, {"reward_avg": 0.01 * step, "loss": 1.0, **({"eval_accuracy": 0.5} if step % 2 == 0 else {})}
        )
        before = bulk_rows[0]
        snapshot = table.copy()
        got = index.read(snapshot, watch)
        per_read.append(bulk_rows[0] - before)
        rows = [(s, dict(r)) for s, r in snapshot]
        assert {k: _read(v) for k, v in got.items()} == {k: _from_every_row(rows, k) for k in watch}
    assert sum(per_read[10:]) == 0, per_read


def test_rows_that_change_class_are_read_again() -> None:
    """Records of their own whose key is per-step at one read and not at the next (a key in a third of the records,
    the most frequent in two thirds): its rows are step records, then not, and the summaries follow."""
    table, index = Columns(), ValueIndex()
    watch = {"eval_accuracy": True, "reward_avg": True}
    for step in range(1, 61):
        table.append(step, {"eval_accuracy": 0.01 * step} if step % 3 == 0 else {"reward_avg": 0.5, "loss": 1.0})
        snapshot = table.copy()
        rows = [(s, dict(r)) for s, r in snapshot]
        got = index.read(snapshot, watch)
        assert {k: _read(v) for k, v in got.items()} == {k: _from_every_row(rows, k) for k in watch}
