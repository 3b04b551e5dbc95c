"""The three generic shapes: :class:`SpikeDetector` (a value far above its rolling median, in log space),
:class:`CusumDetector` (a sustained upward shift, Page's CUSUM) and :class:`ThresholdDetector` (absolute bounds,
optionally above the run's own baseline; in :mod:`~rlguard.guards.detectors.threshold`). Most built-in detectors are
one of them with their own defaults."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from rlguard.guards.detectors.base import (
    SHIFT_WINDOW,
    Detector,
    LevelShift,
    _absolute,
    _anchor_median,
    _EarlySorted,
    _rank,
    rise_onset,
)
from rlguard.guards.detectors.threshold import ThresholdDetector
from rlguard.guards.events import Finding
from rlguard.guards.robust import RollingWindow, cusum_step

__all__ = ["CusumDetector", "SpikeDetector", "ThresholdDetector"]


@dataclass(kw_only=True)
class SpikeDetector(Detector):
    """A value far above its rolling median: ``value / median >= factor`` and robust z (log space) ``>= min_z``.

    Attributes:
        metric: the stat to watch.
        window: healthy steps in the rolling baseline.
        warn_factor: ratio to the median that warns.
        critical_factor: ratio to the median that is critical.
        min_z: robust z-score (log space) also required, so that a noisy metric needs a larger jump.
        floor: values at or below it are no evidence either way: neither judged nor learnt (a zero gradient norm
            when every group has zero reward variance; a zero clip fraction on the on-policy first step of a batch),
            so the baseline is made of the values that carry information.
        min_value: no finding below this absolute value.
        warn_above: absolute value that warns from the first logged step, with no baseline (None: off).
        critical_above: absolute value that is critical from the first logged step (None: off).
        advice: what to do, appended to the message.
    """

    metric: str = ""
    window: int = 50
    warn_factor: float = 5.0
    critical_factor: float = 20.0
    min_z: float = 6.0
    floor: float = 1e-8
    min_value: float = 0.0
    warn_above: float | None = None
    critical_above: float | None = None
    advice: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1.0 < self.warn_factor <= self.critical_factor:
            raise ValueError(
                f"{self.name}: need 1 < warn_factor <= critical_factor; got {self.warn_factor}, {self.critical_factor}."
            )
        self._s_window = RollingWindow(self.window)

    #: whether the class's :meth:`observes` is this one (:meth:`check` then inlines it)
    _own_observes: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._own_observes = cls.observes is SpikeDetector.observes

    def observes(self, stats: Mapping[str, float]) -> bool:
        """A finite value above ``floor``: non-finite values are the ``nonfinite`` detector's; values at the floor
        would make the next ordinary value look like a huge spike over a median at the floor (with alternating
        on- and off-policy steps the median would sit between 0 and the usual value)."""
        value = stats.get(self.metric)
        return value is not None and math.isfinite(value) and float(value) > self.floor

    def observed_with(self, names: frozenset[str], *, finite: bool) -> bool | None:
        """No step without its ``metric`` (:meth:`observes`); else the value decides (the floor)."""
        return False if self.metric not in names else None

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        value = stats.get(self.metric)
        if value is None:
            return None
        if self._own_observes:  # its test, inlined (the hot path)
            if not (math.isfinite(value) and float(value) > self.floor):
                return None
        elif not self.observes(stats):
            return None
        x = math.log(value := float(value))
        finding = None
        warn_above, critical_above = self.warn_above, self.critical_above
        # _absolute finds only a value at or above a bound that is set: asked only then
        if (warn_above is not None and value >= warn_above) or (critical_above is not None and value >= critical_above):
            finding = _absolute(self.metric, value, warn_above, critical_above, self.advice)
        window = self._s_window
        # two baseline values suffice: a finding needs both the factor and the robust z over them; below the warning
        # factor (at most the critical one) nothing is found: no robust z to compute
        if finding is None and armed and len(window) >= 2 and value >= self.min_value:
            median = window.median()
            factor = math.exp(x - median)
            if factor >= self.warn_factor:
                finding = self._spike(value, x, median, factor)
        if finding is None:
            window.push(x)
        return finding

    def _spike(self, value: float, x: float, median: float, factor: float) -> Finding | None:
        """The finding at ``factor`` x the rolling median (log ``median``) if the robust z of ``x`` is large enough."""
        z = self._s_window.robust_z(x, floor=0.05)
        base = math.exp(median)
        for severity, bound in (("critical", self.critical_factor), ("warn", self.warn_factor)):
            if factor >= bound and z >= self.min_z:
                return Finding(
                    severity,  # type: ignore[arg-type]
                    value,
                    bound * base,
                    f"{self.metric}={value:.4g} is {factor:.1f}x its rolling median {base:.4g} "
                    f"(threshold {bound:g}x, robust z={z:.1f}). {self.advice}".rstrip(),
                )
        return None


@dataclass(kw_only=True)
class CusumDetector(Detector):
    """A sustained upward shift of a metric (log space): one-sided CUSUM of robust z-scores (Page 1954), plus a
    drift check against the run's early healthy stretch.

    The rolling baseline keeps learning while the statistic is above 0, from values winsorized at median + 2 sigma:
    a slow healthy drift (lengths growing as the model learns to reason) is absorbed, a fast rise is not. What the
    rolling baseline absorbs the anchored one keeps: the median of the first ``anchor`` healthy observations. A
    slow drift (the median of the last ``recent`` observations ``>= drift_ratio`` x the anchor) warns; a CUSUM alarm
    is critical only once that recent median is also ``>= critical_ratio`` x the anchor (a sustained trend of
    consequence, not one spike on top of a drift), otherwise it warns.

    Attributes:
        metric: the stat to watch.
        window: steps in the rolling baseline.
        slack: CUSUM's ``k``: drift per step (in robust sigmas) that is ignored.
        warn_h: statistic that warns; critical_h: statistic that is critical.
        min_sigma: floor of the baseline's robust sigma in log space (0.05 = 5% changes are noise).
        z_cap: each step adds at most ``z_cap - slack``, so one outlier cannot look like a sustained shift.
        floor: values are read as ``max(value, floor)``.
        warn_above: absolute value that warns regardless of the trend (None: off).
        critical_above: absolute value that is critical regardless of the trend (None: off).
        anchor: healthy observations that form the anchored baseline.
        recent: observations whose median is compared with the anchor for drift.
        drift_ratio: recent median / anchor that warns (None: off).
        critical_ratio: recent median / anchor a CUSUM alarm needs to be critical (None: CUSUM alone suffices).
        critical_drift: recent median / anchor that is critical, whatever the CUSUM, once ``lost_control``'s
            recent median is below its early one (a drift that cost reward); None: off.
        lost_control: the stat whose fall makes a drift critical (``reward_mean``).
        control_window: recent observations of ``lost_control`` (at least 5) whose median is compared with its
            early median.
        advice: what to do, appended to the message.
    """

    metric: str = ""
    window: int = 50
    slack: float = 1.0
    warn_h: float = 15.0
    critical_h: float = 40.0
    min_sigma: float = 0.05
    z_cap: float = 5.0
    floor: float = 1e-8
    warn_above: float | None = None
    critical_above: float | None = None
    anchor: int = 10
    recent: int = 5
    drift_ratio: float | None = None
    critical_ratio: float | None = None
    critical_drift: float | None = None
    lost_control: str = "reward_mean"
    control_window: int = 20
    advice: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        for f in ("drift_ratio", "critical_ratio", "critical_drift"):
            if (v := getattr(self, f)) is not None and v <= 1.0:
                raise ValueError(f"{self.name}.{f} must be > 1 (a ratio to the early baseline) or None; got {v}.")
        if self.anchor < 3 or self.recent < 1:
            raise ValueError(f"{self.name}: need anchor >= 3 and recent >= 1; got {self.anchor}, {self.recent}.")
        self._s_window = RollingWindow(self.window)
        self._s_recent = RollingWindow(self.recent)
        self._s_anchor: list[float] = []
        self._s_cusum = 0.0
        self._s_cusum_start = -1  # step of the first observation since the CUSUM was last 0 (-1: it is 0)
        self._s_control_anchor: list[float] = []
        self._s_control = RollingWindow(self.control_window)
        self._shift = LevelShift(1.0)  # log values since the last one at or below the anchored baseline
        # the rolling median when the CUSUM last left 0 and the steps and log values of the observations since (the
        # first SHIFT_WINDOW), for the change-point estimate of its alarm
        self._s_rise_base = 0.0
        self._s_rise_steps: list[int] = []
        self._s_rise: list[float] = []
        self._anchor_sorted, self._control_sorted = _EarlySorted(), _EarlySorted()

    def evidence(self, finding: Finding) -> int:
        """A critical finding of the CUSUM (each observation adds at most ``z_cap - slack`` to the sum, so an
        alarm at ``critical_h`` rests on at least ``ceil(critical_h / (z_cap - slack))`` observations above the
        baseline: Page 1954) or of the drift check (the median of the last ``recent`` observations: more than half
        of them beyond the ratio) rests on the smaller of the two counts; an absolute bound on one value, on 1."""
        if finding.absolute:
            return 1
        per_step = self.z_cap - self.slack
        cusum = math.ceil(self.critical_h / per_step) if per_step > 0 else 1
        return max(1, min(cusum, self.recent // 2 + 1))

    def _see_control(self, stats: Mapping[str, float]) -> bool:
        """Track ``lost_control``: whether this step's value joined its recent window (its early one being full)."""
        value = stats.get(self.lost_control)
        if value is None or not math.isfinite(value):
            return False
        if len(self._s_control_anchor) < self.anchor:
            self._s_control_anchor.append(float(value))
            return False
        self._s_control.push(float(value))
        return True

    def _control_lost(self) -> str | None:
        """After :meth:`_see_control` took a value: a description if the recent median of ``lost_control`` is below
        its early median by more than a standard error (``sqrt(pi / 2n)`` robust sigmas, the median's). Read only
        where a drift needs it (the window sorts its values when read)."""
        early, recent = _anchor_median(self._s_control_anchor, self._control_sorted), self._s_control.median()
        n = len(self._s_control)
        if early is None or n < min(5, self.control_window) or recent >= early:
            return None  # (at or above its early median it is above it less a standard error, which is >= 0)
        # a fall beyond a standard error of the recent median: a flat noisy reward does not count as lost
        standard_error = self._s_control.sigma() * math.sqrt(math.pi / 2 / n)
        if recent >= early - standard_error:
            return None
        return f"{self.lost_control} fell from {early:.4g} (early median) to {recent:.4g} (recent median)"

    def change_point(self) -> int | None:
        """Where the condition found began. While the CUSUM is above 0: among the observations since it was last 0
        (Page's 1954 estimate of the change is the first of them; Montgomery, *Introduction to Statistical Quality
        Control*, sec. 9.1), the maximum-likelihood change from the baseline the CUSUM measured against, a shift of
        level or a ramp, whichever fits better (:func:`~rlguard.guards.detectors.base.rise_onset`): Page's estimate
        is the change point of a shift of the ``2 * slack`` sigmas the CUSUM is tuned to, so a small elevation that
        starts it accumulating well before a much larger shift dates that shift early. Page's estimate where the
        observations since are not all held (more than :data:`~rlguard.guards.detectors.base.SHIFT_WINDOW`, or a
        state saved before they were kept) or the estimate is not read (:attr:`LevelShift.read`). While the CUSUM is
        0 (a finding of the drift check or the absolute bounds: a level, not a sum), the least-squares change of
        level of the log values since the last one at or below the anchored baseline (:class:`LevelShift`)."""
        if self._s_cusum_start >= 0:
            steps, rise = self._s_rise_steps, self._s_rise
            held = 0 < len(steps) == len(rise) < SHIFT_WINDOW and steps[0] == self._s_cusum_start
            at = rise_onset(rise, self._s_rise_base) if held and self._shift.read else None
            return self._s_cusum_start if at is None else steps[at]
        return self._shift.change_point()

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        value = stats.get(self.metric)
        if value is None or not math.isfinite(value):
            return None
        finding = self._judge(step, float(value), stats, armed)
        self._shift.judged(finding, self.clear_after)
        return finding

    def _judge(self, step: int, value: float, stats: Mapping[str, float], armed: bool) -> Finding | None:
        finding = None
        if self.warn_above is not None or self.critical_above is not None:  # absolute bounds set
            finding = _absolute(self.metric, value, self.warn_above, self.critical_above, self.advice)
        # max and min below are written as their comparisons: the builtins cost more to call (Python 3.11)
        x = math.log(low if (low := self.floor) > value else value)
        controlled = self.critical_drift is not None and self._see_control(stats)
        recent = self._s_recent
        recent.push(x)
        early = self._s_anchor
        # _anchor_median (None below 3 values; unchanged until returned), without its call: the hot path
        anchor = self._anchor_sorted.median(early) if len(early) >= 3 else None
        window = self._s_window
        self._shift.see(step, x, anchor is None or x <= anchor)
        if len(window) < 3 or not armed:
            window.push(x)
            if finding is None and len(early) < self.anchor:
                early.append(x)
            return finding
        cusum, floor, slack, median = self._s_cusum, self.min_sigma, self.slack, window.median()
        if cusum <= 0.0 <= slack and floor > 0.0 and (x - median) / floor <= slack and x <= median + 2.0 * floor:
            # sigma >= min_sigma > 0, so z <= slack (the statistic stays 0) and x <= median + 2 sigma (x is taken as
            # it is): the same as below without the MAD (rounded division and addition are monotone)
            cusum, self._s_cusum, self._s_cusum_start = 0.0, 0.0, -1
            window.push(x)
        else:
            median, spread = window.location_scale()  # the window's robust z and sigma, read once
            sigma = floor if floor > spread else spread
            z = (x - median) / sigma
            cusum = self._s_cusum = cusum_step(cusum, cap if (cap := self.z_cap) < z else z, slack)
            if cusum == 0.0:
                self._s_cusum_start = -1
            else:
                if self._s_cusum_start < 0:
                    self._s_cusum_start = step
                    self._s_rise_base = median
                    self._s_rise_steps, self._s_rise = [], []
                if len(self._s_rise) < SHIFT_WINDOW:
                    self._s_rise_steps.append(step)
                    self._s_rise.append(x)
            window.push(top if (top := median + 2.0 * sigma) < x else x)
        drift = math.exp(recent.median() - anchor) if anchor is not None else 1.0
        if cusum >= self.warn_h and _rank(finding) < 2:
            critical = cusum >= self.critical_h and (self.critical_ratio is None or drift >= self.critical_ratio)
            bound = self.critical_h if critical else self.warn_h
            base = math.exp(window.median())
            ratio = math.exp(x - anchor) if anchor is not None else math.inf
            early_text = f", {ratio:.1f}x the early baseline {math.exp(anchor):.4g}" if anchor is not None else ""
            trend = Finding(
                "critical" if critical else "warn",
                value,
                bound,
                f"{self.metric}={value:.4g}: a sustained rise: CUSUM {cusum:.1f} >= {bound:g} (rolling "
                f"median {base:.4g}{early_text}). {self.advice}".rstrip(),
            )
            finding = trend if _rank(trend) > _rank(finding) else finding
        drift_critical = controlled and self.critical_drift is not None and drift >= self.critical_drift
        if drift_critical and anchor is not None and _rank(finding) < 2 and (lost := self._control_lost()):
            finding = Finding(
                "critical",
                drift,
                self.critical_drift or 0.0,
                f"{self.metric}: its recent median {math.exp(recent.median()):.4g} is {drift:.1f}x the run's "
                f"early baseline {math.exp(anchor):.4g} (threshold {self.critical_drift:g}x) and {lost}. "
                f"{self.advice}".rstrip(),
            )
        if finding is None and self.drift_ratio is not None and anchor is not None and drift >= self.drift_ratio:
            finding = Finding(
                "warn",
                drift,
                self.drift_ratio,
                f"{self.metric}: a slow drift: its recent median {math.exp(recent.median()):.4g} is "
                f"{drift:.1f}x the run's early baseline {math.exp(anchor):.4g} (threshold {self.drift_ratio:g}x). "
                f"{self.advice}".rstrip(),
            )
        if finding is None and cusum == 0.0 and len(early) < self.anchor:
            early.append(x)
        return finding
