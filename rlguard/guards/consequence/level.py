"""The reward's established level as rewards arrive (the live consequence rule's "established peak"):
:class:`RewardLevel`."""

from __future__ import annotations

import math

from rlguard.guards.consequence.rule import ConsequenceRule, ewma_margin
from rlguard.guards.robust import RollingWindow

__all__ = ["RewardLevel"]


class RewardLevel:
    """Whether the reward has an established level, from the rewards seen so far: at least
    ``rule.peak_observations`` observations at which its EWMA was clearly above the floor of its range, by
    :func:`ewma_margin` with the range seen (widened to ``[0, 1]``). A reward at 0 with blips has no level; a run
    warm-started at 0.5 has one from its first observations, so a fall from it is a collapse though it never rose
    above its start (the doctor's peak, :func:`~rlguard.guards.consequence.rule.established_peak`, reads it with the
    whole log; live, "above the start" misses the collapses of warm-started runs, most of those of
    ``benchmarks/collapse_long``).

    The floor is the lowest reward seen up to the EWMA's best (the last observation at which it was at its running
    maximum), widened to 0 as in :func:`normalized_reward` (rewards of verifiable tasks are accuracies or sums of
    them, whose least value is 0). A level is established by what the run did before it fell, never by the fall:
    the fall a reward finding judges is the EWMA's drawdown from its best (``reward_collapse``), so every reward
    after the best belongs to it, and a floor lowered by them would make a reward flat at 0 "established" by the
    negative reward it falls to, a level read from the fall it is asked to judge. The rewards after the best widen
    the margin's noise (the last ``rule.level_window``) and never lower the floor: they can make a level harder to
    establish, not easier.

    Bounded memory: the ``rule.peak_observations`` largest EWMA values (there are that many above a bound exactly
    when the least of them is; the first is the EWMA's best), the extremes, the floor, and the last
    ``rule.level_window`` rewards for the noise.
    """

    def __init__(self, rule: ConsequenceRule) -> None:
        self.rule = rule
        self.ewma: float | None = None
        self.lowest, self.highest = math.inf, -math.inf
        #: the lowest reward seen up to the EWMA's best (at it included)
        self.lowest_at_best = math.inf
        self.top: list[float] = []  # the largest EWMA values seen, at most rule.peak_observations
        self.recent = RollingWindow(rule.level_window)

    def push(self, reward: float) -> None:
        """One more ``reward_mean`` observation (non-finite values are ignored)."""
        if not math.isfinite(reward):
            return
        alpha = self.rule.alpha
        self.ewma = reward if self.ewma is None else (1 - alpha) * self.ewma + alpha * reward
        self.lowest, self.highest = min(self.lowest, reward), max(self.highest, reward)
        if not self.top or self.ewma >= self.top[0]:  # at its best (a level held flat stays at it)
            self.lowest_at_best = self.lowest
        self.top = sorted([*self.top, self.ewma], reverse=True)[: self.rule.peak_observations]
        self.recent.push(reward)

    def floor(self) -> float:
        """The floor of the reward's range: the lowest reward seen up to the EWMA's best, or 0 below it."""
        return min(self.lowest_at_best, 0.0)

    def established(self) -> bool:
        """At least ``rule.peak_observations`` EWMA observations clearly above :meth:`floor`."""
        if len(self.top) < self.rule.peak_observations:
            return False
        return self.top[-1] > self.floor() + self._margin()

    def holds(self, since: float | None) -> bool:
        """Whether the reward has an established level (:meth:`established`) and its EWMA is not clearly below
        ``since`` (an earlier EWMA; "clearly" by the margin of :meth:`established`)."""
        if since is None or self.ewma is None or not self.established():
            return False
        return self.ewma >= since - self._margin()

    def _margin(self) -> float:
        span = max(self.highest, 1.0) - self.floor()
        return ewma_margin(list(self.recent.values), span, self.rule)
