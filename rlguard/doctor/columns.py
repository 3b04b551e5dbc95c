"""A log's rows stored by column: the steps in an ``array('q')``, each key's values in an ``array('d')`` beside a
``bytearray`` that says on which rows the key was logged (None, no bytes, for a key logged at every row so far).

A row is 8 bytes for its step and 8 bytes per key of the log (a float64; a presence byte more for a key some rows
lack), where a row held as a dict costs about 47 bytes per key (the dict's slot and a float object;
``tests/doctor/test_columns.py``): a 1,000,000-step log of 20 keys logged at every step is about 170 MB instead of
about 1 GB. A key not logged at a step is absent from that row (never a NaN: a NaN is evidence). Rows are appended
by increasing step (the readers' order within a run, :mod:`rlguard.doctor.steps`); a row of the step of the last
one is merged into it, a later value replacing an earlier one. Read back, the table is a ``Sequence`` of
``(step, {key: value})`` built on access, as the readers gave them before.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import overload

from rlguard.guards.robust import Picked
from rlguard.metrics import canonical_name, canonical_stats

__all__ = ["CanonicalRows", "Columns"]


class _Rows(Sequence[tuple[int, dict[str, float]]]):
    """``(step, stats)`` rows read by position (:meth:`_row`): :class:`Columns` and :class:`CanonicalRows`."""

    def _row(self, i: int) -> tuple[int, dict[str, float]]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> tuple[int, dict[str, float]]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, dict[str, float]]]: ...
    def __getitem__(self, index: int | slice) -> tuple[int, dict[str, float]] | list[tuple[int, dict[str, float]]]:
        if isinstance(index, slice):
            return [self._row(k) for k in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"row {index} of {n}")
        return self._row(index % n)


class Columns(_Rows):
    """Rows ``(step, {key: value})`` by increasing step, one per step, stored by column (module docstring).

    Attributes:
        conflicts: steps at which a merged row replaced a different value of a key (the first few, and how many:
            :attr:`conflict_steps`).
    """

    def __init__(self) -> None:
        self._steps: array[int] = array("q")
        self._values: dict[str, array[float]] = {}
        #: key -> whether it was logged at each row; None: at every row
        self._present: dict[str, bytearray | None] = {}
        self.conflicts: list[int] = []
        self.conflict_steps = 0
        self._n: int | None = None  # a snapshot's rows (:meth:`copy`); None: every row of its arrays
        self._shared = 0  # the rows of this table that a snapshot shares
        self._cow: set[str] = set()  # the keys whose arrays a snapshot shares: copied before a shared row changes

    def append(self, step: int, metrics: Mapping[str, float]) -> int:
        """Add ``metrics`` at ``step`` (>= the last step): a new row, or merged into the last one when ``step`` is
        its step. Returns the number of values replaced by a different one (a NaN replacing a NaN is no change)."""
        if self._n is not None:
            self._own()
        n = len(self._steps)
        replaced = 0
        if n and self._steps[-1] == step:
            i = n - 1
            for key, value in metrics.items():
                if i < self._shared and key in self._cow:  # a snapshot reads this row: its arrays stay as they are
                    self._cow.discard(key)
                    self._values[key] = array("d", self._values[key])
                    mark = self._present[key]
                    self._present[key] = None if mark is None else bytearray(mark)
                if self._logged(key, i):
                    old = self._values[key][i]
                    if not (old == value or (math.isnan(old) and math.isnan(value))):
                        replaced += 1
                self._set(key, i, value)
            if replaced:
                self.conflict_steps += 1
                if len(self.conflicts) < 5:
                    self.conflicts.append(step)
            return replaced
        if n and step < self._steps[-1]:
            raise ValueError(f"step {step} after step {self._steps[-1]}: rows are appended by increasing step")
        self._steps.append(step)
        columns, marks = self._values, self._present
        if metrics.keys() == columns.keys():  # the common case: the keys of the rows before
            for key, value in metrics.items():
                columns[key].append(value)
                mark = marks[key]
                if mark is not None:
                    mark.append(1)
            return 0
        for key, values in self._values.items():
            if key not in metrics:
                values.append(0.0)
                mark = marks[key]
                if mark is None:  # logged at every row before this one
                    mark = marks[key] = bytearray(b"\x01") * n
                mark.append(0)
        for key, value in metrics.items():
            column = self._values.get(key)
            if column is None:
                self._values[key] = column = array("d", bytes(8 * n))
                marks[key] = bytearray(n) if n else None
            column.append(value)
            mark = marks[key]
            if mark is not None:
                mark.append(1)
        return 0

    def copy(self) -> Columns:
        """A copy that later appends to this table do not change, in time per key, not per row (``rlguard watch``
        takes one at each judgement while its follower goes on appending): a snapshot that shares this table's arrays
        and reads only its first ``len(self)`` rows. Rows appended later lie past its end; the one row an append
        changes in place (the last, merged with a record of its step) has the arrays of the keys it changes copied
        first (once per snapshot and key); appending to the snapshot copies its rows into arrays of its own first."""
        out = Columns()
        out._steps, out._values, out._present, out._n = self._steps, dict(self._values), dict(self._present), len(self)
        out.conflicts, out.conflict_steps = list(self.conflicts), self.conflict_steps
        self._shared, self._cow = len(self), set(self._values)
        return out

    def _own(self) -> None:
        """A snapshot's rows copied into arrays of its own (before it changes)."""
        n = len(self)
        self._steps = self._steps[:n]
        self._values = {k: v[:n] for k, v in self._values.items()}
        self._present = {k: None if v is None else v[:n] for k, v in self._present.items()}
        self._n = None

    def _set(self, key: str, i: int, value: float) -> None:
        column = self._values.get(key)
        if column is None:
            n = len(self._steps)
            self._values[key] = column = array("d", bytes(8 * n))
            self._present[key] = bytearray(n)
        column[i] = value
        mark = self._present[key]
        if mark is not None:
            mark[i] = 1

    def _logged(self, key: str, i: int) -> bool:
        """Whether ``key`` was logged at row ``i``."""
        if key not in self._values:
            return False
        mark = self._present[key]
        return mark is None or bool(mark[i])

    @property
    def names(self) -> set[str]:
        """Every key logged at some step (not ``keys``: ``dict(rows)`` must read the table as pairs)."""
        return set(self._values)

    @property
    def order(self) -> list[str]:
        """The keys in the order a row holds them (the order they were first logged)."""
        return list(self._values)

    @property
    def lineage(self) -> object:
        """An object that this table shares with its snapshots (:meth:`copy`) and with no other table."""
        return self._steps

    @property
    def steps(self) -> Sequence[int]:
        """The steps, increasing (the table's own array; a snapshot's first rows of it, a
        :class:`~rlguard.guards.robust.Picked`)."""
        return self._steps if self._n is None else Picked(self._steps, range(self._n))

    def column(self, key: str) -> tuple[array[float], bytearray | None]:
        """The values of ``key`` at every row and whether it was logged there (None: at every row; ``KeyError``
        for a key never logged). A snapshot's arrays may go on past its rows (:meth:`copy`): read the first
        ``len(self)``."""
        return self._values[key], self._present[key]

    def __len__(self) -> int:
        return len(self._steps) if self._n is None else self._n

    def _row(self, i: int) -> tuple[int, dict[str, float]]:
        return self._steps[i], {k: v[i] for k, v in self._values.items() if self._logged(k, i)}

    def __iter__(self) -> Iterator[tuple[int, dict[str, float]]]:
        items = [(v, self._present[k], k) for k, v in self._values.items()]
        for i, step in enumerate(self.steps):
            yield step, {k: v[i] for v, present, k in items if present is None or present[i]}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Columns):  # by bytes: a NaN equals a NaN (evidence read the same way)
            n = len(self)
            return (
                n == len(other)
                and self._steps[:n] == other._steps[:n]
                and self._present.keys() == other._present.keys()
                and all(self._marks(k) == other._marks(k) for k in self._present)
                and all(v[:n].tobytes() == other._values[k][:n].tobytes() for k, v in self._values.items())
            )
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable

    def _marks(self, key: str) -> bytes:
        """Whether ``key`` was logged at each row, a byte a row."""
        mark, n = self._present[key], len(self)
        return b"\x01" * n if mark is None else bytes(mark[:n])

    def __repr__(self) -> str:
        return f"Columns({len(self)} rows, {len(self._values)} keys)"


class CanonicalRows(_Rows):
    """Each step's canonical stats (:func:`~rlguard.metrics.canonical_stats` of its raw row under ``key_map``), for
    the steps that have at least one, computed from the raw rows when read instead of held per step.

    On a :class:`Columns` table a step's stats are read from the columns of the keys that map to a stat (each
    stat from its highest-priority key present, ties to the key first in the row: ``canonical_stats``'s rule), and
    the steps kept are those where one of those keys was logged: kept beside the table, an ``array('q')`` of row
    numbers (8 bytes a step), none where every step has a stat. Other sequences of rows are read through
    ``canonical_stats`` itself.
    """

    def __init__(
        self,
        rows: Sequence[tuple[int, Mapping[str, float]]],
        key_map: Mapping[str, str],
        previous: CanonicalRows | None = None,
    ) -> None:
        """``previous``: the stats of an earlier snapshot of the same table (``rlguard watch`` judges its growing
        table again and again): the row numbers it kept are kept, only the rows appended since are read."""
        self._rows, self._key_map = rows, dict(key_map)
        #: stat -> its keys' (values, presence), highest priority first (ties: the key first in a row)
        self._sources: dict[str, list[tuple[array[float], bytearray | None]]] = {}
        self._plan: list[tuple[str, int, array[float], bytearray | None]] = []  # mapped keys in row order
        self._index: array[int] | None = None  # row numbers kept (append only; the first `_kept`); None: every row
        self._kept = 0
        self._full: list[int] = []  # the plan's keys logged at every row (while there is one, every row is kept)
        self._single = False  # every stat has one key of the table
        if isinstance(rows, Columns):
            ranked: dict[str, list[tuple[int, int, str]]] = {}
            for pos, key in enumerate(rows.order):
                hit = canonical_name(key, self._key_map)
                if hit is not None:
                    values, present = rows.column(key)
                    self._plan.append((hit[0], hit[1], values, present))
                    ranked.setdefault(hit[0], []).append((hit[1], pos, key))
            for name, keys in ranked.items():
                self._sources[name] = [rows.column(key) for _, _, key in sorted(keys)]
            self._single = all(len(keys) == 1 for keys in ranked.values())
            self._keep(previous if previous is not None and self._extends(previous) else None)
        else:
            self._index = array("q", (i for i, (_, raw) in enumerate(rows) if canonical_stats(raw, self._key_map)))
            self._kept = len(self._index)

    def _extends(self, previous: CanonicalRows) -> bool:
        """Whether ``previous`` read a snapshot of this table's first rows (snapshots share the steps' array: it
        only grows) under the same keys."""
        before, now = previous._rows, self._rows
        return (
            isinstance(before, Columns)
            and isinstance(now, Columns)
            and before._steps is now._steps
            and len(before) <= len(now)
            and previous._key_map == self._key_map
            and [p[:2] for p in previous._plan] == [p[:2] for p in self._plan]
        )

    def _keep(self, previous: CanonicalRows | None) -> None:
        """The rows that hold a stat: every row while a mapped key was logged at each, else the row numbers of
        those where one was (``previous``'s, then the rows appended since; a row is never dropped: a merged
        record only adds keys)."""
        n = len(self._rows)  # a snapshot's arrays may go on past its rows
        start = 0 if previous is None else len(previous._rows)
        candidates = range(len(self._plan)) if previous is None else previous._full
        self._full = [j for j in candidates if (present := self._plan[j][3]) is None or present.count(0, start, n) == 0]
        if self._full:
            return
        if previous is None or previous._index is None:  # every row read (once: the index is kept from here on)
            hits = 0
            for _, _, _, present in self._plan:
                hits |= int.from_bytes((present or b"")[:n], "little")
            mask = hits.to_bytes(n, "little") if n else b""
            self._index = array("q", (i for i, b in enumerate(mask) if b))
        else:
            self._index, kept = previous._index, previous._kept
            del self._index[kept:]  # what a judgement since (never finished) added
            if not (kept and self._index[-1] == start - 1):  # the previous last row, merged since, may hold one now
                start = max(start - 1, 0)
            marks = [present for _, _, _, present in self._plan]
            self._index.extend(i for i in range(start, n) if any(m is None or m[i] for m in marks))
        self._kept = len(self._index)

    def __len__(self) -> int:
        return len(self._rows) if self._index is None else self._kept

    def _stats(self, i: int) -> dict[str, float]:
        if not isinstance(self._rows, Columns):
            return canonical_stats(self._rows[i][1], self._key_map)
        if self._single:  # one key per stat (the common case): no priorities to compare
            return {name: values[i] for name, _, values, present in self._plan if present is None or present[i]}
        best: dict[str, tuple[int, float]] = {}
        for name, priority, values, present in self._plan:
            if (present is None or present[i]) and (name not in best or priority < best[name][0]):
                best[name] = (priority, values[i])
        return {name: value for name, (_, value) in best.items()}

    @property
    def steps(self) -> Sequence[int]:
        """The steps kept, increasing (the table's own array where every row is kept)."""
        if isinstance(self._rows, Columns) and self._index is None:
            return self._rows.steps
        if isinstance(self._rows, Columns):
            return Picked(self._rows.steps, self._kept_rows())
        return [self._rows[i][0] for i in self._index or ()]

    def _kept_rows(self) -> Sequence[int]:
        """The row numbers kept (every row: a range)."""
        return range(len(self._rows)) if self._index is None else Picked(self._index, range(self._kept))

    @property
    def names(self) -> list[str]:
        """The stats logged at some step, sorted."""
        if isinstance(self._rows, Columns):
            return sorted(self._sources)
        return sorted({n for _, stats in self for n in stats})

    def series(self, name: str) -> array[float]:
        """``name`` at each step kept (NaN where the step did not log it)."""
        rows = self._kept_rows()
        out = array("d")
        sources = self._sources.get(name)
        if sources is None:
            out.extend(stats.get(name, math.nan) for _, stats in self)
            return out
        for i in rows:
            out.append(next((values[i] for values, present in sources if present is None or present[i]), math.nan))
        return out

    def value(self, name: str, k: int) -> float:
        """``name`` at the ``k``-th step kept (NaN where the step did not log it): ``series(name)[k]``, read alone."""
        if not -len(self) <= k < len(self):
            raise IndexError(f"step {k} of {len(self)}")
        k %= len(self)
        sources = self._sources.get(name)
        if sources is None:
            return self._row(k)[1].get(name, math.nan)
        i = k if self._index is None else self._index[k]
        return next((values[i] for values, present in sources if present is None or present[i]), math.nan)

    def _row(self, k: int) -> tuple[int, dict[str, float]]:
        i = k if self._index is None else self._index[k]
        return self._rows[i][0] if not isinstance(self._rows, Columns) else self._rows.steps[i], self._stats(i)

    def __iter__(self) -> Iterator[tuple[int, dict[str, float]]]:
        for k in range(len(self)):
            yield self._row(k)

    def __repr__(self) -> str:
        return f"CanonicalRows({len(self)} steps)"
