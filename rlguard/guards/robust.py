"""Robust statistics for detectors: rolling median/MAD, CUSUM and the Mann-Kendall trend test."""

from __future__ import annotations

import functools
import math
import statistics
from array import array
from bisect import bisect_left, bisect_right, insort, insort_right
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from math import isfinite
from typing import overload

#: MAD * 1.4826 estimates the standard deviation of a normal distribution.
MAD_TO_SIGMA = 1.4826
#: mean absolute deviation * sqrt(pi / 2) estimates the standard deviation of a normal distribution.
MEAN_AD_TO_SIGMA = math.sqrt(math.pi / 2)


def median_of(values: Iterable[float]) -> float:
    """Median of ``values`` (the mean of the two middle ones for an even count; NaN when empty), sorted from
    scratch: the definition that :class:`RollingWindow` reads incrementally."""
    s = sorted(values)
    n = len(s)
    if n == 0:
        return math.nan
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _sorted_median(s: list[float]) -> float:
    n = len(s)
    if n == 0:
        return math.nan
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _sorted_mad(s: list[float], med: float) -> float:
    """Median of ``|x - med|`` over the sorted values ``s`` in O(log n), without sorting: the deviations of the
    values at or below ``med``, read downwards, and of those above it, read upwards, are two sorted runs; the
    order statistics of their merge are found by bisecting how many come from the first run. A deviation is
    ``med - x`` below ``med`` and ``x - med`` above it: ``abs(x - med)`` exactly (IEEE subtraction is rounded
    symmetrically, ``fl(a - b) = -fl(b - a)``), but for the sign of a zero (``-0.0`` for ``x = 0.0`` at a median
    of ``-0.0``), which compares equal: a MAD of 0 is replaced by the mean deviation (:meth:`RollingWindow.sigma`)."""
    n = len(s)
    if n == 0:
        return math.nan
    m = bisect_right(s, med)  # s[:m] <= med < s[m:]; the i-th low deviation is med - s[m - 1 - i], the j-th
    p, q = m, n - m  # high one s[m + j] - med (inlined, max and min as their comparisons: the detectors' hot path)
    k = n // 2 if n % 2 else n // 2 - 1  # the (0-based) order statistic wanted, and the next one if n is even
    lo, hi = (k + 1 - q if k + 1 - q > 0 else 0), (p if p < k + 1 else k + 1)
    while lo < hi:  # the fewest taken from the low run such that the next low one is not below the last high one
        i = (lo + hi) // 2
        if s[m + k - i] - med <= med - s[m - 1 - i]:
            hi = i
        else:
            lo = i + 1
    i, j = lo, k + 1 - lo
    if i == 0:
        kth = s[m + j - 1] - med
    elif j == 0:
        kth = med - s[m - i]
    else:
        kth = high if (high := s[m + j - 1] - med) > (low := med - s[m - i]) else low
    if n % 2:
        return kth
    if i == p:
        after = s[m + j] - med
    elif j == q:
        after = med - s[m - 1 - i]
    else:
        after = high if (high := s[m + j] - med) < (low := med - s[m - 1 - i]) else low
    return 0.5 * (kth + after)


class EarlySorted:
    """``sorted(values)`` of an early baseline, a list that only grows by appends, and its median: sorted again only
    when it grew or is another list (a restored state), not at every step that reads it (kept beside a detector's
    state)."""

    __slots__ = ("_median", "_n", "_of", "_sorted")

    def __init__(self) -> None:
        self._of: list[float] | None = None
        self._n = -1
        self._sorted: list[float] = []
        self._median = math.nan

    def __call__(self, values: list[float]) -> list[float]:
        if values is not self._of or len(values) != self._n:
            self._of, self._n, self._sorted = values, len(values), sorted(values)
            self._median = _sorted_median(self._sorted)
        return self._sorted

    def median(self, values: list[float]) -> float:
        """:func:`median_of` ``values``, from the sorted copy."""
        if values is not self._of or len(values) != self._n:
            self(values)
        return self._median


class RollingWindow:
    """The last ``size`` values, with robust location and scale (cached until the next push).

    The window keeps its values sorted beside their order of arrival (``bisect``: O(log w) search, a memmove of
    at most w pointers per push), so the median is read in O(1) and the MAD in O(log w). The sorted list is
    exactly ``sorted(values)`` (equal values in their order of arrival), so every statistic equals the one
    computed from scratch by :func:`median_of`. It is kept up to date by a push only where the window was read
    since the push before (a baseline read at every step); a window pushed to without being read (a detector's
    reward level, read at a finding) sorts its values again at the next read. A window built from values that are
    not all finite (restored state) is judged from scratch until those values have left it."""

    __slots__ = ("_cache", "_keep", "_nonfinite", "_sorted", "_stale", "_trend", "pushes", "values")

    def __init__(self, size: int, values: Iterable[float] = ()) -> None:
        if size < 1:
            raise ValueError(f"window size must be >= 1; got {size}.")
        self.values: deque[float] = deque(values, maxlen=size)
        self._nonfinite = len(self.values) - sum(map(math.isfinite, self.values))
        self._sorted: list[float] = sorted(self.values) if not self._nonfinite else []
        self._cache: tuple[float, float] | None = None
        #: values accepted by :meth:`push` so far (a window that has not changed has the same count)
        self.pushes = 0
        self._trend: int | None = None  # Mann-Kendall's sum of signs, kept up to date once first asked for
        # the next push keeps the sorted list up to date: a finite window read since the last push, or whose trend
        # is kept (the sorted list is then never stale)
        self._keep = False
        self._stale = False  # the sorted list lags the values (pushes without a read): sorted again when read

    def __len__(self) -> int:
        return len(self.values)

    @property
    def finite(self) -> bool:
        """Whether every value in the window is finite (a window restored from state may hold others)."""
        return not self._nonfinite

    def push(self, value: float) -> None:
        """Append ``value`` (finite values only; others are ignored)."""
        if not isfinite(value):
            return
        values = self.values
        if self._keep:
            ordered, trend = self._sorted, self._trend
            if len(values) == values.maxlen:  # the oldest of equal values is the first of them in the sorted list
                oldest = values[0]
                at = bisect_left(ordered, oldest)
                if trend is not None:  # the oldest's pairs with each later value leave the sum of signs
                    trend -= len(ordered) - bisect_right(ordered, oldest) - at
                del ordered[at]
            if trend is None:
                self._keep = False  # kept again by the next read
            else:  # the new value's pairs with each earlier one join the sum
                self._trend = trend + bisect_left(ordered, value) - (len(ordered) - bisect_right(ordered, value))
            values.append(value)
            insort(ordered, value)  # after the equal values already there: their order of arrival
        elif self._nonfinite:
            if len(values) == values.maxlen and not isfinite(values[0]):
                self._nonfinite -= 1
            values.append(value)
            if not self._nonfinite:  # the last non-finite value just left: sorted at the next read
                self._stale = True
        else:
            values.append(value)  # not read since the last push: the sorted list waits for the next read
            self._stale = True
        self._cache = None
        self.pushes += 1

    def _ordered(self) -> list[float]:
        """The sorted values of a finite window, sorted again if pushes left them behind; marks the window read."""
        if self._stale:
            self._sorted, self._stale = sorted(self.values), False
        self._keep = True
        return self._sorted

    def median(self) -> float:
        """Median of the window (NaN when empty)."""
        cache = self._cache
        if cache is not None:
            return cache[0]
        if self._nonfinite:
            return median_of(self.values)
        if self._stale:
            return _sorted_median(self._ordered())
        self._keep = True  # read: the next push keeps the sorted list (what _ordered does, inlined: a hot path)
        s = self._sorted  # _sorted_median, inlined (the detectors read a median at every step)
        n = len(s)
        if n % 2:
            return s[n // 2]
        return 0.5 * (s[n // 2 - 1] + s[n // 2]) if n else math.nan

    def sigma(self, floor: float = 0.0) -> float:
        """Robust standard deviation ``1.4826 * MAD`` (``sqrt(pi/2) * mean |x - median|`` where the MAD is 0 but
        the values are not all equal), at least ``floor``."""
        if not self.values:
            return floor
        return max(self.location_scale()[1], floor)

    def location_scale(self) -> tuple[float, float]:
        """The median and the robust sigma (unfloored) at once: what :meth:`median` and :meth:`sigma` read (NaN for
        an empty window)."""
        cache = self._cache
        if cache is not None:
            return cache
        values = self.values
        if self._nonfinite:
            med = median_of(values)
            mad = median_of([abs(v - med) for v in values])
        else:
            ordered = self._ordered()
            med = _sorted_median(ordered)
            mad = _sorted_mad(ordered, med)
        sigma = MAD_TO_SIGMA * mad
        if sigma == 0.0 and values:
            # quantized values (rewards of 8 samples: 0, 1/8, ...) often have MAD = 0 although they vary; the
            # mean absolute deviation x sqrt(pi/2) also estimates sigma (normal) and is 0 only for constants
            deviations = [abs(v - med) for v in values]
            sigma = MEAN_AD_TO_SIGMA * sum(deviations) / len(deviations)
        self._cache = cache = (med, sigma)
        return cache

    def robust_z(self, value: float, floor: float) -> float:
        """``(value - median) / max(sigma, floor)``."""
        if not self.values:
            return (value - self.median()) / self.sigma(floor)
        median, sigma = self.location_scale()  # both at once: the median is the one :meth:`median` reads
        return (value - median) / max(sigma, floor)

    def mann_kendall_z(self) -> float:
        """:func:`mann_kendall_z` of the window's values in their order of arrival, equal to it: the sum of signs
        is kept up to date by :meth:`push` once first asked for (O(log w) a push: the pairs of the value leaving
        and of the value arriving, counted in the sorted values), the statistic read from it."""
        if self._nonfinite:
            self._trend = None
            return mann_kendall_z(self.values)
        if self._trend is None:  # kept from now on by each push, which needs the sorted values up to date
            self._ordered()
            self._trend = _sign_sum(self.values)
        return _mann_kendall(self._trend, len(self.values))


class SortedBlocks:
    """A multiset of floats kept sorted in blocks of ``load`` to ``2 * load`` values: an insertion or a removal moves
    one block, not every value; the ``k``-th smallest walks the blocks (``n / load`` steps). Equal values stay in the
    order they were added, as a stable sort leaves them (``-0.0`` and ``0.0`` compare equal and print differently).
    Memory: 8 bytes a value."""

    def __init__(self, ordered: Sequence[float] = (), load: int = 1024) -> None:
        """``ordered``: values already sorted (stable)."""
        if load < 1:
            raise ValueError(f"load must be >= 1; got {load}.")
        self.load = load
        self._blocks = [array("d", ordered[i : i + load]) for i in range(0, len(ordered), load)]
        self._maxes = [b[-1] for b in self._blocks]  # each block's largest, increasing
        self._n = len(ordered)

    def __len__(self) -> int:
        return self._n

    def add(self, x: float) -> None:
        """Insert ``x`` after every value equal to it."""
        self._n += 1
        if not self._blocks:
            self._blocks, self._maxes = [array("d", [x])], [x]
            return
        b = min(bisect_right(self._maxes, x), len(self._blocks) - 1)  # the first block with a greater value
        block = self._blocks[b]
        insort_right(block, x)
        self._maxes[b] = block[-1]
        if len(block) > 2 * self.load:
            self._blocks[b : b + 1] = [block[: self.load], block[self.load :]]
            self._maxes[b : b + 1] = [block[self.load - 1], block[-1]]

    def extend(self, values: Sequence[float]) -> None:
        """Insert each of ``values``, in order: sorted at once into blocks where the multiset is empty."""
        if self._blocks or len(values) < self.load:
            for x in values:
                self.add(x)
            return
        self.__init__(sorted(values), self.load)  # type: ignore[misc]

    def remove(self, x: float) -> None:
        """Remove one value equal to ``x``; ``ValueError`` when none is."""
        b = bisect_left(self._maxes, x)
        block = self._blocks[b] if b < len(self._blocks) else array("d")
        i = bisect_left(block, x)
        if i == len(block) or block[i] != x:
            raise ValueError(f"{x!r} is not in the multiset")
        del block[i]
        self._n -= 1
        if block:
            self._maxes[b] = block[-1]
        else:
            del self._blocks[b], self._maxes[b]

    def rank(self, x: float) -> int:
        """The number of values <= ``x``."""
        b = bisect_right(self._maxes, x)
        return sum(map(len, self._blocks[:b])) + (bisect_right(self._blocks[b], x) if b < len(self._blocks) else 0)

    def __getitem__(self, k: int) -> float:
        """The ``k``-th smallest (from 0)."""
        for block in self._blocks:
            if k < len(block):
                return block[k]
            k -= len(block)
        raise IndexError(k)


class Picked(Sequence[int]):
    """``items[i]`` for each ``i`` of ``index``, read in place, never copied: a snapshot's steps (the first rows of
    an array that goes on growing, ``rlguard.doctor.columns.Columns.copy``), the steps of the rows that hold a stat,
    the steps at a detector's observed positions (``rlguard.guards.consequence.excursions``)."""

    def __init__(self, items: Sequence[int], index: Sequence[int]) -> None:
        self._items, self._index = items, index

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def __getitem__(self, k: int) -> int: ...
    @overload
    def __getitem__(self, k: slice) -> list[int]: ...
    def __getitem__(self, k: int | slice) -> int | list[int]:
        if isinstance(k, slice):
            return [self._items[i] for i in self._index[k]]
        return self._items[self._index[k]]

    def __iter__(self) -> Iterator[int]:
        return map(self._items.__getitem__, self._index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # reads a mutable array

    def __repr__(self) -> str:
        return f"Picked({len(self)} of {len(self._items)})"


def _sign_sum(x: Sequence[float]) -> int:
    """Mann-Kendall's ``S``: the sum of ``sign(x_j - x_i)`` over the pairs ``i < j`` of finite ``x``, in
    O(n log n): each value against the earlier ones, counted in their sorted list."""
    seen: list[float] = []
    total = 0
    for b in x:
        below, above = bisect_left(seen, b), bisect_right(seen, b)
        total += below - (len(seen) - above)
        seen.insert(above, b)
    return total


def _mann_kendall(s: float, n: int) -> float:
    """The normal approximation of Mann-Kendall's ``S`` over ``n`` values (no tie correction)."""
    if n < 3:
        return 0.0
    var = n * (n - 1) * (2 * n + 5) / 18.0
    if s == 0:
        return 0.0
    return (s - math.copysign(1.0, s)) / math.sqrt(var)


def mann_kendall_z(values: Sequence[float]) -> float:
    """Mann-Kendall trend statistic (normal approximation, no tie correction): > 2 means a rising trend at about
    the 5% level, < -2 a falling one (Mann 1945; Kendall 1975). 0 for fewer than 3 values."""
    # pure Python: exact (a sum of signs), faster than numpy for the trend windows used (about 30 values), and the
    # doctor and the command line start without numpy
    x = list(values)
    n = len(x)
    if n < 3:
        return 0.0
    if any(v != v for v in x):  # NaN: not ordered, every pair with it counts 0
        s = float(sum((b > a) - (b < a) for i, a in enumerate(x) for b in x[i + 1 :]))
    else:
        s = float(_sign_sum(x))
    return _mann_kendall(s, n)


def cusum_step(statistic: float, z: float, slack: float) -> float:
    """One step of the one-sided (upward) CUSUM of Page (1954): ``S = max(0, S + z - k)`` (max's comparison)."""
    return s if (s := statistic + z - slack) > 0.0 else 0.0


@functools.lru_cache(maxsize=4)  # a detector asks twice a step for one n: its level judged, then taken
def expected_maximum(n: int) -> float:
    """The expected largest of ``n`` independent standard normal values (0 for ``n <= 1``), by Blom's approximation
    ``Phi^-1((n - 0.375) / (n + 0.25))`` (Blom 1958, *Statistical Estimates and Transformed Beta-Variables*; within
    0.03 of the exact value for n <= 10^6, about ``sqrt(2 ln n)`` for large n). An EWMA's values are positively
    correlated, and positive correlation only lowers the maximum of Gaussian values (Slepian 1962): the excess of a
    stationary EWMA's running maximum over its level, in its sigmas, is at most this in expectation."""
    if n <= 1:
        return 0.0
    return _STANDARD_NORMAL.inv_cdf((n - 0.375) / (n + 0.25))


_STANDARD_NORMAL = statistics.NormalDist()
