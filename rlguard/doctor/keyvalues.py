"""What the doctor's mapping of keys by their values reads of a log (:func:`rlguard.doctor.keys.auto_map_refusal`,
:func:`~rlguard.doctor.keys.pick_eval_key`): for each key it asks about, a summary of the key's finite values in the
log's step records (:func:`per_step_keys`), kept up to date as rows are appended (:class:`ValueIndex`), so that
``rlguard watch`` reads at each judgement only the rows appended since the last.

A summary holds what the mapping prints and checks, computed as Python's builtins compute them on the values in row
order: their number, the first, whether another differs from it, ``min`` and ``max`` (the first of equal extremes:
``-0.0`` and ``0.0`` print differently) and, where asked, the values sorted (stable: equal values in row order) for
``statistics.median``; and the first steps at which the key was logged in any record. Memory kept: 8 bytes a value
for a key whose median is asked for (a key that looks like a canonical stat), a few numbers for any other.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from itertools import compress

from rlguard.doctor.columns import Columns
from rlguard.guards.robust import SortedBlocks

__all__ = ["KeyValues", "ValueIndex", "per_step_keys", "summarise"]

Rows = Sequence[tuple[int, Mapping[str, float]]]


def per_step_keys(counts: Mapping[str, int]) -> frozenset[str]:
    """The log's per-step keys, from the number of records that hold each key: those in at least half as many
    records as the most frequent key. A record that holds none of them (a first record of the run's arguments, a
    summary) is a configuration record; the others are step records."""
    top = max(counts.values(), default=0)
    return frozenset(k for k, n in counts.items() if 2 * n >= top)


class KeyValues:
    """A key's finite values in a log's step records, summarised (module docstring).

    Attributes:
        count: how many.
        first: the first, in row order (NaN when none).
        moved: whether some value differs from the first.
        low, high: ``min`` and ``max`` of the values (NaN when none).
        at: the first three steps at which the key was logged, in any record.
    """

    def __init__(self, values: list[float] | None = None, *, median: bool = False, at: list[int] | None = None) -> None:
        """``values``: finite values in row order; ``median``: keep them sorted (:meth:`median`)."""
        values = values or []
        self.count = len(values)
        self.first = values[0] if values else math.nan
        self.moved = values.count(self.first) != len(values)
        self.low = min(values) if values else math.nan
        self.high = max(values) if values else math.nan
        self.at = list(at or [])
        self._sorted = SortedBlocks(sorted(values)) if median else None
        self._extra: float | None = None  # one value more, after the others (a last row that may still change)

    def add(self, x: float) -> None:
        """Count the finite value ``x``, after every value counted."""
        if self.count == 0:
            self.first = self.low = self.high = x
        self.moved = self.moved or x != self.first
        self.low = x if x < self.low else self.low
        self.high = x if x > self.high else self.high
        self.count += 1
        if self._sorted is not None:
            self._sorted.add(x)

    def plus(self, x: float | None, step: int | None) -> KeyValues:
        """These values and ``x`` after them (None: no value), logged at ``step`` too (None: not logged): a copy
        that reads the same sorted values, which ``x`` is not added to."""
        out = KeyValues(at=self.at if step is None or len(self.at) >= 3 else [*self.at, step])
        out.count, out.first, out.moved, out.low, out.high = self.count, self.first, self.moved, self.low, self.high
        out._sorted = self._sorted
        if x is not None:  # counted, not added to the sorted values (the median reads it as one more)
            out._sorted = None
            out.add(x)
            out._sorted, out._extra = self._sorted, x
        return out

    def median(self) -> float:
        """``statistics.median`` of the values (NaN when none); ValueError unless kept (``median=True``)."""
        if self._sorted is None:
            raise ValueError("the median of this key's values is not kept: summarise it with median=True")
        n = self.count
        if n == 0:
            return math.nan
        extra, values = self._extra, self._sorted
        at = len(values) + 1 if extra is None else values.rank(extra)  # where the extra value sorts

        def kth(k: int) -> float:
            return values[k] if k < at else extra if k == at and extra is not None else values[k - 1]

        return kth(n // 2) if n % 2 else (kth(n // 2 - 1) + kth(n // 2)) / 2


def summarise(rows: Rows, watch: Mapping[str, bool]) -> dict[str, KeyValues]:
    """The values of each key of ``watch`` (key -> whether its median is kept) in the step records of ``rows``,
    read from the first row (:class:`ValueIndex` reads only the rows appended since its last read)."""
    return ValueIndex().read(rows, watch)


class ValueIndex:
    """The summaries of a growing table's keys (:func:`summarise`), brought up to date with the rows appended
    since the last read (``rlguard watch``'s table, read at each judgement through a snapshot of it,
    :meth:`~rlguard.doctor.columns.Columns.copy`). The rows before a snapshot's last are summarised for good (a
    row can change only while it is the table's last: a record of its step is merged into it); the last is added
    to a copy of the summaries at each read. When the per-step keys change so that a row summarised became a step
    record or stopped being one (:func:`_reclassified`), or a key is asked for that was not, the summaries are read
    again from the first row.

    What a read costs: the rows appended since the last; a change of the per-step keys adds a test by bytes of
    the rows not yet tested for that change (each changed or kept per-step key's presence read as one integer,
    kept per pair of per-step key sets: :meth:`_reclassified`), a re-read only where a row changes class. A key
    logged at about half as many records as the most frequent one is per-step at one read and not at the next; its
    rows change class only where they hold no other per-step key (records of their own: then each such change
    re-reads, by bytes, every row)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lineage: object = None  # the table read (:attr:`Columns.lineage`)
        self._done = 0  # rows summarised for good
        self._counts: dict[str, int] = {}  # records holding each key, among the rows done
        self._per_step: frozenset[str] = frozenset()  # the per-step keys the rows done were sorted by
        self._whole: str | None = None  # a per-step key logged at every row done (every one a step record)
        self._watch: dict[str, bool] = {}
        self._values: dict[str, KeyValues] | None = None  # None: none read yet
        #: two sets of per-step keys -> the first rows found to be of the same class under both
        self._same: dict[frozenset[frozenset[str]], int] = {}

    def read(self, rows: Rows, watch: Mapping[str, bool]) -> dict[str, KeyValues]:
        """The summaries of the keys of ``watch`` (key -> whether its median is kept) in ``rows``, a table that
        extends the one last read (else read from its first row)."""
        if not isinstance(rows, Columns):
            return _read_rows(rows, watch)
        n = len(rows)
        if rows.lineage is not self._lineage or n < self._done or dict(watch) != self._watch:
            self._reset()
            self._lineage, self._watch = rows.lineage, dict(watch)
        end = max(n - 1, 0)  # the last row may still change: not summarised for good
        columns = {k: rows.column(k) for k in rows.names}
        for k, (_, present) in columns.items():
            logged = end - self._done if present is None else present.count(1, self._done, end)
            self._counts[k] = self._counts.get(k, 0) + logged
        last = {k for k, (_, present) in columns.items() if n and (present is None or present[n - 1])}
        per_step = per_step_keys({k: c + (k in last) for k, c in self._counts.items()})
        if self._values is None or (
            per_step != self._per_step and self._whole not in per_step and self._reclassified(columns, per_step)
        ):
            self._values = {k: _bulk(rows, columns, per_step, k, end, median) for k, median in self._watch.items()}
        else:
            self._append(rows, columns, per_step, self._values, self._done, end)
        self._done, self._per_step = end, per_step
        self._whole = next((k for k in sorted(per_step) if columns[k][1] is None), None)
        if not n:
            return dict(self._values)
        step = rows.steps[n - 1]
        is_step = any(columns[k][1] is None or columns[k][1][n - 1] for k in per_step)  # type: ignore[index]
        out = {}
        for k, summary in self._values.items():
            if k not in last:
                out[k] = summary
                continue
            x = columns[k][0][n - 1]
            out[k] = summary.plus(x if is_step and math.isfinite(x) else None, step)
        return out

    def _reclassified(
        self, columns: Mapping[str, tuple[array[float], bytearray | None]], after: frozenset[str]
    ) -> bool:
        """Whether a row done changes class from the per-step keys of the rows done to ``after``
        (:func:`_reclassified`), testing only the rows not yet found the same for these two sets (a key at about
        every other record makes the per-step keys go back and forth between two)."""
        pair = frozenset((self._per_step, after))
        start = self._same.get(pair, 0)
        if _reclassified(columns, self._per_step, after, start, self._done):
            return True
        self._same[pair] = self._done
        return False

    def _append(
        self,
        rows: Columns,
        columns: Mapping[str, tuple[array[float], bytearray | None]],
        per_step: frozenset[str],
        summaries: Mapping[str, KeyValues],
        start: int,
        end: int,
    ) -> None:
        """Add rows ``start`` to ``end`` (excluded) to the summaries."""
        marks = [columns[k][1] for k in sorted(per_step)]
        every = any(m is None for m in marks)
        steps = rows.steps
        for k in self._watch:
            if k not in columns:
                continue
            values, present = columns[k]
            summary = summaries[k]
            for i in range(start, end):
                if present is not None and not present[i]:
                    continue
                if len(summary.at) < 3:
                    summary.at.append(steps[i])
                x = values[i]
                if math.isfinite(x) and (every or any(m[i] for m in marks)):  # type: ignore[index]
                    summary.add(x)


def _reclassified(
    columns: Mapping[str, tuple[array[float], bytearray | None]],
    before: frozenset[str],
    after: frozenset[str],
    start: int,
    done: int,
) -> bool:
    """Whether one of rows ``start`` to ``done`` (excluded) is a step record under the per-step keys ``before`` and
    not under ``after`` or the other way: it holds a key of one set only and none of both (:func:`per_step_keys`)."""
    every = int.from_bytes(b"\x01" * (done - start), "little")

    def rows_holding(keys: frozenset[str]) -> int:
        """The rows that hold one of ``keys``: a byte a row, 1 where it does."""
        mask = 0
        for k in keys:
            mark = columns[k][1] if k in columns else None
            if k in columns and mark is None:
                return every
            if mark is not None:
                mask |= int.from_bytes(mark[start:done], "little")
        return mask

    return bool(rows_holding(before ^ after) & (every ^ rows_holding(before & after)))


def _bulk(
    rows: Columns,
    columns: Mapping[str, tuple[array[float], bytearray | None]],
    per_step: frozenset[str],
    key: str,
    end: int,
    median: bool,
) -> KeyValues:
    """The summary of ``key`` over the first ``end`` rows of ``rows``, read at once."""
    if key not in columns:
        return KeyValues(median=median)
    values, present = columns[key]
    mask: int | None = None  # the step records (None: every row)
    for k in per_step:
        mark = columns[k][1]
        if mark is None:
            mask = None
            break
        mask = (mask or 0) | int.from_bytes(mark[:end], "little")
    if present is not None:
        mine = int.from_bytes(present[:end], "little")
        mask = mine if mask is None else mask & mine
    picked = values[:end] if mask is None else compress(values[:end], mask.to_bytes(end, "little"))
    steps = rows.steps
    if present is None:
        at = [steps[i] for i in range(min(end, 3))]
    else:
        at, i = [], -1
        while len(at) < 3 and (i := present.find(1, i + 1, end)) >= 0:
            at.append(steps[i])
    return KeyValues([x for x in picked if math.isfinite(x)], median=median, at=at)


def _read_rows(rows: Rows, watch: Mapping[str, bool]) -> dict[str, KeyValues]:
    """:meth:`ValueIndex.read` of rows that are not a :class:`Columns` table: read whole, each time."""
    counts: dict[str, int] = {}
    for _, r in rows:
        for k in r:
            counts[k] = counts.get(k, 0) + 1
    per_step = per_step_keys(counts)
    out = {k: KeyValues(median=median) for k, median in watch.items()}
    for step, r in rows:
        is_step = not per_step.isdisjoint(r.keys())
        for k, summary in out.items():
            if k in r:
                if len(summary.at) < 3:
                    summary.at.append(step)
                if is_step and math.isfinite(r[k]):
                    summary.add(r[k])
    return out
