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
estimates where its condition began (``Detector.change_point``) moves the onset back to that estimate, never into
its previous excursion, read with the rule's hindsight (at the excursion's last finding within ``rule.horizon``
logged steps of its onset). A CUSUM alarm dates the shift to the first observation since the statistic was last 0,
the standard CUSUM change-point estimate (Page 1954; Montgomery, *Introduction to Statistical Quality Control*,
sec. 9.1): a CUSUM accumulates for several observations before it crosses a bound. A finding that judges a shift
of level (a drawdown from the best level, a ratio to the early baseline) dates it by the least-squares change point
of the level since the stat was last at the detector's baseline, refined by binary segmentation
(:func:`~rlguard.guards.detectors.base.level_shift`). What would make it fail: a small elevation that a CUSUM
starts accumulating some observations before the real failure dates the onset early; a steady ramp is split into
significant steps and dated late in it; a noisy gradual decline is dated to its largest shift.

The run's onset is a property of the run, not of a detector's statistic (an entropy blow-up that subsides after
230 steps of a destroyed run ended as an excursion; the run did not recover), so the run's recovery is judged by
its reward (:func:`recovered_incidents`): a critical excursion after which the reward fell from the level it had
before it and came back to that level is a recovered incident, reported with its own onset; the run's onset is
the earliest onset of a critical excursion from the reward's last such recovery on. The level is the median of
the ``rule.anchor`` rewards before the excursion; "fell" is a window of ``rule.peak_observations`` consecutive
rewards whose median is below the level less the margin (at least 3 of 5: the rule's run count), "came back" a
later window whose median is at least the level less the margin and the median of the rewards since the fall
plus the margin (back at the level, and clearly out of the fall). The margin
(:func:`~rlguard.guards.consequence.rule.level_margin`) is 3 standard errors of the difference between a window's
median and the level, or a tenth of the reward's range. A reward whose noise is as wide as its level (one
prompt's 8 samples per step, 0 or 1 each) cannot fall below it: nothing is a recovered incident. What would make
it fail: a
failure that inflates the reward (it rises as the failure grows) or returns it to its level for 3 of 5 records
mid-collapse reads as a recovery (a reward that fell by about the margin and stayed down does so in about 1% of
Gaussian or binomial runs, ``tests/guards/consequence/test_excursions.py``); a return shorter than 3 records
cannot be seen.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from rlguard.guards.consequence.history import RewardHistory
from rlguard.guards.consequence.offline import labelled_episodes, timeline_index
from rlguard.guards.consequence.rule import ConsequenceRule, level_margin_from_noise
from rlguard.guards.events import Event, Finding, Severity
from rlguard.guards.robust import Picked

if TYPE_CHECKING:
    from rlguard.guards.consequence.episodes import Episode
    from rlguard.guards.consequence.offline import Timeline
    from rlguard.guards.detectors.base import Detector

__all__ = ["Excursion", "Incident", "Outcome", "excursions", "recovered_incidents"]

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
    finding). Only excursions that raised the alarm are kept (a streak of ``patience`` findings), as the events:
    an excursion is an episode of the alarm's replay (:meth:`~rlguard.guards.consequence.episodes.Episodes.replay`)
    with events, from the first (the alarm) to the last (the severity reached)."""
    rule = rule or ConsequenceRule()
    index = timeline_index(timeline)
    out: dict[str, list[Excursion]] = {}
    for name, det in detectors.items():
        obs = index.positions(name)
        found = index.found(name)
        labelled = labelled_episodes(index, name, det, rule, labels)
        mine = [
            _excursion(name, det, timeline, obs, ep, events, found, rule)
            for ep, episodes in labelled
            if (events := episodes.replay(ep, found, det, timeline.steps, name))
        ]
        ends = [timeline.steps[ep.last] for ep, _ in labelled]
        at = _Observed(timeline.steps, obs, ends)
        out[name] = [_backdate(ex, name, timeline, obs, at, rule.horizon) for ex in mine]
    return out


class _Observed:
    """A detector's observed steps (increasing) and the last step of each of its episodes, for bisection: through
    the timeline's steps and the observed positions (``bisect`` of a step among the observed steps is that of its
    position among the observed positions: steps increase with positions)."""

    def __init__(self, timeline_steps: Sequence[int], obs: Sequence[int], ends: list[int]) -> None:
        self._timeline_steps, self._obs = timeline_steps, obs
        self.steps = Picked(timeline_steps, obs)  # the steps at the observed positions
        self.ends = ends

    def bisect_left(self, step: int) -> int:
        """``bisect.bisect_left(self.steps, step)``."""
        return bisect.bisect_left(self._obs, bisect.bisect_left(self._timeline_steps, step))

    def bisect_right(self, step: int) -> int:
        """``bisect.bisect_right(self.steps, step)``."""
        return bisect.bisect_left(self._obs, bisect.bisect_right(self._timeline_steps, step))


def _backdate(
    ex: Excursion, name: str, timeline: Timeline, obs: Sequence[int], observed: _Observed, horizon: int
) -> Excursion:
    """``ex`` with its onset moved back to its detector's change-point estimate (``Timeline.change_points``: a CUSUM
    alarm's Page 1954 estimate, the first observation since its statistic was last 0; a shift of level's
    least-squares change point), where that is earlier; never back into the detector's previous excursion. The
    estimate is read with the hindsight the consequence rule judges with: at the excursion's last finding within
    ``horizon`` logged steps of its onset, where the shift has up to that many observations after it (at the onset
    itself a shift's few observations weigh less than a longer, smaller elevation before it)."""
    points, steps = timeline.change_points, observed.steps
    k = observed.bisect_left(ex.onset)
    if not points or k == len(steps) or steps[k] != ex.onset:
        return ex
    cp = None
    for j in range(k, len(steps)):
        if obs[j] > obs[k] + horizon or steps[j] > ex.end:
            break
        cp = points[obs[j]].get(name, cp)
    if cp is None or cp >= ex.onset:
        return ex
    # the previous episode ends at the last episode end before the onset (an episode that ends before it starts
    # before it); the new onset is the first observed step at or after the estimate and after that end
    before = bisect.bisect_left(observed.ends, ex.onset)
    first = observed.bisect_left(cp)
    if before:
        first = max(first, observed.bisect_right(observed.ends[before - 1]))
    return replace(ex, onset=min(steps[first], ex.onset)) if first < len(steps) else ex


def _excursion(
    name: str,
    det: Detector,
    timeline: Timeline,
    obs: Sequence[int],
    ep: Episode,
    events: list[tuple[int, Event]],
    found: Sequence[tuple[int, int, Finding]],
    rule: ConsequenceRule,
) -> Excursion:
    """Episode ``ep`` of ``name``'s findings as an excursion, from its alarm's ``events`` (position, event: the
    first raised the alarm, ``patience`` findings in a row from the onset, the last reached its severity); ``obs``:
    the detector's observed positions."""
    alarm = obs[bisect.bisect_left(obs, events[0][0]) - det.patience + 1]  # the first finding of the streak
    reached, last_event = events[-1]
    critical = last_event.severity == "critical"
    onset = alarm
    if critical:
        if ep.onset is None or ep.onset[0] != reached:
            ep.onset = (reached, _critical_onset(ep, found, reached, det.clear_after))
        onset = ep.onset[1]
    last_k = found[ep.last_i][0]
    after = min(rule.recovered, len(obs) - last_k - 1)  # the observations after its last finding, up to recovery
    clean = min(found[ep.last_i + 1][0] - last_k - 1, after) if ep.last_i + 1 < len(found) else after
    outcome: Outcome = "recovered" if clean >= rule.recovered else "relapsed" if clean < after else "unresolved"
    steps = timeline.steps
    return Excursion(
        name,
        steps[onset],
        steps[ep.last],
        "critical" if critical else "warn",
        steps[reached],
        outcome,
        ep.last_i - ep.first_i + 1,
        steps[alarm],
    )


def _critical_onset(ep: Episode, found: Sequence[tuple[int, int, Finding]], reached: int, clear_after: int) -> int:
    """Where the critical condition began: the first of the detector's own critical observations in the run of
    them (separated by fewer than ``clear_after`` other observations, the hysteresis of the alarm's critical level)
    that leads to ``reached``. A stretch of warnings before it is the excursion's precursor, not its onset."""
    onset, gap, previous = -1, clear_after, ep.first_obs - 1
    for i in range(ep.first_i, ep.last_i + 1):
        k, p, f = found[i]
        gap += k - previous - 1  # observations without a finding
        previous = k
        if f.severity == "critical":
            onset = p if gap >= max(clear_after, 1) else onset
            gap = 0
        else:
            gap += 1
        if p == reached:
            break
    return onset if onset >= 0 else reached


@dataclass(frozen=True)
class Incident:
    """A critical excursion the run recovered from: after its onset the reward fell from its level and came back
    to it, and a critical excursion began after that (:func:`recovered_incidents`).

    Attributes:
        excursion: the critical excursion.
        level: the reward's level before the first excursion of the incident (the median of the ``rule.anchor``
            rewards before its onset).
        fell: step from which the reward had fallen below the level (less the margin): the first reward below it in
            the first window of ``rule.peak_observations`` rewards after the onset whose median was.
        recovered: step from which the reward was back at the level: the first reward at it in the first later
            window of ``rule.peak_observations`` rewards whose median was.
    """

    excursion: Excursion
    level: float
    fell: int
    recovered: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the excursion's detector, onset, end and severity step, and the reward's recovery."""
        x = self.excursion
        return {
            "detector": x.detector,
            "onset": x.onset,
            "end": x.end,
            "severity_step": x.severity_step,
            "reward_level": self.level,
            "reward_fell": self.fell,
            "reward_recovered": self.recovered,
        }


def _reward_recovery(
    steps: Sequence[int],
    rewards: Sequence[float],
    onset: int,
    rule: ConsequenceRule,
    history: RewardHistory | None = None,
) -> tuple[float, int, int] | None:
    """(level, step it fell, step it was back) for the reward after ``onset``, or None where it did not fall and
    come back (or had no level before: fewer than ``rule.anchor`` rewards). ``history``: the finite rewards
    (:class:`~rlguard.guards.consequence.history.RewardHistory`, read up to the end of ``rewards``; one of its own
    without)."""
    history = history if history is not None else RewardHistory()
    history.read(rewards)
    positions, values = history.positions, history.values
    k0 = bisect.bisect_left(positions, bisect.bisect_left(steps, onset))  # finite rewards before the onset
    n = rule.peak_observations
    if k0 < rule.anchor:
        return None
    level = statistics.median(values[k0 - rule.anchor : k0].tolist())
    count = k0 - 1  # successive differences of the rewards before the onset
    margin = level_margin_from_noise(
        history.sigma(count), history.squares(count), count, history.span(), n, rule.anchor, rule
    )
    found = history.recovery(k0, level - margin, margin, n)
    if found is None:
        return None
    start, back = found
    # the first reward below the bound in the window whose median is: at least 3 of its 5 are
    low = next(k for k in range(start, start + n) if values[k] < level - margin)
    return level, steps[positions[low]], steps[positions[back]]


def recovered_incidents(
    steps: Sequence[int],
    rewards: Sequence[float],
    critical: Sequence[Excursion],
    rule: ConsequenceRule | None = None,
    history: RewardHistory | None = None,
) -> list[Incident]:
    """The critical excursions the run recovered from, in order: from the earliest critical excursion, while the
    reward fell after its onset and came back to its level (:func:`_reward_recovery`) and a critical excursion
    began after that, each critical excursion that began before the recovery is an incident, and the judgement
    starts again from the first one after it. The run's onset is the earliest onset of a critical excursion from
    the last incident's recovery on (the earliest of all without incidents). ``steps``, ``rewards``: the log's
    steps and ``reward_mean`` at each (NaN where absent); ``critical``: the critical excursions of every
    detector; ``history``: their finite rewards kept as the log grows (the timeline's index; read here whole
    without one)."""
    rule = rule or ConsequenceRule()
    history = history if history is not None else RewardHistory()
    pending = sorted(critical, key=lambda x: (x.onset, x.detector))
    out: list[Incident] = []
    while pending:
        found = _reward_recovery(steps, rewards, pending[0].onset, rule, history)
        if found is None:
            break
        level, fell, back = found
        later = [x for x in pending if x.onset >= back]
        if not later:  # nothing critical after the reward came back: the run's failure is this excursion's
            break
        out.extend(Incident(x, level, fell, back) for x in pending if x.onset < back)
        pending = later
    return out
