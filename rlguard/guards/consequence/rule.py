"""Severity by consequence: the one rule that says when a detector's finding is critical, for every detector,
absolute bounds included.

``critical`` means the run is failing or will fail:

- the state cannot recover (``Finding.unrecoverable``: non-finite values, one-token completions), or
- the condition is **sustained**: critical in ``sustained`` of ``within`` consecutive observations of its detector
  (the run rules of Shewhart charts: one point beyond the limits may be chance, several in a short run are a
  shift; Western Electric, *Statistical Quality Control Handbook*, 1956), or its own statistic already rests on
  that many observations (``Detector.evidence``: a CUSUM's alarm accumulates at least ``critical_h / (z_cap -
  slack)`` observations above its baseline, Page 1954; a run rule on top would wait for the same evidence again), or
- a lone critical observation is **followed by lost control** (a sustained critical finding of a detector of
  reward, entropy, KL, length or gradients within ``horizon`` logged steps after it), or not followed by
  recovery (``recovered`` clean observations in a row of its detector, starting within the horizon).

Everything else is a ``warn``:

- a single observation the run recovered from, whatever its size (the live guard still skips that step: it
  decides on the step itself; this rule needs what followed);
- a single observation at the end of the log that has not had the chance to recover (the log ends before
  ``recovered`` clean observations or their absence within the horizon could show): *unresolved*, a warning that
  says so (unrecoverable and sustained findings need no future and stay critical);
- a condition present from the first observations while the reward rises (the run learns with it);
- a ``drift`` (KL to the reference, completion length: stats that grow as the policy learns) sustained above the
  run's own baseline while the reward rises over it and nothing else loses control: the price of learning; beyond
  the detector's absolute bound (``Finding.absolute``: KL above 2 nats) it stays critical;
- a condition of the budget (``truncation``) while the reward rises, or at a converged reward (:func:`converged`
  over the condition and the horizon after it: hitting the budget costs no reward there), nothing losing control;
- groups without reward variance in a run whose reward is at the top of its range (converged, nothing left to
  learn: :func:`converged`, applied by the detector itself);
- a reward drawdown without an established peak (:func:`established_peak`): a reward at zero with blips has no
  level to collapse from.

Each detector declares its class (``Detector.finding_class``): ``control`` (the default: the condition is a loss of
control), ``budget`` (a property of the generation budget), ``signal`` (groups that carry no gradient),
``reward`` (a drawdown, which needs a peak) or ``drift`` (a stat that grows as the policy learns).

This module holds the rule's thresholds and the pieces both of its uses share; :mod:`rlguard.guards.consequence.offline`
applies it over a log with hindsight (the doctor), :mod:`rlguard.guards.consequence.live` as findings are made, from the
past only (the live guard with ``GuardConfig(consequence="online")``). :func:`converged` is applied by
``zero_variance_groups`` on each step, so the live guard labels alike.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlguard.guards.robust import RollingWindow, mann_kendall_z

__all__ = [
    "CONTROL_CLASSES",
    "ConsequenceRule",
    "RecoveryWatch",
    "converged",
    "established_peak",
    "ewma_margin",
    "ewma_path",
    "level_margin",
    "level_margin_from_noise",
    "margin_from_noise",
    "normalized_reward",
    "reward_rises",
    "reward_span",
    "sustained_count",
    "sustained_why",
]

#: consequence classes whose sustained critical finding is lost control (what makes a lone spike critical)
CONTROL_CLASSES = frozenset({"control", "reward", "drift"})


@dataclass(frozen=True)
class ConsequenceRule:
    """The rule's thresholds, all counted in observations (logged steps that carry the detector's stats).

    Attributes:
        sustained: critical observations among ``within`` consecutive ones that make a condition sustained
            (3 of 5: a Shewhart run rule; a lone point beyond the limits is 1 in 370 for a Gaussian at 3 sigma).
        within: see ``sustained``.
        horizon: logged steps after a lone critical observation in which lost control makes it critical
            (the consequences of a bad update show within a few updates: the next rollouts come from it).
        recovered: clean observations in a row of its detector, starting within ``horizon`` logged steps of a lone
            critical one, that show the run recovered from it; without them (the condition lingers, or the log
            ends first) it stays critical.
        start: a condition whose first finding comes within the detector's warm-up plus this many observations
            is present from the first observations.
        trend_z: Mann-Kendall z above which the reward rises (one-sided, 2.3% by chance; Mann 1945, Kendall 1975).
        anchor: first reward observations whose median is the run's start.
        peak_observations: smoothed-reward observations clearly above the start that establish a peak.
        peak_sigmas: "clearly above": this many sigmas of the smoothed reward's noise ...
        peak_share: ... and this share of the reward's range over the log (widened to ``[0, 1]``).
        alpha: smoothing of the reward (EWMA), as ``reward_collapse``'s.
        level_window: the last rewards from which the live rule estimates the EWMA's noise (:class:`RewardLevel`:
            bounded memory; the doctor uses every reward before the finding).
    """

    sustained: int = 3
    within: int = 5
    horizon: int = 10
    recovered: int = 3
    start: int = 10
    trend_z: float = 2.0
    anchor: int = 10
    peak_observations: int = 5
    peak_sigmas: float = 3.0
    peak_share: float = 0.1
    alpha: float = 0.2
    level_window: int = 200

    def __post_init__(self) -> None:
        if not 1 <= self.sustained <= self.within:
            raise ValueError(f"ConsequenceRule needs 1 <= sustained <= within; got {self.sustained}, {self.within}.")
        for name in ("horizon", "recovered", "start", "anchor", "peak_observations", "level_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"ConsequenceRule.{name} must be >= 1; got {getattr(self, name)}.")


def normalized_reward(level: float, lowest: float, highest: float) -> float:
    """``level`` as a share of the reward's range, the range being what was seen widened to ``[0, 1]`` (rewards
    of verifiable tasks are accuracies or sums of them; a run seen only at 0.99 is at the top of ``[0, 1]``)."""
    lo, hi = min(lowest, 0.0), max(highest, 1.0)
    return (level - lo) / (hi - lo)


def converged(level: float, lowest: float, highest: float, failing_share: float = 0.2) -> bool:
    """Whether groups without reward variance come from a converged run: with a normalised reward ``p`` at most
    a share ``1 - p`` of the groups can be all-failed (each contributes the lowest reward), so at
    ``p >= 1 - failing_share`` the groups left without signal are mostly solved: nothing is left to learn."""
    return normalized_reward(level, lowest, highest) >= 1.0 - failing_share


def reward_rises(rewards: Sequence[float], trend_z: float = 2.0) -> bool:
    """A rising reward: Mann-Kendall z >= ``trend_z`` over the finite values (at least 8) and the median of their
    last third above that of their first third (a trend that moved the level)."""
    values = [r for r in rewards if math.isfinite(r)]
    if len(values) < 8:
        return False
    third = len(values) // 3
    gained = statistics.median(values[-third:]) > statistics.median(values[:third])
    return gained and mann_kendall_z(values) >= trend_z


def ewma_margin(rewards: Sequence[float], span: float, rule: ConsequenceRule) -> float:
    """How far the reward's EWMA must be above a reference to be "clearly above" it: ``rule.peak_sigmas`` sigmas of
    the EWMA's noise (``sigma * sqrt(alpha / (2 - alpha))``, the stationary sd of an EWMA of white noise; Roberts
    1959) and ``rule.peak_share`` of the reward's range ``span``. The reward's noise comes from its successive
    differences (``sd(x_t - x_t-1) = sqrt(2) sigma``, so that a trend does not inflate it): their robust sigma, or
    their root mean square where that is larger (rewards of a few prompts are bimodal, MAD near 0)."""
    diffs = [b - a for a, b in itertools.pairwise(rewards)]
    robust = RollingWindow(len(diffs), diffs).sigma() if diffs else 0.0
    # a sequential sum (the same on every Python; PeakHistory keeps its prefixes)
    squares = functools.reduce(operator.add, (d * d for d in diffs), 0.0)
    return margin_from_noise(robust, squares, len(diffs), span, rule)


def margin_from_noise(robust: float, squares: float, count: int, span: float, rule: ConsequenceRule) -> float:
    """:func:`ewma_margin` from the reward's ``count`` successive differences summarised: their robust sigma
    (``robust``) and the sum of their squares (``squares``)."""
    noise = _noise(robust, squares, count)
    return max(rule.peak_sigmas * noise * math.sqrt(rule.alpha / (2 - rule.alpha)), rule.peak_share * span)


def _noise(robust: float, squares: float, count: int) -> float:
    """The reward's noise sigma from its ``count`` successive differences: their robust sigma or root mean square,
    whichever is larger, over ``sqrt(2)`` (``sd(x_t - x_t-1) = sqrt(2) sigma``); 0 without differences."""
    if not count:
        return 0.0
    return max(robust, math.sqrt(squares / count)) / math.sqrt(2)


def level_margin(rewards: Sequence[float], span: float, window: int, level: int, rule: ConsequenceRule) -> float:
    """How far the median of ``window`` rewards must be below the median of ``level`` earlier ones (the level) to
    be off it, where the reward's noise is that of ``rewards`` (finite, in log order): ``rule.peak_sigmas``
    standard errors of the difference of the two medians (``sqrt(pi / 2) * sigma * sqrt(1 / window + 1 / level)``:
    a sample median's standard error is ``sqrt(pi / 2) * sigma / sqrt(n)`` for Gaussian noise, its efficiency
    ``2 / pi``; sigma from the successive differences, as :func:`ewma_margin`), and ``rule.peak_share`` of the
    reward's range ``span`` (:func:`reward_span`), whichever is larger: the two parts of :func:`ewma_margin`, for
    medians instead of an EWMA."""
    diffs = [b - a for a, b in itertools.pairwise(rewards)]
    robust = RollingWindow(len(diffs), diffs).sigma() if diffs else 0.0
    squares = functools.reduce(operator.add, (d * d for d in diffs), 0.0)
    return level_margin_from_noise(robust, squares, len(diffs), span, window, level, rule)


def level_margin_from_noise(
    robust: float, squares: float, count: int, span: float, window: int, level: int, rule: ConsequenceRule
) -> float:
    """:func:`level_margin` from the rewards' ``count`` successive differences summarised: their robust sigma
    (``robust``) and the sum of their squares (``squares``)."""
    noise = _noise(robust, squares, count)
    error = math.sqrt(math.pi / 2) * noise * math.sqrt(1 / window + 1 / level)
    return max(rule.peak_sigmas * error, rule.peak_share * span)


def reward_span(rewards: Sequence[float]) -> float:
    """The reward's range over a log: its 5th to 95th percentile (nearest rank below) widened to ``[0, 1]`` (a
    blip of a reward at zero spans no range); 0 without rewards. ``rewards``: the finite ones."""
    if not rewards:
        return 0.0
    every = sorted(rewards)
    top, bottom = every[int(0.95 * (len(every) - 1))], every[int(0.05 * (len(every) - 1))]
    return max(top, 1.0) - min(bottom, 0.0)


def ewma_path(rewards: Sequence[float], alpha: float) -> list[float]:
    """The reward's EWMA after each observation, started at the first: ``e_t = (1 - alpha) e_t-1 + alpha x_t``."""
    out: list[float] = []
    ewma = rewards[0] if rewards else 0.0
    for r in rewards:
        ewma = (1 - alpha) * ewma + alpha * r
        out.append(ewma)
    return out


def established_peak(rewards: Sequence[float], before: int, rule: ConsequenceRule) -> bool:
    """Whether the reward had a peak to collapse from before position ``before``: at least
    ``rule.peak_observations`` observations at which its EWMA was clearly above the run's start (the median of
    its first ``rule.anchor`` observations, those up to the EWMA's best before ``before`` only: a peak is
    established by what the run did before it fell, never by the fall, and a fall within the first observations
    would lower the start below the level it falls from), by :func:`ewma_margin` with the reward's range over the
    whole log (5th to 95th percentile, widened to ``[0, 1]``: a blip of a reward at zero is no peak)."""
    from rlguard.guards.consequence.peak import PeakHistory  # peak builds on this module: imported here

    return PeakHistory(rewards, rule).established(before)


def sustained_count(critical: Callable[[int], bool], k: int, rule: ConsequenceRule) -> int:
    """Critical observations among the ``rule.within`` of a detector that end at its observation ``k`` (counting
    it); ``critical(j)`` says whether observation ``j`` was. Sustained at ``>= rule.sustained``."""
    return sum(1 for j in range(max(k - rule.within + 1, 0), k + 1) if critical(j))


def sustained_why(recent: int, evidence: int, rule: ConsequenceRule) -> str | None:
    """Why a critical finding is sustained, or None: ``recent`` critical observations of its detector among the
    last ``rule.within`` (:func:`sustained_count`), or a finding whose own statistic rests on ``evidence``
    observations (``Detector.evidence``: a CUSUM alarm), either at least ``rule.sustained``."""
    if recent >= rule.sustained:
        return f"sustained: critical in {recent} of {rule.within} observations"
    if evidence >= rule.sustained:
        return f"sustained: its statistic rests on at least {evidence} observations"
    return None


class RecoveryWatch:
    """Whether a detector recovered after a lone critical observation: ``clean`` observations in a row without a
    finding of it, starting at or before position ``until`` (the observation's position plus the horizon). Fed one
    observation of the detector at a time, in order: the doctor feeds the log's, the live guard each step's."""

    def __init__(self, until: int, clean: int) -> None:
        self.until, self.clean = until, clean
        self.streak = 0  # clean observations in a row so far

    def see(self, position: int, found: bool) -> bool | None:
        """Feed the observation at ``position`` (``found``: it has a finding of the detector, any severity): True
        once recovered, False once recovery can no longer start within the horizon, None while undecided."""
        if found or (not self.streak and position > self.until):
            self.streak = 0
            return False if position > self.until else None
        self.streak += 1
        return True if self.streak >= self.clean else None
