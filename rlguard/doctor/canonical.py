"""Each step's canonical stats read from a log's table (:class:`CanonicalRows`): computed from the raw rows when
read instead of held per step (the table: :mod:`rlguard.doctor.columns`)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice, repeat
from operator import getitem
from typing import TypeVar

from rlguard.doctor.columns import Columns, _Rows
from rlguard.guards.robust import Picked
from rlguard.metrics import canonical_name, canonical_stats

__all__ = ["CanonicalRows"]

_T = TypeVar("_T")


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
        self._names: list[str] = []  # with one key per stat: the plan's stats, their arrays, and the stats some
        self._arrays: list[array[float]] = []  # rows lack with their presence
        self._sparse: list[tuple[str, bytearray]] = []
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
            self._names = [name for name, _, _, _ in self._plan]
            self._arrays = [values for _, _, values, _ in self._plan]
            self._sparse = [(name, present) for name, _, _, present in self._plan if present is not None]
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
            return self._absent(i, dict(zip(self._names, map(getitem, self._arrays, repeat(i)), strict=True)))
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

    def _absent(self, i: int, stats: dict[str, float]) -> dict[str, float]:
        """``stats``, every stat's value at row ``i`` in the plan's order, less those not logged there (the order
        of the rest kept)."""
        for name, present in self._sparse:
            if not present[i]:
                del stats[name]
        return stats

    def iter_from(self, start: int, stop: int) -> Iterator[tuple[int, dict[str, float]]]:
        """``self[k]`` for ``k`` in ``range(start, stop)`` (within ``0..len(self)``), read in one pass: the fold
        reads the steps in order, each row's values taken from the arrays as ``_stats`` takes them."""
        rows = self._rows
        if not (isinstance(rows, Columns) and self._single and self._plan):
            for k in range(start, stop):
                yield self._row(k)
            return
        index, names = self._index, self._names
        steps = _at(rows._steps, start, stop, index)
        columns = zip(*(_at(values, start, stop, index) for values in self._arrays), strict=True)
        if not self._sparse:
            for step, values in zip(steps, columns, strict=True):
                yield step, dict(zip(names, values, strict=True))
            return
        for i, step, values in zip(_at(range(len(rows)), start, stop, index), steps, columns, strict=True):
            yield step, self._absent(i, dict(zip(names, values, strict=True)))

    def __iter__(self) -> Iterator[tuple[int, dict[str, float]]]:
        return self.iter_from(0, len(self))

    def __repr__(self) -> str:
        return f"CanonicalRows({len(self)} steps)"


def _at(items: Sequence[_T], start: int, stop: int, index: array[int] | None) -> Iterator[_T]:
    """``items`` at the rows kept from the ``start``-th to the ``stop``-th: ``items[start:stop]`` where every row is
    kept (``index`` None), else at the row numbers ``index[start:stop]``; read in place."""
    return islice(items, start, stop) if index is None else map(items.__getitem__, islice(index, start, stop))
