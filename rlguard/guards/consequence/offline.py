"""The consequence rule over a whole log, with hindsight (the doctor): :func:`label_findings` labels each critical
finding by what followed it, :func:`judge_log` replays the alarms with those labels, :func:`relabel` revisits the
events a live guard recorded. The rule itself is :mod:`rlguard.guards.consequence.rule`."""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from rlguard.guards.consequence.index import FindingIndex, episode_bounds
from rlguard.guards.consequence.rule import (
    CONTROL_CLASSES,
    ConsequenceRule,
    RecoveryWatch,
    converged,
    sustained_count,
    sustained_why,
)
from rlguard.guards.events import SEVERITY_LEVEL, Event, Finding, Severity

if TYPE_CHECKING:
    from rlguard.guards.detectors.base import Detector

__all__ = ["Timeline", "judge_log", "label_findings", "relabel"]


@dataclass(frozen=True)
class Timeline:
    """A log as the guard judged it, one entry per logged step.

    Attributes:
        steps: the logged steps, increasing.
        rewards: ``reward_mean`` at each step (NaN where the step has none).
        findings: each step's findings by detector (``Guard.last_findings``).
        observed: the detectors that judged each step (the step carried their stats).
        change_points: at each step, detector -> the step at which the condition it found there began, by its own
            change-point estimate (``Detector.change_point``; only detectors that give one); empty: none known.
        index: what the rule reads of the timeline (:class:`FindingIndex`), kept by whoever grows the timeline so
            that a judgement reads only the steps added since the last; None: read from the timeline whole.
    """

    steps: Sequence[int]
    rewards: Sequence[float]
    findings: Sequence[Mapping[str, Finding]]
    observed: Sequence[frozenset[str]]
    change_points: Sequence[Mapping[str, int]] = ()
    index: FindingIndex | None = field(default=None, compare=False, repr=False)


def timeline_index(timeline: Timeline) -> FindingIndex:
    """``timeline.index`` brought up to the timeline's end (a new index read whole where it has none)."""
    index = timeline.index if timeline.index is not None else FindingIndex()
    index.sync(timeline.observed, timeline.findings, timeline.rewards)
    return index


def observed_positions(timeline: Timeline, name: str) -> Sequence[int]:
    """The positions (indices into ``timeline``) of the steps detector ``name`` judged, increasing: a ``range``
    where it judged every step, else an ``array('q')`` (8 bytes a position, where a list costs 36)."""
    return timeline_index(timeline).positions(name)


@dataclass(frozen=True)
class _Episode:
    first: int  # position (index into the timeline) of its first finding
    last: int  # position of its last finding
    first_obs: int  # index of its first finding among the detector's observations


def _episodes(found: Sequence[tuple[int, int, Finding]], clear_after: int) -> dict[int, _Episode]:
    """position of each finding (``FindingIndex.found``) -> its episode: findings separated by fewer than
    ``clear_after`` clean observations (the alarm's hysteresis) belong together."""
    out: dict[int, _Episode] = {}
    for first, last, first_obs in episode_bounds(found, clear_after):
        ep = _Episode(found[first][1], found[last][1], first_obs)
        out.update({found[i][1]: ep for i in range(first, last + 1)})
    return out


class _Reward:
    """What the labels ask of the reward, cached per episode: the established peak (the index's
    :class:`~rlguard.guards.consequence.history.RewardHistory`, brought up to the timeline's end when first asked),
    whether it rose over an episode's window and whether it was at the top there. ``index``: the timeline's."""

    def __init__(self, rewards: Sequence[float], rule: ConsequenceRule, index: FindingIndex) -> None:
        self.rewards, self.rule, self.history = rewards, rule, index.history
        self.cache: dict[tuple[str, int, int], bool] = {}
        self.lowest, self.highest = index.lowest, index.highest

    def established(self, before: int) -> bool:
        key = ("peak", before, 0)
        if key not in self.cache:
            self.history.read(self.rewards)
            self.cache[key] = self.history.established(before, self.rule)
        return self.cache[key]

    def rises(self, lo: int, hi: int) -> bool:
        key = ("rises", lo, hi)
        if key not in self.cache:
            self.history.read(self.rewards)
            self.cache[key] = self.history.rises(lo, hi, self.rule.trend_z)  # reward_rises over lo..hi, kept
        return self.cache[key]

    def at_top(self, lo: int, hi: int) -> bool:
        key = ("top", lo, hi)
        if key not in self.cache:
            self.cache[key] = _at_top(self.rewards, lo, hi, self.lowest, self.highest)
        return self.cache[key]


def _first_within(positions: Sequence[int], lo: int, hi: int) -> int | None:
    """The first of the sorted ``positions`` in ``lo..hi``, or None."""
    i = bisect.bisect_left(positions, lo)
    return positions[i] if i < len(positions) and positions[i] <= hi else None


def _label(
    name: str,
    det: Detector,
    timeline: Timeline,
    obs: Sequence[int],
    mine_found: Sequence[tuple[int, int, Finding]],
    intrinsic: Mapping[str, list[int]],
    classes: Mapping[str, str],
    rule: ConsequenceRule,
    reward: _Reward,
) -> tuple[dict[int, tuple[Severity, str]], set[int]]:
    """Labels of ``name``'s critical findings (position -> severity, why) and the positions that are critical in
    themselves (unrecoverable or sustained), given the other detectors' ``intrinsic`` criticals; ``obs``, its
    observed positions, ``mine_found`` its findings (``FindingIndex``)."""
    n = len(timeline.steps)
    found = {p: f for _, p, f in mine_found}
    critical = [k for k, _, f in mine_found if f.severity == "critical"]
    is_critical = set(critical)
    episodes = _episodes(mine_found, det.clear_after)
    kind = classes.get(name, "control")
    labels: dict[int, tuple[Severity, str]] = {}
    mine: set[int] = set()

    lost_at: dict[tuple[int, int], str | None] = {}  # per episode's window: its findings share it

    def lost_control(lo: int, hi: int) -> str | None:
        if (lo, hi) not in lost_at:
            lost_at[lo, hi] = next(
                (
                    f"{other} at step {timeline.steps[hit]}"
                    for other, positions in intrinsic.items()
                    if other != name and classes.get(other, "control") in CONTROL_CLASSES
                    if (hit := _first_within(positions, lo, hi)) is not None
                ),
                None,
            )
        return lost_at[lo, hi]

    for k in critical:
        p = obs[k]
        f, ep = found[p], episodes[p]
        if f.unrecoverable:
            labels[p] = ("critical", "")
            mine.add(p)
            continue
        if kind == "reward" and not reward.established(ep.first):
            labels[p] = ("warn", "no established reward peak to collapse from (never clearly above its start)")
            continue
        sustained = sustained_why(sustained_count(is_critical.__contains__, k, rule), det.evidence(f), rule)
        if sustained is None:
            continue  # a lone observation: judged once the others' intrinsic criticals are known
        window_end = min(ep.last + rule.horizon, n - 1)
        rising = reward.rises(ep.first, window_end)
        from_start = ep.first_obs < det.warmup + rule.start
        lost = lost_control(ep.first, window_end)
        drift = kind == "drift" and not f.absolute
        if rising and lost is None and (kind == "budget" or from_start or drift):
            where = (
                "present from the first observations"
                if from_start
                else "a condition of the generation budget"
                if kind == "budget"
                else "a drift above the run's baseline (below its absolute bound)"
            )
            labels[p] = ("warn", f"{where}, while the reward rose and nothing lost control")
        elif kind in _AT_TOP and lost is None and reward.at_top(ep.first, window_end):
            labels[p] = ("warn", _AT_TOP[kind])
        else:
            labels[p] = ("critical", sustained)
            mine.add(p)
    # the first observations of an exempted episode (before it counted as sustained) share its label
    exempt = {episodes[p]: lab for p, lab in labels.items() if lab[0] == "warn"}
    for k in critical:
        if obs[k] not in labels and episodes[obs[k]] in exempt:
            labels[obs[k]] = exempt[episodes[obs[k]]]
    return labels, mine


#: the classes whose condition costs nothing at a converged reward, and why: the budget's consequence is reward lost,
#: and groups without reward variance at the top of the range are solved (the detector's own :func:`converged`,
#: applied with the hindsight of the reward over the condition and the horizon after it)
_AT_TOP = {
    "budget": "a condition of the generation budget at a converged reward: it costs no reward",
    "signal": "groups without reward variance at a converged reward (over the horizon after it): nothing left to learn",
}


def _at_top(rewards: Sequence[float], lo: int, hi: int, lowest: float, highest: float) -> bool:
    """Whether the reward's median over positions ``lo..hi`` is converged (:func:`converged`: at least 0.8 of its
    range over the log, widened to ``[0, 1]``). A condition of the budget there costs no reward: the rule judges by
    consequence, and the consequence of hitting the budget is reward lost. ``lowest``, ``highest``: the extremes
    of the finite rewards over the log."""
    seen = [r for r in rewards[lo : hi + 1] if math.isfinite(r)]
    return bool(seen) and converged(statistics.median(seen), lowest, highest)


def _lone(
    name: str,
    timeline: Timeline,
    obs: Sequence[int],
    mine_found: Sequence[tuple[int, int, Finding]],
    labels: dict[int, tuple[Severity, str]],
    intrinsic: Mapping[str, list[int]],
    classes: Mapping[str, str],
    rule: ConsequenceRule,
    reward: _Reward,
) -> None:
    """Label ``name``'s lone critical observations: critical when lost control follows within the horizon or
    recovery does not show within it; a warning otherwise (and for a class of :data:`_AT_TOP` at a converged reward
    over the horizon, nothing losing control). A lone observation near the end of the log that has
    not had the chance to recover (the log ends before recovery or its absence could show) is unresolved: a
    warning that says so. Principle: the rule needs what followed, and nothing followed; unrecoverable and
    sustained findings need no future and stay critical."""
    n = len(timeline.steps)
    for k, p, f in mine_found:
        if f.severity != "critical" or p in labels:
            continue
        hi = min(p + rule.horizon, n - 1)
        own = _first_within(intrinsic.get(name, []), p, hi)
        lost = next(
            (
                f"{other} at step {timeline.steps[q]}"
                for other, positions in intrinsic.items()
                if other != name and classes.get(other, "control") in CONTROL_CLASSES
                if (q := _first_within(positions, p, hi)) is not None
            ),
            None,
        )
        recovery = _recovery(name, timeline, obs, k + 1, p + rule.horizon, rule.recovered)
        seen_after = len(obs) - k - 1
        if own is not None:
            labels[p] = (
                "critical",
                f"sustained: critical in {rule.sustained} of {rule.within} observations by step {timeline.steps[own]}",
            )
        elif lost is not None:
            labels[p] = ("critical", f"followed by lost control ({lost})")
        elif (kind := classes.get(name, "control")) in _AT_TOP and reward.at_top(p, hi):
            labels[p] = ("warn", _AT_TOP[kind])
        elif recovery is None:
            labels[p] = (
                "warn",
                f"unresolved: the log ends {seen_after} observations after it, before recovery could show "
                f"({rule.recovered} clean observations in a row) or lost control did",
            )
        elif not recovery:
            labels[p] = (
                "critical",
                f"no sign of recovery within {rule.horizon} logged steps "
                f"({rule.recovered} clean observations in a row)",
            )
        else:
            labels[p] = (
                "warn",
                "a single observation the run recovered from: nothing lost control after it (the live guard skips "
                "such a step)",
            )


def _recovery(name: str, timeline: Timeline, obs: Sequence[int], first: int, until: int, clean: int) -> bool | None:
    """Whether ``name`` recovered over the positions ``obs[first:]`` (its observations after a lone critical one):
    :class:`RecoveryWatch`; None when the log ends before it could tell (unresolved)."""
    watch = RecoveryWatch(until, clean)
    for k in range(first, len(obs)):
        q = obs[k]
        verdict = watch.see(q, name in timeline.findings[q])
        if verdict is not None:
            return verdict
    return None


def label_findings(
    timeline: Timeline, detectors: Mapping[str, Detector], rule: ConsequenceRule | None = None
) -> dict[str, dict[int, tuple[Severity, str]]]:
    """Detector -> position -> (severity by consequence, why) for each of its critical findings over the log."""
    rule = rule or ConsequenceRule()
    index = timeline_index(timeline)
    classes = {name: det.finding_class for name, det in detectors.items()}
    obs = {name: index.positions(name) for name in detectors}
    found = {name: index.found(name) for name in detectors}
    # each detector's intrinsic critical positions, sorted
    intrinsic: dict[str, list[int]] = {
        name: [p for _, p, f in found[name] if f.severity == "critical"] for name in detectors
    }
    reward = _Reward(timeline.rewards, rule, index)
    labels: dict[str, dict[int, tuple[Severity, str]]] = {}
    for _ in range(3):  # exemptions need the others' intrinsic criticals, which need theirs: iterate to a fixpoint
        results = {
            n: _label(n, d, timeline, obs[n], found[n], intrinsic, classes, rule, reward) for n, d in detectors.items()
        }
        new = {n: sorted(mine) for n, (_, mine) in results.items()}
        labels = {n: lab for n, (lab, _) in results.items()}
        if new == intrinsic:
            break
        intrinsic = new
    for name in detectors:
        _lone(name, timeline, obs[name], found[name], labels[name], intrinsic, classes, rule, reward)
    return labels


def judge_log(
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
    index = timeline_index(timeline)
    events: list[Event] = []
    for name, det in detectors.items():
        level = streak = 0
        previous = -1  # observation index of the previous finding
        for k, p, f in index.found(name):
            clean = k - previous - 1  # clean observations since the previous finding: each clears the streak
            previous = k
            if clean:
                streak = 0
                if level and clean >= det.clear_after:
                    level = 0
            streak += 1
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
    critical within ``rule.horizon`` logged steps from the event, or the event comes after the log's last step (the
    log cannot judge it); otherwise it becomes a warning (the live guard decided on the step itself), *unresolved*
    where the log ends within the horizon (as :func:`label_findings` labels a lone finding there). Events of
    detectors that could not judge the log, and the guard's actions, are kept as recorded."""
    rule = rule or ConsequenceRule()
    steps = timeline.steps
    out = []
    for e in events:
        if e.severity != "critical" or e.detector.startswith("action:") or e.detector not in checked:
            out.append(e)
            continue
        at = bisect.bisect_left(steps, e.step)
        mine = labels.get(e.detector, {})
        lasting = at >= len(steps) or any(
            mine.get(q, ("warn", ""))[0] == "critical" for q in range(at, at + rule.horizon + 1)
        )
        note = " [warn in hindsight: the log shows it did not last and nothing lost control after it]"
        if at + rule.horizon >= len(steps):
            note = " [warn in hindsight: unresolved: the log ends before it could show whether it lasted]"
        out.append(e if lasting else replace(e, severity="warn", message=e.message + note))
    return out
