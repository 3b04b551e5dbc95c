"""Each step's canonical stats read from a log's table (:class:`CanonicalRows`): computed from the raw rows when
read instead of held per step (the table: :mod:`rlguard.doctor.columns`)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice, repeat
from operator import getitem
from typing import Any, NamedTuple, TypeVar

import numpy as np

from rlguard.doctor.columns import Columns, _Rows
from rlguard.guards.robust import Picked
from rlguard.metrics import canonical_name, canonical_stats

__all__ = ["CanonicalRows", "NameSet", "name_sets"]

_T = TypeVar("_T")

#: the steps grouped at a time: from dicts (held while grouped), from a table's columns (numpy, 1 byte a stat a step)
_CHUNK_DICTS, _CHUNK_COLUMNS = 1024, 1 << 14
#: the rows read at a time by :meth:`CanonicalRows.iter_from` (its arrays' slices: 32 KB each)
_CHUNK_READ = 4096


class NameSet(NamedTuple):
    """Steps whose stats have the same ``names`` and are all finite numbers or not (``finite``): what the names
    alone say of a detector's observations (``Detector.observed_with``) holds for each of them.

    Attributes:
        names: the stats' names.
        finite: every value of each step is a finite number.
        size: the steps.
        stats: the steps' stats, in the order of the log, read when iterated.
    """

    names: frozenset[str]
    finite: bool
    size: int
    stats: Iterable[Mapping[str, float]]


def name_sets(rows: Iterable[Mapping[str, float]]) -> Iterator[NameSet]:
    """``rows`` (each step's stats) grouped by :class:`NameSet`, a chunk of consecutive steps at a time."""
    steps = iter(rows)
    while chunk := list(islice(steps, _CHUNK_DICTS)):
        groups: dict[tuple[frozenset[str], bool], list[Mapping[str, float]]] = {}
        for stats in chunk:
            groups.setdefault((frozenset(stats), _finite_numbers(stats.values())), []).append(stats)
        for (names, finite), members in groups.items():
            yield NameSet(names, finite, len(members), members)


def _finite_numbers(values: Iterable[Any]) -> bool:
    """Whether every one of ``values`` is a finite number."""
    for value in values:
        try:
            if not math.isfinite(value):
                return False
        except OverflowError:  # an int beyond a float's range: finite
            continue
        except (TypeError, ValueError):  # not a number
            return False
    return True


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
        for a in range(start, stop, _CHUNK_READ):
            b = min(a + _CHUNK_READ, stop)
            steps = _at(rows._steps, a, b, index)
            columns = zip(*[_at(values, a, b, index) for values in self._arrays], strict=True)  # a row's, in the plan
            if not self._sparse:  # a dict a row built in C (map, zip): the same dict as _stats builds
                yield from zip(steps, map(dict, map(zip, repeat(names), columns)), strict=True)
                continue
            for i, step, values in zip(_at(range(len(rows)), a, b, index), steps, columns, strict=True):
                yield step, self._absent(i, dict(zip(names, values, strict=True)))

    def __iter__(self) -> Iterator[tuple[int, dict[str, float]]]:
        return self.iter_from(0, len(self))

    def name_sets(self, start: int, stop: int) -> Iterator[NameSet]:
        """The steps ``self[k]`` for ``k`` in ``range(start, stop)`` grouped by :class:`NameSet`, a chunk of
        consecutive steps at a time. On a :class:`Columns` table the names and finiteness are read from the columns'
        presence and values (no step's dict is built: a group's ``stats`` are read only if iterated); each step's
        stat is the one ``_stats`` reads (the first source present by priority), so the groups are those of
        :func:`name_sets` over ``iter_from(start, stop)``."""
        if not isinstance(self._rows, Columns):
            yield from name_sets(stats for _, stats in self.iter_from(start, stop))
            return
        for a in range(start, stop, _CHUNK_COLUMNS):
            yield from self._chunk_sets(a, min(a + _CHUNK_COLUMNS, stop))

    def _chunk_sets(self, a: int, b: int) -> Iterator[NameSet]:
        """:meth:`name_sets` of the steps ``a..b`` (a chunk: one byte a stat a step)."""
        n = b - a
        at: np.ndarray[Any, Any] | None = None  # the rows' offsets from ``lo`` (None: rows lo..hi, every row kept)
        if self._index is None:
            lo, hi = a, b
        else:  # array slices are copies: no view of a growing table's arrays outlives this call
            at = np.frombuffer(self._index[a:b], dtype=np.int64)
            lo, hi = int(at[0]), int(at[-1]) + 1
            at = at - lo
        finite = np.ones(n, dtype=bool)
        always: list[str] = []  # the stats logged at every step of the chunk, those at some
        some: list[tuple[str, np.ndarray[Any, Any]]] = []
        for name in sorted(self._sources):
            logged, bad = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
            for values, present in self._sources[name]:  # highest priority first: a step's stat is the first logged
                read = ~logged if present is None else _window(present, lo, hi, at, np.uint8).astype(bool) & ~logged
                bad |= read & ~np.isfinite(_window(values, lo, hi, at, np.float64))
                logged |= read
            finite &= ~bad
            if logged.all():
                always.append(name)
            elif logged.any():
                some.append((name, logged))
        if len(some) >= 63:  # more than a code of 64 bits holds: grouped from the steps' dicts
            yield from name_sets(stats for _, stats in self.iter_from(a, b))
            return
        code = (~finite).astype(np.uint64)  # bit 0: a value not finite; bit j: the j-th of ``some`` logged
        for bit, (_, logged) in enumerate(some, 1):
            code |= logged.astype(np.uint64) << np.uint64(bit)
        if code[0] == code.min() == code.max():  # most chunks: one set of names, all finite
            yield NameSet(_names(always, some, int(code[0])), not code[0] & 1, n, self._stats_from(a, b))
            return
        keys, inverse = np.unique(code, return_inverse=True)
        order = np.argsort(inverse, kind="stable") + a  # each group's steps, in order
        sizes = np.bincount(inverse, minlength=len(keys))
        for key, end, size in zip(keys.tolist(), np.cumsum(sizes).tolist(), sizes.tolist(), strict=True):
            steps = order[end - size : end].tolist()
            yield NameSet(_names(always, some, key), not key & 1, size, (self._row(k)[1] for k in steps))

    def _stats_from(self, a: int, b: int) -> Iterator[dict[str, float]]:
        return (stats for _, stats in self.iter_from(a, b))

    def __repr__(self) -> str:
        return f"CanonicalRows({len(self)} steps)"


def _names(always: list[str], some: list[tuple[str, Any]], code: int) -> frozenset[str]:
    """The names of a step of :meth:`CanonicalRows._chunk_sets`'s ``code``."""
    return frozenset(always + [name for bit, (name, _) in enumerate(some, 1) if code >> bit & 1])


def _window(
    items: array[float] | bytearray, lo: int, hi: int, at: np.ndarray[Any, Any] | None, dtype: type[np.generic]
) -> np.ndarray[Any, Any]:
    """``items`` at rows ``lo..hi``, or at rows ``lo + at``, as a numpy array of ``dtype`` (read from a copy)."""
    window = np.frombuffer(items[lo:hi], dtype=dtype)
    return window if at is None else window[at]


def _at(items: Sequence[_T], start: int, stop: int, index: array[int] | None) -> Iterable[_T]:
    """``items`` at the rows kept from the ``start``-th to the ``stop``-th: ``items[start:stop]`` where every row is
    kept (``index`` None: a slice, copied, as array slices are; a chunk's), else at the row numbers
    ``index[start:stop]`` (a slice of the index: its rows before ``start`` are not stepped over)."""
    return items[start:stop] if index is None else map(items.__getitem__, index[start:stop])
