"""The detector contract (:class:`Detector`) and the helpers the built-in detectors share.

Design: ``docs/design.md`` (the guard layer). The underscored helpers are private to the package
:mod:`rlguard.guards.detectors`: its modules share them, nothing outside imports them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from rlguard.guards.consequence.rule import converged, normalized_reward
from rlguard.guards.events import SEVERITY_LEVEL, Finding
from rlguard.guards.fields import AT_LEAST_ONE, NON_NEGATIVE, Range
from rlguard.guards.robust import RollingWindow, median_of
from rlguard.guards.state import PrivateState

#: the fewest observations a detector's robust baseline is built from: the median and MAD of 5 observations survive
#: two outliers among them (their breakdown point, Hampel 1974), a rolling z-score needs a spread, a 3-of-5 run rule
#: needs a window of 5
MIN_BASELINE = 5


def warmed_up(warmup: int, seen: int, span: int | None) -> bool:
    """Whether a detector with ``warmup`` is past it after ``seen`` observations whose steps span ``span``
    optimizer steps (the step of this observation minus that of its first; None: unknown). The warm-up covers the
    run's first ``warmup`` optimizer steps, its early transient, and at least :data:`MIN_BASELINE` observations,
    the fewest a robust baseline needs: a guard that sees every step is armed after ``warmup`` observations, one
    fed every 5th step (stats logged every 5 steps) after ``max(MIN_BASELINE, warmup / 5)`` of them, not after
    ``5 * warmup`` steps."""
    if seen >= warmup:
        return True
    return span is not None and seen >= MIN_BASELINE and span >= warmup


@dataclass(kw_only=True)
class Detector(PrivateState):
    """Base class. Subclasses set ``name``, ``source`` and ``summary`` and implement :meth:`check`.

    ``finding_class`` is what a finding of the detector is, for the consequence rule
    (:mod:`rlguard.guards.consequence.rule`): ``control`` (a loss of control: the default), ``budget`` (a property
    of the generation budget), ``signal`` (groups that carry no gradient), ``reward`` (a drawdown, which needs a
    level to fall from) or ``drift`` (a stat that grows as the policy learns, KL to the reference or the completion
    length: a loss of control, unless it comes with a rising reward below the detector's absolute bounds).

    Attributes:
        warmup: optimizer steps the detector watches (building its baseline) before it may fire, and at least
            :data:`MIN_BASELINE` observations (:func:`warmed_up`): on a guard that sees every step, observations.
        patience: consecutive findings needed to raise the alarm (1 = at once).
        clear_after: consecutive clean steps before a raised alarm clears (hysteresis).
    """

    name: ClassVar[str] = ""
    source: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    finding_class: ClassVar[str] = "control"
    #: the range of each number a config may set (:func:`rlguard.guards.fields.field_range`): every threshold,
    #: factor and count of a detector is ``>= 0``; a streak and the windows hold at least one observation
    field_ranges: ClassVar[dict[str, Range]] = {
        "*": NON_NEGATIVE,
        "patience": AT_LEAST_ONE,
        "window": AT_LEAST_ONE,
        "trend_window": AT_LEAST_ONE,
        "level_window": AT_LEAST_ONE,
        "control_window": AT_LEAST_ONE,
        "recent": AT_LEAST_ONE,
    }

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "consequence" in cls.__dict__:  # the attribute's earlier name, still set by plugins
            warnings.warn(
                f"{cls.__qualname__}.consequence is now called finding_class; rename the class attribute.",
                DeprecationWarning,
                stacklevel=2,
            )
            cls.finding_class = cls.__dict__["consequence"]

    warmup: int = 10
    patience: int = 1
    clear_after: int = 5

    def __post_init__(self) -> None:
        for f in ("warmup", "clear_after"):
            if getattr(self, f) < 0:
                raise ValueError(f"{type(self).__name__}.{f} must be >= 0; got {getattr(self, f)}.")
        if self.patience < 1:
            raise ValueError(f"{type(self).__name__}.patience must be >= 1; got {self.patience}.")

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        """Judge one step and update the baseline; ``armed`` is False during warm-up (learn, never find)."""
        raise NotImplementedError

    def change_point(self) -> int | None:
        """The step at which the condition this detector finds now began, by its own change-point estimate (a
        CUSUM's: the first observation since its statistic was last 0, Page 1954); None where it gives none (the
        onset of an excursion is then its first finding). Read after :meth:`check` of a step with a finding."""
        return None

    def baseline_needed(self) -> int | None:
        """Observations its judgement needs before it may fire, where that is fixed by what it judges: None (the
        default) for a robust baseline of its own stat, built over :attr:`warmup` (the doctor fits that to the log);
        0 for absolute bounds alone (a fact, not a deviation from a baseline), which with hindsight the doctor judges
        from the first record."""
        return None

    def reads(self) -> tuple[str, ...]:
        """The canonical stats this detector reads (its ``metric`` by default)."""
        metric = getattr(self, "metric", "")
        return (metric,) if isinstance(metric, str) and metric else ()

    def observes(self, stats: Mapping[str, float]) -> bool:
        """Whether this step carries evidence for the detector. A step without evidence is not judged and does
        not count: neither a clean step (it does not break a streak of findings or clear an alarm) nor a
        warm-up step. Default: a finite value of one of the stats it :meth:`reads` (frameworks log generation
        stats on some optimizer steps only: TRL with ``steps_per_generation > gradient_accumulation_steps``). A
        detector that declares no stats (a plugin without ``metric`` or ``reads``) is judged on every step."""
        reads = self.reads()
        if not reads:
            return True
        for name in reads:  # _finite, inlined: this runs for every detector at every step
            value = stats.get(name)
            if value is not None and math.isfinite(value):
                return True
        return False


def _metric(stats: Mapping[str, float], name: str) -> float | None:
    value = stats.get(name)
    return None if value is None else float(value)


def _finite(stats: Mapping[str, float], name: str) -> bool:
    value = stats.get(name)
    return value is not None and math.isfinite(value)


def _anchor_median(anchor: list[float]) -> float | None:
    """Median of the run's early healthy stretch (None until it holds 3 values)."""
    if len(anchor) < 3:
        return None
    return median_of(anchor)  # what a window of them reads, without building one


def _rank(finding: Finding | None) -> int:
    return 0 if finding is None else SEVERITY_LEVEL[finding.severity]


def _absolute(
    metric: str, value: float, warn_above: float | None, critical_above: float | None, advice: str
) -> Finding | None:
    """A finding for a value beyond an absolute bound: these need no baseline and hold from the first step."""
    for severity, bound in (("critical", critical_above), ("warn", warn_above)):
        if bound is not None and value >= bound:
            return Finding(
                severity,  # type: ignore[arg-type]
                value,
                bound,
                f"{metric}={value:.4g} is above the absolute bound {bound:g} (it needs no baseline). {advice}".rstrip(),
                absolute=True,
            )
    return None


class _RewardLevel:
    """Mixin of the detectors that tell a converged run from a failing one: the reward's recent median and the range
    seen (state ``_s_recent``, ``_s_low``, ``_s_high``), for
    :func:`~rlguard.guards.consequence.rule.converged`."""

    level_window: int
    converged_failing: float
    _s_recent: RollingWindow
    _s_low: float
    _s_high: float

    def _init_level(self) -> None:
        self._s_recent = RollingWindow(self.level_window)
        self._s_low, self._s_high = math.inf, -math.inf

    def _see_reward(self, stats: Mapping[str, float]) -> None:
        reward = _metric(stats, "reward_mean")
        if reward is not None and math.isfinite(reward):
            self._s_recent.push(reward)
            self._s_low, self._s_high = min(self._s_low, reward), max(self._s_high, reward)

    def _converged(self) -> bool:
        return len(self._s_recent) > 0 and converged(
            self._s_recent.median(), self._s_low, self._s_high, self.converged_failing
        )

    def _level(self) -> str:
        if len(self._s_recent) == 0:
            return "no reward logged to tell a converged run from a stalled one"
        level = self._s_recent.median()
        return f"the reward {level:.4g} is {normalized_reward(level, self._s_low, self._s_high):.0%} of its range"
