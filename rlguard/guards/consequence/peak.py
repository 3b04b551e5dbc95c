"""The established-peak test of the consequence rule (:func:`~rlguard.guards.consequence.rule.established_peak`)
asked at many positions of one log: :class:`PeakHistory` reads the rewards once and answers each position from
prefix arrays, so that the doctor labels a log of ``n`` steps in ``O(n log n + q n)`` vectorised work for ``q``
positions asked (the reward detector's episodes) instead of ``q`` sorts and Python passes over the log.

The answers are those of the rule's definition exactly (same floating-point operations in the same order): the
median of the first ``rule.anchor`` finite rewards up to the EWMA's best, the 5th-95th percentile range of all of
them, the EWMA path (a prefix of the whole log's), and :func:`~rlguard.guards.consequence.rule.margin_from_noise`
from the prefix's successive differences: their robust sigma (``1.4826 * MAD``, or ``sqrt(pi/2) *`` the mean
absolute deviation where the MAD is 0, as :class:`~rlguard.guards.robust.RollingWindow`) and the sequential sum of
their squares.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Sequence

import numpy as np

from rlguard.guards.consequence.rule import ConsequenceRule, ewma_path, margin_from_noise, reward_span
from rlguard.guards.robust import MAD_TO_SIGMA, MEAN_AD_TO_SIGMA

__all__ = ["PeakHistory", "robust_sigma"]


def _kth_smallest_v(dev: np.ndarray, k: int) -> float:
    """The ``k``-th smallest (1-based) of ``dev``, a sequence that does not increase and then does not decrease
    (the absolute deviations of sorted values from a point among them): its ``k`` smallest values are contiguous,
    so it is the least over windows of ``k`` of the larger of their two ends."""
    return float(np.maximum(dev[: len(dev) - k + 1], dev[k - 1 :]).min())


def robust_sigma(ordered: np.ndarray, diffs: np.ndarray) -> float:
    """``RollingWindow(len(diffs), diffs).sigma()`` from ``diffs`` (in log order) and the same values sorted
    (``ordered``): 1.4826 * their MAD, or their mean absolute deviation times ``sqrt(pi / 2)`` where the MAD is 0."""
    n = len(ordered)
    mid = n // 2
    med = float(ordered[mid]) if n % 2 else 0.5 * (float(ordered[mid - 1]) + float(ordered[mid]))
    dev = np.abs(ordered - med)
    odd = _kth_smallest_v(dev, mid + 1)
    mad = odd if n % 2 else 0.5 * (_kth_smallest_v(dev, mid) + odd)
    sigma = MAD_TO_SIGMA * mad
    if sigma == 0.0:
        deviations = [abs(v - med) for v in diffs.tolist()]  # log order: the sum's order
        sigma = MEAN_AD_TO_SIGMA * sum(deviations) / len(deviations)
    return sigma


class PeakHistory:
    """:func:`~rlguard.guards.consequence.rule.established_peak` of one reward series at any position.

    Memory: four float64 arrays and one int64 array of the finite rewards' length (40 bytes per reward).

    Args:
        rewards: ``reward_mean`` per logged step, NaN where absent.  # (n,)
        rule: the consequence rule's thresholds.
    """

    def __init__(self, rewards: Sequence[float], rule: ConsequenceRule) -> None:
        self.rule = rule
        finite = [i for i, r in enumerate(rewards) if math.isfinite(r)]
        self.positions = finite  # position in the log of each finite reward
        values = [float(rewards[i]) for i in finite]
        self.every = len(values)
        self.values = values
        self.span = reward_span(values)
        self.path = np.asarray(ewma_path(values, rule.alpha), dtype=np.float64)  # (m,)
        diffs = [b - a for a, b in itertools.pairwise(values)]
        self.diffs = np.asarray(diffs, dtype=np.float64)  # (m - 1,) in log order
        self.squares = np.asarray(list(itertools.accumulate(d * d for d in diffs)), dtype=np.float64)  # prefix sums
        self.order = np.argsort(self.diffs, kind="stable")  # (m - 1,)
        self.sorted = self.diffs[self.order]

    def _robust_sigma(self, count: int) -> float:
        """``RollingWindow(count, diffs[:count]).sigma()`` (:func:`robust_sigma`)."""
        return robust_sigma(self.sorted[self.order < count], self.diffs[:count])

    def established(self, before: int) -> bool:
        """Whether the reward had an established peak before position ``before`` (``established_peak(rewards,
        before, rule)``)."""
        rule = self.rule
        m = bisect.bisect_left(self.positions, before)  # finite rewards before `before`
        if m < rule.anchor + rule.peak_observations:
            return False
        count = m - 1  # their successive differences
        margin = margin_from_noise(self._robust_sigma(count), float(self.squares[count - 1]), count, self.span, rule)
        path = self.path[:m]
        best = m - 1 - int(np.argmax(path[::-1]))  # the EWMA's last observation at its maximum before `before`
        start = statistics.median(self.values[: min(rule.anchor, best + 1)])
        return int(np.count_nonzero(path > start + margin)) >= rule.peak_observations
