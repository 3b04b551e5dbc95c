"""The threshold shape: :class:`ThresholdDetector`, absolute bounds on a fraction or a rate, optionally above the
run's own baseline (one of the three generic shapes of :mod:`~rlguard.guards.detectors.shapes`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from rlguard.guards.detectors.base import Detector
from rlguard.guards.events import Finding, Severity
from rlguard.guards.robust import RollingWindow


@dataclass(kw_only=True)
class ThresholdDetector(Detector):
    """Absolute bounds on a metric that is a fraction or a rate, above the run's own level by ``margin``.

    Attributes:
        metric: the stat to watch.
        warn: value that warns; critical: value that is critical.
        margin: a finding also needs ``value >= baseline median + margin`` (0: absolute bounds only).
        window: healthy steps in the baseline.
        advice: what to do, appended to the message.
    """

    metric: str = ""
    warn: float = 0.5
    critical: float = 0.9
    margin: float = 0.0
    window: int = 50
    advice: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warn > self.critical:
            raise ValueError(f"{self.name}: warn ({self.warn}) must not exceed critical ({self.critical}).")
        self._s_window = RollingWindow(self.window)
        # the step of the first observation in the critical condition in the current run of them (-1: none) and the
        # observations out of it since the last one: warm-up observations count (the bound is absolute)
        self._s_run_start, self._s_run_gap = -1, 0

    def baseline_needed(self) -> int | None:
        """None where a finding also needs the value ``margin`` above the run's own level; else 0 (absolute bounds)."""
        return None if self.margin > 0 else 0

    def critical_condition(self, value: float) -> bool:
        """Whether ``value`` is the critical condition by the absolute bound alone (before any baseline margin)."""
        return value >= self.critical

    def change_point(self) -> int | None:
        """Where a critical condition judged by the absolute bound alone began: the first observation in the
        critical condition (:meth:`critical_condition`) in the run of them (separated by fewer than ``clear_after``
        others: the alarm's hysteresis) that the last observation belongs to, warm-up observations included. The
        warm-up of such a detector learns no baseline of its stat (``baseline_needed`` is fixed), so a value in
        the condition during it is the condition already present, not yet judged: its onset is not where the
        warm-up ended. None with a ``margin`` (an observation is read against the run's own level, which the
        warm-up learns) or out of the condition now."""
        if self.baseline_needed() is None or self._s_run_start < 0 or self._s_run_gap:
            return None
        return self._s_run_start

    def level(self, value: float) -> tuple[Severity, float] | None:
        """Severity and bound crossed by ``value``, before the baseline margin."""
        if value >= self.critical:
            return "critical", self.critical
        if value >= self.warn:
            return "warn", self.warn
        return None

    def describe(self, value: float, bound: float, stats: Mapping[str, float]) -> str:
        """The finding's message; subclasses add context."""
        return f"{self.metric}={value:.4g} >= {bound:g}. {self.advice}".rstrip()

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        value = stats.get(self.metric)
        if value is None or not math.isfinite(value):
            return None
        value = float(value)
        if not self.critical_condition(value):
            self._s_run_gap += 1
        else:
            if self._s_run_start < 0 or self._s_run_gap >= max(self.clear_after, 1):
                self._s_run_start = step
            self._s_run_gap = 0
        hit = self.level(value) if armed else None
        near = hit is not None and self.margin > 0 and len(self._s_window) >= 3  # the baseline read only then
        if near and value < self._s_window.median() + self.margin:
            hit = None
        if hit is None:
            self._s_window.push(value)
            return None
        severity, bound = hit
        return Finding(severity, value, bound, self.describe(value, bound, stats))
