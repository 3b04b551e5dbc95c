"""The finite rewards of a growing timeline and what the consequence rule asks of the whole series, kept as it grows
(:class:`RewardHistory`, in :class:`~rlguard.guards.consequence.index.FindingIndex`): the established-peak test
(:func:`~rlguard.guards.consequence.rule.established_peak`) and the reward's range (:func:`reward_span`) without
reading the series again at each judgement of ``rlguard watch``.

The answers are :class:`~rlguard.guards.consequence.peak.PeakHistory`'s exactly (the same floating-point operations
in the same order): the EWMA path and the running sum of the squared successive differences are extended by the
rewards appended; the 5th and 95th percentiles of every reward are read from an ordered multiset kept in sorted
blocks (:class:`_Ranked`: an insertion costs a block, a rank the number of blocks); what depends only on the rewards
before a position (the robust sigma of their differences, the ``peak_observations``-th highest of their EWMA) is
computed once per position asked and kept. Memory: 32 bytes per finite reward (position, value, running sum and
the sorted copy), 8 more per EWMA smoothing asked.
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

__all__ = ["RewardHistory"]


class _Ranked:
    """A multiset of floats in sorted blocks of at most ``2 * load`` values, with its ``k``-th smallest."""

    def __init__(self, load: int = 1024) -> None:
        self.load = load
        self._blocks: list[array[float]] = []
        self._maxes: list[float] = []  # each block's largest, increasing

    def add(self, x: float) -> None:
        """Insert ``x`` (finite)."""
        if not self._blocks:
            self._blocks.append(array("d", [x]))
            self._maxes.append(x)
            return
        i = min(bisect.bisect_left(self._maxes, x), len(self._maxes) - 1)
        block = self._blocks[i]
        bisect.insort(block, x)
        self._maxes[i] = block[-1]
        if len(block) > 2 * self.load:
            self._blocks[i : i + 1] = [block[: self.load], block[self.load :]]
            self._maxes[i : i + 1] = [block[self.load - 1], block[-1]]

    def extend(self, values: list[float]) -> None:
        """Insert each of ``values`` (finite): sorted once into blocks where the multiset is empty."""
        if self._blocks or len(values) < self.load:
            for x in values:
                self.add(x)
            return
        ordered = sorted(values)
        self._blocks = [array("d", ordered[k : k + self.load]) for k in range(0, len(ordered), self.load)]
        self._maxes = [block[-1] for block in self._blocks]

    def remove(self, x: float) -> None:
        """Remove one ``x`` (present)."""
        i = bisect.bisect_left(self._maxes, x)
        block = self._blocks[i]
        del block[bisect.bisect_left(block, x)]
        if block:
            self._maxes[i] = block[-1]
        else:
            del self._blocks[i], self._maxes[i]

    def kth(self, k: int) -> float:
        """The ``k``-th smallest (0-based)."""
        for block in self._blocks:
            if k < len(block):
                return block[k]
            k -= len(block)
        raise IndexError(k)


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
        self._ranked = _Ranked()
        self._paths: dict[float, array[float]] = {}  # alpha -> the EWMA after each reward read so far
        self._sigmas: dict[int, float] = {}  # count -> robust sigma of the first `count` differences
        self._tops: dict[tuple[float, int, int], float] = {}  # (alpha, m, k) -> the k-th highest of the path's first m

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
        for value in self.values[count:]:
            self._ranked.remove(value)
        del self.positions[count:], self.values[count:], self._squares[max(count - 1, 0) :]
        for path in self._paths.values():
            del path[count:]
        self._sigmas = {c: s for c, s in self._sigmas.items() if c < count}
        self._tops = {key: t for key, t in self._tops.items() if key[1] <= count}

    def span(self) -> float:
        """:func:`~rlguard.guards.consequence.rule.reward_span` of every reward."""
        n = len(self.values)
        if not n:
            return 0.0
        top, bottom = self._ranked.kth(int(0.95 * (n - 1))), self._ranked.kth(int(0.05 * (n - 1)))
        return max(top, 1.0) - min(bottom, 0.0)

    def established(self, before: int, rule: ConsequenceRule) -> bool:
        """``established_peak(rewards, before, rule)`` of the rewards so far (``PeakHistory.established``)."""
        m = bisect.bisect_left(self.positions, before)  # finite rewards before `before`
        if m < rule.anchor + rule.peak_observations:
            return False
        count = m - 1  # their successive differences
        sigma = self._sigmas.get(count)
        if sigma is None:
            diffs = np.diff(np.frombuffer(self.values[:m], dtype=np.float64))  # (count,)
            sigma = self._sigmas[count] = robust_sigma(np.sort(diffs), diffs)
        margin = margin_from_noise(sigma, self._squares[count - 1], count, self.span(), rule)
        start = statistics.median(self.values[: rule.anchor].tolist())
        return self._top(rule.alpha, m, rule.peak_observations) > start + margin

    def _top(self, alpha: float, m: int, k: int) -> float:
        """The ``k``-th highest of the EWMA (``alpha``) after each of the first ``m`` rewards: ``k`` of them are
        above a level exactly when it is."""
        key = (alpha, m, k)
        if key not in self._tops:
            path = self._paths.setdefault(alpha, array("d"))
            ewma = path[-1] if path else self.values[0]
            for r in self.values[len(path) :]:  # ewma_path's recursion, continued
                ewma = (1 - alpha) * ewma + alpha * r
                path.append(ewma)
            self._tops[key] = float(np.partition(np.frombuffer(path[:m], dtype=np.float64), m - k)[m - k])
        return self._tops[key]
