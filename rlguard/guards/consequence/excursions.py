"""A detector's findings over a log as excursions: each episode of its findings (separated by its alarm's
hysteresis, ``Detector.clear_after`` clean observations) is its own finding, with its own onset, end, severity
by consequence and outcome.

Why: an alarm that clears and rises again is two conditions, not one. The onset of a critical finding is the
start of the excursion that became critical, not the first excursion ever: a user who rolls back to the onset of
a blow-up at step 565 must not be sent back to a recovered excursion at step 134.

The onset is the first finding of the streak that raised the alarm (``patience`` findings in a row: sporadic
findings before it are what patience rejects). For a critical excursion it is the first of the detector's own
critical observations in the run of them that became critical (critical observations separated by fewer than
``clear_after`` others, the hysteresis of the alarm's critical level): a stretch of warnings before it (groups
solved, then groups failed) is the excursion's precursor (``Excursion.alarm``), not its onset. A detector that
estimates where its condition began (``Detector.change_point``: a CUSUM alarm dates the shift to the first
observation since the statistic was last 0, the standard CUSUM change-point estimate; Page 1954, Montgomery,
*Introduction to Statistical Quality Control*, sec. 9.1) moves the onset back to that estimate, never into its
previous excursion: a CUSUM accumulates for several observations before it crosses a bound, and the shift began
where the accumulation did. What would make it fail: a small elevation that a CUSUM starts accumulating some
observations before the real failure dates the onset early; a detector without an estimate whose critical level is
reached late in a slow drift reports the onset where the drift became critical, after the labelled onset.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from rlguard.guards.consequence.offline import observed_positions
from rlguard.guards.consequence.rule import ConsequenceRule
from rlguard.guards.events import SEVERITY_LEVEL, Finding, Severity

if TYPE_CHECKING:
    from rlguard.guards.consequence.offline import Timeline
    from rlguard.guards.detectors.base import Detector

__all__ = ["Excursion", "Outcome", "excursions"]

#: how an excursion ended: ``recovered`` (``rule.recovered`` clean observations of its detector followed it),
#: ``relapsed`` (the detector found again first), ``unresolved`` (the log ended first: no chance to recover)
Outcome = Literal["recovered", "relapsed", "unresolved"]


@dataclass(frozen=True)
class Excursion:
    """One episode of a detector's findings that raised its alarm (a streak of ``patience`` findings).

    Attributes:
        detector: the detector's registered name.
        onset: step of the first finding of the streak that raised the alarm; for a critical excursion, the first
            critical observation of the run of them that became critical.
        end: step of its last finding.
        severity: the highest severity by consequence of its findings that raised the alarm.
        severity_step: the step at which it first reached ``severity``.
        outcome: how it ended (:data:`Outcome`).
        findings: how many logged steps of the detector within it had a finding.
        alarm: step of the first finding of the streak that raised the alarm (before ``onset`` where warnings
            preceded the critical condition).
    """

    detector: str
    onset: int
    end: int
    severity: Severity
    severity_step: int
    outcome: Outcome
    findings: int
    alarm: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "onset": self.onset,
            "end": self.end,
            "severity": self.severity,
            "severity_step": self.severity_step,
            "outcome": self.outcome,
            "findings": self.findings,
            "alarm": self.alarm,
        }


def excursions(
    timeline: Timeline,
    detectors: Mapping[str, Detector],
    labels: Mapping[str, Mapping[int, tuple[Severity, str]]],
    rule: ConsequenceRule | None = None,
) -> dict[str, list[Excursion]]:
    """Detector -> its excursions over the log, in order; ``labels`` are
    :func:`~rlguard.guards.consequence.offline.label_findings`'s (the severity by consequence of each critical
    finding). Only excursions that raised the alarm are kept (a streak of ``patience`` findings), as the events."""
    rule = rule or ConsequenceRule()
    out: dict[str, list[Excursion]] = {}
    for name, det in detectors.items():
        obs = observed_positions(timeline, name)
        found = {p: f for p in obs if (f := timeline.findings[p].get(name)) is not None}
        mine = labels.get(name, {})
        groups = _groups(obs, found, det.clear_after)
        out[name] = [
            ex for group in groups if (ex := _excursion(name, det, timeline, obs, group, found, mine, rule)) is not None
        ]
        at = _Observed(array("q", (timeline.steps[p] for p in obs)), groups)
        out[name] = [_backdate(ex, name, timeline, obs, at) for ex in out[name]]
    return out


class _Observed:
    """A detector's observed steps (increasing) and the last step of each of its episodes, for bisection."""

    def __init__(self, steps: Sequence[int], groups: list[list[int]]) -> None:
        self.steps = steps
        self.ends = [steps[g[-1]] for g in groups]


def _backdate(ex: Excursion, name: str, timeline: Timeline, obs: Sequence[int], observed: _Observed) -> Excursion:
    """``ex`` with its onset moved back to its detector's change-point estimate at the onset
    (``Timeline.change_points``: a CUSUM's alarm dates the shift to the first observation since its statistic was
    last 0, Page 1954), where that is earlier; never back into the detector's previous excursion."""
    points, steps = timeline.change_points, observed.steps
    k = bisect.bisect_left(steps, ex.onset)
    if not points or k == len(steps) or steps[k] != ex.onset or (cp := points[obs[k]].get(name)) is None:
        return ex
    if cp >= ex.onset:
        return ex
    # the previous episode ends at the last episode end before the onset (an episode that ends before it starts
    # before it); the new onset is the first observed step at or after the estimate and after that end
    before = bisect.bisect_left(observed.ends, ex.onset)
    first = bisect.bisect_left(steps, cp)
    if before:
        first = max(first, bisect.bisect_right(steps, observed.ends[before - 1]))
    return replace(ex, onset=min(steps[first], ex.onset)) if first < len(steps) else ex


def _groups(obs: Sequence[int], found: Mapping[int, Finding], clear_after: int) -> list[list[int]]:
    """The detector's observation indices from each episode's first finding to its last: findings separated by
    fewer than ``clear_after`` clean observations belong together (the alarm's hysteresis, as
    :func:`~rlguard.guards.consequence.offline._episodes`)."""
    groups: list[list[int]] = []
    clean = 0
    for k, p in enumerate(obs):
        if p not in found:
            clean += 1
            continue
        if not groups or clean >= max(clear_after, 1):
            groups.append([])
        groups[-1].extend(range(groups[-1][-1] + 1, k) if groups[-1] else ())
        groups[-1].append(k)
        clean = 0
    return groups


def _excursion(
    name: str,
    det: Detector,
    timeline: Timeline,
    obs: Sequence[int],
    group: list[int],
    found: Mapping[int, Finding],
    labels: Mapping[int, tuple[Severity, str]],
    rule: ConsequenceRule,
) -> Excursion | None:
    streak, best, reached, onset = 0, 0, -1, -1
    for k in group:
        p = obs[k]
        streak = streak + 1 if p in found else 0
        if not streak:
            continue
        if streak == det.patience and onset < 0:
            onset = obs[k - det.patience + 1]  # the first finding of the streak that raised the alarm
        severity = labels.get(p, (found[p].severity, ""))[0]
        if streak >= det.patience and SEVERITY_LEVEL[severity] > best:
            best, reached = SEVERITY_LEVEL[severity], p
    if reached < 0:
        return None
    critical, alarm = best == SEVERITY_LEVEL["critical"], onset
    if critical:
        onset = _critical_onset(obs, group, found, reached, det.clear_after)
    last = group[-1]
    after = obs[last + 1 : last + 1 + rule.recovered]
    clean = next((i for i, q in enumerate(after) if q in found), len(after))
    outcome: Outcome = "recovered" if clean >= rule.recovered else "relapsed" if clean < len(after) else "unresolved"
    steps = timeline.steps
    return Excursion(
        name,
        steps[onset],
        steps[obs[last]],
        "critical" if critical else "warn",
        steps[reached],
        outcome,
        sum(1 for k in group if obs[k] in found),
        steps[alarm],
    )


def _critical_onset(
    obs: Sequence[int], group: list[int], found: Mapping[int, Finding], reached: int, clear_after: int
) -> int:
    """Where the critical condition began: the first of the detector's own critical observations in the run of
    them (separated by fewer than ``clear_after`` other observations, the hysteresis of the alarm's critical level)
    that leads to ``reached``. A stretch of warnings before it is the excursion's precursor, not its onset."""
    onset, gap = -1, clear_after
    for k in group:
        p = obs[k]
        if p in found and found[p].severity == "critical":
            onset = p if gap >= max(clear_after, 1) else onset
            gap = 0
        else:
            gap += 1
        if p == reached:
            break
    return onset if onset >= 0 else reached
