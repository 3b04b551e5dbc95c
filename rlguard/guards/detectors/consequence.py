"""Severity by consequence: the one rule that says when a detector's finding is critical, for every detector,
absolute bounds included.

``critical`` means the run is failing or will fail:

- the state cannot recover (``Finding.unrecoverable``: non-finite values, one-token completions), or
- the condition is **sustained**: critical in ``sustained`` of ``within`` consecutive observations of its detector
  (the run rules of Shewhart charts: one point beyond the limits may be chance, several in a short run are a
  shift; Western Electric, *Statistical Quality Control Handbook*, 1956), or
- a lone critical observation is **followed by lost control** (a sustained critical finding of a detector of
  reward, entropy, KL, length or gradients within ``horizon`` logged steps after it), or not followed by
  recovery (``recovered`` clean observations in a row of its detector, starting within the horizon).

Everything else is a ``warn``:

- a single observation the run recovered from, whatever its size (the live guard still skips that step: it
  decides on the step itself; this rule needs what followed);
- a condition present from the first observations while the reward rises (the run learns with it);
- a condition of the budget (``truncation``) while the reward rises;
- groups without reward variance in a run whose reward is at the top of its range (converged, nothing left to
  learn: :func:`converged`, applied by the detector itself);
- a reward drawdown without an established peak (:func:`established_peak`): a reward at zero with blips has no
  level to collapse from.

Each detector declares its class (``Detector.consequence``): ``control`` (the default: the condition is a loss of
control), ``budget`` (a property of the generation budget), ``signal`` (groups that carry no gradient) or
``reward`` (a drawdown, which needs a peak). :func:`judge` applies the rule over a log with hindsight (the
doctor); :func:`converged` is applied by ``zero_variance_groups`` on each step, so the live guard labels alike.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rlguard.guards.events import SEVERITY_LEVEL, Event, Finding, Severity
from rlguard.guards.robust import RollingWindow, mann_kendall_z

if TYPE_CHECKING:
    from rlguard.guards.detectors.base import Detector

#: consequence classes whose sustained critical finding is lost control (what makes a lone spike critical)
CONTROL_CLASSES = frozenset({"control", "reward"})


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

    def __post_init__(self) -> None:
        if not 1 <= self.sustained <= self.within:
            raise ValueError(f"ConsequenceRule needs 1 <= sustained <= within; got {self.sustained}, {self.within}.")
        for name in ("horizon", "recovered", "start", "anchor", "peak_observations"):
            if getattr(self, name) < 1:
                raise ValueError(f"ConsequenceRule.{name} must be >= 1; got {getattr(self, name)}.")


@dataclass(frozen=True)
class Timeline:
    """A log as the guard judged it, one entry per logged step.

    Attributes:
        steps: the logged steps, increasing.
        rewards: ``reward_mean`` at each step (NaN where the step has none).
        findings: each step's findings by detector (``Guard.last_findings``).
        observed: the detectors that judged each step (the step carried their stats).
    """

    steps: Sequence[int]
    rewards: Sequence[float]
    findings: Sequence[Mapping[str, Finding]]
    observed: Sequence[frozenset[str]]


# -- the pieces the detectors share -------------------------------------------------------------------------------
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


def established_peak(rewards: Sequence[float], before: int, rule: ConsequenceRule) -> bool:
    """Whether the reward had a peak to collapse from before position ``before``: at least
    ``rule.peak_observations`` observations at which its EWMA was clearly above the run's start (the median of
    its first ``rule.anchor`` observations): by ``rule.peak_sigmas`` sigmas of the EWMA's noise and by
    ``rule.peak_share`` of the reward's range over the whole log (5th to 95th percentile, widened to ``[0, 1]``:
    a blip of a reward at zero is no peak)."""
    seen = [r for r in rewards[:before] if math.isfinite(r)]
    every = sorted(r for r in rewards if math.isfinite(r))
    if len(seen) < rule.anchor + rule.peak_observations:
        return False
    start = statistics.median(seen[: rule.anchor])
    diffs = [b - a for a, b in itertools.pairwise(seen)]
    std = math.sqrt(sum(d * d for d in diffs) / len(diffs))
    noise = max(RollingWindow(len(diffs), diffs).sigma(), std) / math.sqrt(2)
    # the reward's range over the log (5th to 95th percentile), widened to [0, 1] as in normalized_reward
    span = max(every[int(0.95 * (len(every) - 1))], 1.0) - min(every[int(0.05 * (len(every) - 1))], 0.0)
    margin = max(rule.peak_sigmas * noise * math.sqrt(rule.alpha / (2 - rule.alpha)), rule.peak_share * span)
    ewma, above = seen[0], 0
    for r in seen:
        ewma = (1 - rule.alpha) * ewma + rule.alpha * r
        above += ewma > start + margin
    return above >= rule.peak_observations


# -- the rule over a whole log ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Episode:
    first: int  # position (index into the timeline) of its first finding
    last: int  # position of its last finding
    first_obs: int  # index of its first finding among the detector's observations


def _episodes(obs: list[int], found: Mapping[int, Finding], clear_after: int) -> dict[int, _Episode]:
    """position of each finding -> its episode: findings separated by fewer than ``clear_after`` clean
    observations (the alarm's hysteresis) belong together."""
    out: dict[int, _Episode] = {}
    current: list[tuple[int, int]] = []  # (obs index, position)
    clean = 0

    def close() -> None:
        if current:
            ep = _Episode(current[0][1], current[-1][1], current[0][0])
            out.update({p: ep for _, p in current})

    for k, p in enumerate(obs):
        if p in found:
            if clean >= max(clear_after, 1):
                close()
                current = []
            current.append((k, p))
            clean = 0
        else:
            clean += 1
    close()
    return out


def _label(
    name: str,
    det: Detector,
    timeline: Timeline,
    obs: list[int],
    intrinsic: Mapping[str, set[int]],
    classes: Mapping[str, str],
    rule: ConsequenceRule,
) -> tuple[dict[int, tuple[Severity, str]], set[int]]:
    """Labels of ``name``'s critical findings (position -> severity, why) and the positions that are critical in
    themselves (unrecoverable or sustained), given the other detectors' ``intrinsic`` criticals."""
    n = len(timeline.steps)
    found = {p: f for p in obs if (f := timeline.findings[p].get(name)) is not None}
    critical = [k for k, p in enumerate(obs) if p in found and found[p].severity == "critical"]
    is_critical = set(critical)
    episodes = _episodes(obs, found, det.clear_after)
    kind = classes.get(name, "control")
    labels: dict[int, tuple[Severity, str]] = {}
    mine: set[int] = set()

    def lost_control(lo: int, hi: int) -> str | None:
        for other, positions in intrinsic.items():
            if other != name and classes.get(other, "control") in CONTROL_CLASSES:
                hit = next((p for p in sorted(positions) if lo <= p <= hi), None)
                if hit is not None:
                    return f"{other} at step {timeline.steps[hit]}"
        return None

    for k in critical:
        p = obs[k]
        f, ep = found[p], episodes[p]
        if f.unrecoverable:
            labels[p] = ("critical", "")
            mine.add(p)
            continue
        if kind == "reward" and not established_peak(timeline.rewards, ep.first, rule):
            labels[p] = ("warn", "no established reward peak to collapse from (never clearly above its start)")
            continue
        recent = sum(1 for j in range(max(k - rule.within + 1, 0), k + 1) if j in is_critical)
        if recent < rule.sustained:
            continue  # a lone observation: judged once the others' intrinsic criticals are known
        window_end = min(ep.last + rule.horizon, n - 1)
        rising = reward_rises(timeline.rewards[ep.first : window_end + 1], rule.trend_z)
        from_start = ep.first_obs < det.warmup + rule.start
        lost = lost_control(ep.first, window_end)
        if rising and lost is None and (kind == "budget" or from_start):
            where = "present from the first observations" if from_start else "a condition of the generation budget"
            labels[p] = ("warn", f"{where}, while the reward rose and nothing lost control")
        else:
            labels[p] = ("critical", f"sustained: critical in {recent} of {rule.within} observations")
            mine.add(p)
    # the first observations of an exempted episode (before it counted as sustained) share its label
    exempt = {episodes[p]: lab for p, lab in labels.items() if lab[0] == "warn"}
    for k in critical:
        if obs[k] not in labels and episodes[obs[k]] in exempt:
            labels[obs[k]] = exempt[episodes[obs[k]]]
    return labels, mine


def _lone(
    name: str,
    timeline: Timeline,
    obs: list[int],
    labels: dict[int, tuple[Severity, str]],
    intrinsic: Mapping[str, set[int]],
    classes: Mapping[str, str],
    rule: ConsequenceRule,
) -> None:
    """Label ``name``'s lone critical observations: critical when lost control follows within the horizon or the
    log ends before recovery shows; a warning otherwise."""
    n = len(timeline.steps)
    for k, p in enumerate(obs):
        f = timeline.findings[p].get(name)
        if f is None or f.severity != "critical" or p in labels:
            continue
        hi = min(p + rule.horizon, n - 1)
        own = next((q for q in sorted(intrinsic.get(name, ())) if p <= q <= hi), None)
        lost = next(
            (
                f"{other} at step {timeline.steps[q]}"
                for other, positions in intrinsic.items()
                if other != name and classes.get(other, "control") in CONTROL_CLASSES
                for q in sorted(positions)
                if p <= q <= hi
            ),
            None,
        )
        recovery = _recovery(name, timeline, obs[k + 1 :], p + rule.horizon, rule.recovered)
        if own is not None:
            labels[p] = (
                "critical",
                f"sustained: critical in {rule.sustained} of {rule.within} observations by step {timeline.steps[own]}",
            )
        elif lost is not None:
            labels[p] = ("critical", f"followed by lost control ({lost})")
        elif recovery is None:
            why = (
                "the log ends before" if p + rule.horizon >= n else f"no sign of it within {rule.horizon} logged steps:"
            )
            labels[p] = ("critical", f"{why} recovery ({rule.recovered} clean observations in a row)")
        else:
            labels[p] = (
                "warn",
                "a single observation the run recovered from: nothing lost control after it (the live guard skips "
                "such a step)",
            )


def _recovery(name: str, timeline: Timeline, after: list[int], until: int, clean: int) -> int | None:
    """The position where ``name`` recovered: the first of ``clean`` observations in a row without a finding,
    starting at or before position ``until``; None if there is none."""
    streak: list[int] = []
    for q in after:
        if name in timeline.findings[q]:
            streak = []
            if q > until:
                return None
            continue
        if not streak and q > until:
            return None
        streak.append(q)
        if len(streak) >= clean:
            return streak[0]
    return None


def label_findings(
    timeline: Timeline, detectors: Mapping[str, Detector], rule: ConsequenceRule | None = None
) -> dict[str, dict[int, tuple[Severity, str]]]:
    """Detector -> position -> (severity by consequence, why) for each of its critical findings over the log."""
    rule = rule or ConsequenceRule()
    classes = {name: det.consequence for name, det in detectors.items()}
    obs = {name: [p for p, seen in enumerate(timeline.observed) if name in seen] for name in detectors}
    intrinsic: dict[str, set[int]] = {
        name: {p for p in obs[name] if (f := timeline.findings[p].get(name)) is not None and f.severity == "critical"}
        for name in detectors
    }
    labels: dict[str, dict[int, tuple[Severity, str]]] = {}
    for _ in range(3):  # exemptions need the others' intrinsic criticals, which need theirs: iterate to a fixpoint
        results = {n: _label(n, d, timeline, obs[n], intrinsic, classes, rule) for n, d in detectors.items()}
        new = {n: mine for n, (_, mine) in results.items()}
        labels = {n: lab for n, (lab, _) in results.items()}
        if new == intrinsic:
            break
        intrinsic = new
    for name in detectors:
        _lone(name, timeline, obs[name], labels[name], intrinsic, classes, rule)
    return labels


def judge(
    timeline: Timeline,
    detectors: Mapping[str, Detector],
    rule: ConsequenceRule | None = None,
    labels: Mapping[str, Mapping[int, tuple[Severity, str]]] | None = None,
) -> list[Event]:
    """The detectors' events over the log with severity by consequence, in step order: each detector's alarm is
    replayed as the guard raises it (``patience`` findings in a row, cleared after ``clear_after`` clean
    observations), from its findings labelled by :func:`label_findings` (or ``labels``, already computed); a
    label's reason ends its message."""
    labels = labels if labels is not None else label_findings(timeline, detectors, rule)
    events: list[Event] = []
    for name, det in detectors.items():
        level = streak = clean = 0
        for p, seen in enumerate(timeline.observed):
            if name not in seen:
                continue
            f = timeline.findings[p].get(name)
            if f is None:
                streak, clean = 0, clean + 1
                if level and clean >= det.clear_after:
                    level = 0
                continue
            streak, clean = streak + 1, 0
            severity, why = labels.get(name, {}).get(p, (f.severity, ""))
            if streak >= det.patience and SEVERITY_LEVEL[severity] > level:
                level = SEVERITY_LEVEL[severity]
                note = f" [{severity}: {why}]" if why else ""
                events.append(Event(timeline.steps[p], name, severity, f.value, f.message + note, f.threshold))
    return sorted(events, key=lambda e: e.step)


def relabel(
    events: Sequence[Event],
    timeline: Timeline,
    labels: Mapping[str, Mapping[int, tuple[Severity, str]]],
    checked: frozenset[str],
    rule: ConsequenceRule | None = None,
) -> list[Event]:
    """``events`` a live guard recorded, with the hindsight of the log: a critical event of a detector that judged
    the log (``checked``) stays critical if the log's own labels (``labels``, from :func:`label_findings`) have it
    critical within ``rule.horizon`` logged steps from the event, or the log ends sooner; otherwise it becomes a
    warning (the live guard decided on the step itself). Events of detectors that could not judge the log, and
    the guard's actions, are kept as recorded."""
    rule = rule or ConsequenceRule()
    steps = list(timeline.steps)
    out = []
    for e in events:
        if e.severity != "critical" or e.detector.startswith("action:") or e.detector not in checked:
            out.append(e)
            continue
        at = bisect.bisect_left(steps, e.step)
        mine = labels.get(e.detector, {})
        lasting = at + rule.horizon >= len(steps) or any(
            mine.get(q, ("warn", ""))[0] == "critical" for q in range(at, at + rule.horizon + 1)
        )
        note = " [warn in hindsight: the log shows it did not last and nothing lost control after it]"
        out.append(e if lasting else replace(e, severity="warn", message=e.message + note))
    return out
