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

__all__ = ["Columns"]


class _Rows(Sequence[tuple[int, dict[str, float]]]):
    """``(step, stats)`` rows read by position (:meth:`_row`): :class:`Columns` and
    :class:`~rlguard.doctor.canonical.CanonicalRows`."""

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
        self._layout: _Layout | None = None  # the keys of the last new row, where it held every key of the table

    def append(self, step: int, metrics: Mapping[str, float], skip: frozenset[str] = frozenset()) -> int:
        """Add ``metrics`` less the keys in ``skip`` (a reader's step counters) at ``step`` (>= the last step): a
        new row, or merged into the last one when ``step`` is its step. Returns the number of values replaced by a
        different one (a NaN replacing a NaN is no change)."""
        if self._n is not None:
            self._own()
        n = len(self._steps)
        layout = self._layout
        if layout is not None and layout.fits(metrics, skip) and step > self._steps[-1]:
            # a new row of the keys of the last one, in their order (the common case): its values appended to the
            # layout's block in one call (an array("d") stores each as its keys' arrays would), the kept ones moved
            # into their keys' arrays a block at a time (_Layout.flush), before any other use of the arrays
            self._steps.append(step)
            block = layout.block
            block.fromlist(list(metrics.values()))
            if len(block) >= layout.full:
                layout.flush()
            return 0
        self._settle()
        self._layout = None
        given = metrics
        if skip and not skip.isdisjoint(metrics):
            metrics = {k: v for k, v in metrics.items() if k not in skip}
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
        if metrics.keys() == columns.keys():  # the keys of the rows before
            for key, value in metrics.items():
                columns[key].append(value)
                mark = marks[key]
                if mark is not None:
                    mark.append(1)
            self._layout = _Layout.of(self, given, skip)
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
        self._settle()
        out = Columns()
        out._steps, out._values, out._present, out._n = self._steps, dict(self._values), dict(self._present), len(self)
        out.conflicts, out.conflict_steps = list(self.conflicts), self.conflict_steps
        self._shared, self._cow = len(self), set(self._values)
        return out

    def _settle(self) -> None:
        """The rows appended by the layout's fast path moved into the keys' arrays (:meth:`_Layout.flush`)."""
        if self._layout is not None:
            self._layout.flush()

    def _own(self) -> None:
        """A snapshot's rows copied into arrays of its own (before it changes)."""
        self._layout = None
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
        self._settle()
        return self._values[key], self._present[key]

    def __len__(self) -> int:
        return len(self._steps) if self._n is None else self._n

    def _row(self, i: int) -> tuple[int, dict[str, float]]:
        self._settle()
        return self._steps[i], {k: v[i] for k, v in self._values.items() if self._logged(k, i)}

    def __iter__(self) -> Iterator[tuple[int, dict[str, float]]]:
        self._settle()
        items = [(v, self._present[k], k) for k, v in self._values.items()]
        for i, step in enumerate(self.steps):
            yield step, {k: v[i] for v, present, k in items if present is None or present[i]}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Columns):  # by bytes: a NaN equals a NaN (evidence read the same way)
            self._settle()
            other._settle()
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


#: rows a layout's block holds before they are moved into the keys' arrays (a few pages: memory stays the table's)
_BLOCK_ROWS = 256


class _Layout:
    """Where the values of a row go when it holds the keys of the last new row in their order: that row's keys
    (``skip``'s too), the positions of those kept (not in ``skip``) and their arrays, and the presence bytes among
    them. Such rows are appended to :attr:`block` (row after row, every value) and the kept values moved into the
    arrays by :meth:`flush`: at :data:`_BLOCK_ROWS` rows, and before the table's arrays are read or changed otherwise
    (:meth:`Columns._settle`). Valid while the table's arrays and presence bytes are those it was taken
    from: :meth:`Columns.append` drops it on any other path (a merged row, a new key, a key missing), and a
    snapshot's copy never has one."""

    __slots__ = ("block", "columns", "full", "kept", "keys", "marks", "skip")

    def __init__(
        self,
        keys: list[str],
        kept: list[int],
        columns: list[array[float]],
        marks: list[bytearray],
        skip: frozenset[str],
    ) -> None:
        self.keys, self.kept, self.columns, self.marks, self.skip = keys, kept, columns, marks, skip
        self.block: array[float] = array("d")
        self.full = _BLOCK_ROWS * len(keys)

    def fits(self, row: Mapping[str, float], skip: frozenset[str]) -> bool:
        """Whether ``row`` holds this layout's keys in its order."""
        return skip is self.skip and list(row) == self.keys

    def flush(self) -> None:
        """The rows in :attr:`block` appended to the keys' arrays (value ``j`` of each row to column ``j``), and
        to the presence bytes as logged."""
        block, width = self.block, len(self.keys)
        if not block:
            return
        for j, column in zip(self.kept, self.columns, strict=True):
            column.extend(block[j::width])
        logged = b"\x01" * (len(block) // width)
        for mark in self.marks:
            mark.extend(logged)
        del block[:]

    @classmethod
    def of(cls, table: Columns, row: Mapping[str, float], skip: frozenset[str]) -> _Layout:
        """The layout of ``row`` (as given, ``skip``'s keys included), just appended with a value of every key of
        ``table``."""
        kept = [j for j, key in enumerate(row) if key not in skip]
        keys = list(row)
        columns = [table._values[keys[j]] for j in kept]
        marks = [mark for j in kept if (mark := table._present[keys[j]]) is not None]
        return cls(keys, kept, columns, marks, skip)
