"""The finite rewards of a growing timeline and what the consequence rule asks of the whole series, kept as it grows
(:class:`RewardHistory`, in :class:`~rlguard.guards.consequence.index.FindingIndex`): the established-peak test
(:func:`~rlguard.guards.consequence.rule.established_peak`) and the reward's range (:func:`reward_span`) without
reading the series again at each judgement of ``rlguard watch``.

The answers are :class:`~rlguard.guards.consequence.peak.PeakHistory`'s exactly (the same floating-point operations in
the same order): the EWMA path, the index of its last maximum (the run's start is the median of its first rewards up to
it) and the running sum of the squared successive differences are extended by the rewards appended; the 5th and 95th
percentiles of every reward are read from an ordered multiset kept in sorted blocks
(:class:`~rlguard.guards.robust.SortedBlocks`: an insertion costs a block, a rank the number of blocks); what depends
only on the rewards before a position (the robust sigma of their differences, the ``peak_observations``-th highest of
their EWMA) is computed once per position asked and kept. Memory: 32 bytes per finite reward (position, value, running
sum and the sorted copy), 16 more per EWMA smoothing asked (its path and its last maximum).

The rising-reward test over an episode's window (:func:`~rlguard.guards.consequence.rule.reward_rises`, asked again at
each judgement while the episode goes on and its window grows) is kept per window start and end (:class:`_Rise`): its
Mann-Kendall sum of signs and the medians of its first and last thirds are brought up to the window's end, a reward
added or taken back in time per reward (a rank in sorted blocks), not per reward of the window. Memory: 24 bytes per
reward of a window asked (the window's values sorted, and its two thirds).
"""

from __future__ import annotations

import bisect
import math
import statistics
from array import array
from collections.abc import Sequence

import numpy as np

from rlguard.guards.consequence.peak import robust_sigma
from rlguard.guards.consequence.rule import ConsequenceRule, margin_from_noise
from rlguard.guards.robust import SortedBlocks, _mann_kendall

__all__ = ["RewardHistory"]


class RewardHistory:
    """The finite rewards of a timeline by position, read when the rule first asks (:meth:`read`: a log whose
    reward finding is never critical costs nothing) and then as the timeline grows (module docstring).

    Attributes:
        seen: the positions of the timeline read.
        positions: the position of each finite reward, increasing.
        values: the finite rewards, in order.
    """

    def __init__(self) -> None:
        self.seen = 0
        self.positions: array[int] = array("q")
        self.values: array[float] = array("d")
        self._squares: array[float] = array("d")  # running sums of the squared successive differences
        self._ranked = SortedBlocks()
        self._paths: dict[float, array[float]] = {}  # alpha -> the EWMA after each reward read so far
        self._bests: dict[float, array[int]] = {}  # alpha -> index of the EWMA's last maximum up to each reward
        self._sigmas: dict[int, float] = {}  # count -> robust sigma of the first `count` differences
        self._tops: dict[tuple[float, int, int], float] = {}  # (alpha, m, k) -> the k-th highest of the path's first m
        self._scans: dict[int, _Recovery] = {}  # first reward after an onset -> the recovery's scans from there
        #: first reward of a window -> the rising-reward tests from there: a window asked moves the test that ends
        #: last before its end, else has one of its own (an episode over beside one going on, from the same reward)
        self._rises: dict[int, list[_Rise]] = {}

    def read(self, rewards: Sequence[float]) -> None:
        """Read the timeline's rewards (``reward_mean`` per position, NaN where absent) from :attr:`seen` on."""
        first, squares, values = len(self.values), self._squares, self.values
        for p in range(self.seen, len(rewards)):
            r = rewards[p]
            if math.isfinite(r):
                if values:
                    d = r - values[-1]
                    squares.append(squares[-1] + d * d if squares else d * d)
                self.positions.append(p)
                values.append(r)
        self.seen = max(self.seen, len(rewards))
        self._ranked.extend(values[first:].tolist())

    def forget(self, n: int) -> None:
        """Forget the positions from ``n`` on (the fold forgets a last step judged by a copy)."""
        count = bisect.bisect_left(self.positions, n)
        self.seen = min(self.seen, n)
        self._rises = {a: tests for a, tests in self._rises.items() if a <= count}
        for tests in self._rises.values():
            for test in tests:
                test.move(self.values, min(test.end, count))
        for value in self.values[count:]:
            self._ranked.remove(value)
        del self.positions[count:], self.values[count:], self._squares[max(count - 1, 0) :]
        for path in self._paths.values():
            del path[count:]
        for best in self._bests.values():
            del best[count:]
        self._sigmas = {c: s for c, s in self._sigmas.items() if c < count}
        self._scans = {k: scan for k, scan in self._scans.items() if scan.upto <= count}
        self._tops = {key: t for key, t in self._tops.items() if key[1] <= count}

    def span(self) -> float:
        """:func:`~rlguard.guards.consequence.rule.reward_span` of every reward."""
        n = len(self.values)
        if not n:
            return 0.0
        top, bottom = self._ranked[int(0.95 * (n - 1))], self._ranked[int(0.05 * (n - 1))]
        return max(top, 1.0) - min(bottom, 0.0)

    def established(self, before: int, rule: ConsequenceRule) -> bool:
        """``established_peak(rewards, before, rule)`` of the rewards so far (``PeakHistory.established``)."""
        m = bisect.bisect_left(self.positions, before)  # finite rewards before `before`
        if m < rule.anchor + rule.peak_observations:
            return False
        count = m - 1  # their successive differences
        margin = margin_from_noise(self.sigma(count), self.squares(count), count, self.span(), rule)
        self._extend(rule.alpha)
        best = self._bests[rule.alpha][m - 1]  # the EWMA's last observation at its maximum before `before`
        start = statistics.median(self.values[: min(rule.anchor, best + 1)].tolist())
        return self._top(rule.alpha, m, rule.peak_observations) > start + margin

    def rises(self, lo: int, hi: int, trend_z: float) -> bool:
        """``reward_rises(rewards[lo : hi + 1], trend_z)`` of the rewards so far, kept per ``lo`` (module
        docstring)."""
        a, b = bisect.bisect_left(self.positions, lo), bisect.bisect_right(self.positions, hi)
        tests = self._rises.setdefault(a, [])
        test = max((t for t in tests if t.end <= b), key=lambda t: t.end, default=None)  # moved forward only
        if test is None:  # a window of its own (an episode over, beside one going on from the same reward)
            test = _Rise(a)
            tests.append(test)
        test.move(self.values, b)
        return test.rising(trend_z)

    def sigma(self, count: int) -> float:
        """``RollingWindow(count, diffs).sigma()`` of the first ``count`` successive differences (0 for none)."""
        if not count:
            return 0.0
        if count not in self._sigmas:
            diffs = np.diff(np.frombuffer(self.values[: count + 1], dtype=np.float64))  # (count,)
            self._sigmas[count] = robust_sigma(np.sort(diffs), diffs)
        return self._sigmas[count]

    def squares(self, count: int) -> float:
        """The sum of the squares of the first ``count`` successive differences, in order (0 for none)."""
        return self._squares[count - 1] if count else 0.0

    def recovery(self, k0: int, bound: float, margin: float, n: int) -> tuple[int, int] | None:
        """(first reward of the fall's window, first reward back) after reward ``k0``: the scans of
        :func:`~rlguard.guards.consequence.excursions.recovered_incidents` (:class:`_Recovery`), resumed where the
        last judgement left them; None while the reward did not fall and come back."""
        scan = self._scans.get(k0)
        if scan is None or (scan.bound, scan.margin, scan.n) != (bound, margin, n):
            scan = self._scans[k0] = _Recovery(k0, bound, margin, n)
        scan.run(self.values, len(self.values) - 1)  # the windows before the last reward: kept (never forgotten)
        return scan.ends(self.values)

    def _top(self, alpha: float, m: int, k: int) -> float:
        """The ``k``-th highest of the EWMA (``alpha``) after each of the first ``m`` rewards: ``k`` of them are
        above a level exactly when it is."""
        key = (alpha, m, k)
        if key not in self._tops:
            path = self._extend(alpha)
            self._tops[key] = float(np.partition(np.frombuffer(path[:m], dtype=np.float64), m - k)[m - k])
        return self._tops[key]

    def _extend(self, alpha: float) -> array[float]:
        """The EWMA (``alpha``) after each reward read, and the index of its last maximum up to each, continued."""
        path = self._paths.setdefault(alpha, array("d"))
        best = self._bests.setdefault(alpha, array("q"))
        ewma = path[-1] if path else self.values[0]
        for i in range(len(path), len(self.values)):  # ewma_path's recursion, continued
            ewma = (1 - alpha) * ewma + alpha * self.values[i]
            path.append(ewma)
            best.append(i if not best or ewma >= path[best[-1]] else best[-1])
        return path


class _Rise:
    """:func:`~rlguard.guards.consequence.rule.reward_rises` of the finite rewards ``values[start:end]``, kept as
    ``end`` moves (:meth:`move`): Mann-Kendall's sum of signs (each reward against those before it, counted in their
    sorted blocks) and the sorted first and last thirds of the window, whose medians are compared."""

    def __init__(self, start: int) -> None:
        self.start = self.end = start
        self.signs = 0  # Mann-Kendall's S over the window
        self._ranked = SortedBlocks()  # the window's values
        self._first = SortedBlocks()  # its first len // 3
        self._last = SortedBlocks()  # its last len // 3

    def move(self, values: Sequence[float], end: int) -> None:
        """Bring the window to ``values[start:end]``, a reward at a time."""
        while self.end > end:
            self._pop(values)
        while self.end < end:
            self._push(values)

    def _signs(self, x: float) -> int:
        """The sum of ``sign(x - v)`` over the window's values ``v``."""
        below = self._ranked.rank(math.nextafter(x, -math.inf))  # values < x: those <= the float before it
        return below - (len(self._ranked) - self._ranked.rank(x))

    def _push(self, values: Sequence[float]) -> None:
        n, x = self.end - self.start, values[self.end]  # n values before it, then n + 1
        self.signs += self._signs(x)
        self._ranked.add(x)
        third = n // 3
        if (n + 1) // 3 > third:  # the first third takes the next value; the last third grows by x
            self._first.add(values[self.start + third])
        else:  # the last third moves on by one
            if third:
                self._last.remove(values[self.end - third])
        if (n + 1) // 3:
            self._last.add(x)
        self.end += 1

    def _pop(self, values: Sequence[float]) -> None:
        self.end -= 1
        n, x = self.end - self.start, values[self.end]  # n values before it: _push reversed
        self._ranked.remove(x)
        self.signs -= self._signs(x)
        third = n // 3
        if (n + 1) // 3:
            self._last.remove(x)
        if (n + 1) // 3 > third:
            self._first.remove(values[self.start + third])
        elif third:
            self._last.add(values[self.end - third])

    def rising(self, trend_z: float) -> bool:
        """``reward_rises`` of the window: at least 8 rewards, the median of the last third above that of the first
        and Mann-Kendall's z at least ``trend_z``."""
        n = self.end - self.start
        if n < 8:
            return False
        gained = _median(self._last) > _median(self._first)
        return gained and _mann_kendall(float(self.signs), n) >= trend_z


def _median(ranked: SortedBlocks) -> float:
    """``statistics.median`` of the values, read from their sorted blocks."""
    n = len(ranked)
    return ranked[n // 2] if n % 2 else (ranked[n // 2 - 1] + ranked[n // 2]) / 2


class _Recovery:
    """The reward's fall and return after reward ``k0`` (the definition: :mod:`rlguard.guards.consequence.excursions`):
    the first window of ``n`` rewards from ``k0`` whose median is below ``bound`` (fell), then the first later window
    whose median is at least ``bound`` and the median of the rewards since the fall plus ``margin`` (back); each
    window tested once as rewards are appended (:meth:`run`)."""

    def __init__(self, k0: int, bound: float, margin: float, n: int) -> None:
        self.bound, self.margin, self.n = bound, margin, n
        self.k = k0  # the next window of the fall's scan
        self.start: int | None = None  # the fall's window
        self.since: list[float] = []  # the rewards since the fall, sorted
        self.kb = 0  # the next window of the return's scan
        self.back: int | None = None  # the first reward back
        self.upto = 0  # the rewards the windows tested end before

    def run(self, values: Sequence[float], upto: int) -> None:
        """Test the windows that end before reward ``upto``."""
        n, bound = self.n, self.bound
        self.upto = max(self.upto, upto)
        while self.start is None and self.k + n <= upto:
            if statistics.median(values[self.k : self.k + n]) < bound:
                self.start, self.kb = self.k, self.k + n
                self.since = sorted(values[self.k : self.k + n])
            else:
                self.k += 1
        while self.start is not None and self.back is None and self.kb + n <= upto:
            since, kb = self.since, self.kb
            mid = len(since) // 2
            above = max(bound, (since[mid] if len(since) % 2 else (since[mid - 1] + since[mid]) / 2) + self.margin)
            if statistics.median(values[kb : kb + n]) >= above:
                self.back = next(j for j in range(kb, kb + n) if values[j] >= above)
            else:
                bisect.insort(since, values[kb])
                self.kb += 1

    def ends(self, values: Sequence[float]) -> tuple[int, int] | None:
        """(fall's window, first reward back) with every window of ``values`` tested: those ending at its last
        reward tested on a copy of the scans' state (that reward may be forgotten, :meth:`RewardHistory.forget`)."""
        state = (self.k, self.start, self.kb, self.back, self.upto)
        self.run(values, len(values))
        found = None if self.start is None or self.back is None else (self.start, self.back)
        if state[1] is None:
            self.since = []
        else:
            for k in range(state[2], self.kb):
                del self.since[bisect.bisect_left(self.since, values[k])]
        self.k, self.start, self.kb, self.back, self.upto = state
        return found
