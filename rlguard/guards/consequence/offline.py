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

from rlguard.guards.consequence.episodes import (
    CRITICAL,
    SUSTAINED,
    SUSTAINED_ABSOLUTE,
    UNRECOVERABLE,
    Episode,
    Episodes,
    Verdict,
)
from rlguard.guards.consequence.index import FindingIndex
from rlguard.guards.consequence.rule import (
    CONTROL_CLASSES,
    ConsequenceRule,
    RecoveryWatch,
    converged,
)
from rlguard.guards.events import Event, Finding, Severity

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


#: detector -> its findings by episode and the level of each episode's findings critical in themselves
#: (:meth:`Episodes.first_within`)
_Intrinsic = dict[str, tuple["Episodes", list[int]]]


def _lost_control(
    name: str, timeline: Timeline, intrinsic: _Intrinsic, classes: Mapping[str, str], lo: int, hi: int
) -> str | None:
    """The first other detector of a control class critical in itself in positions ``lo..hi``, and where."""
    return next(
        (
            f"{other} at step {timeline.steps[hit]}"
            for other, (episodes, levels) in intrinsic.items()
            if other != name and classes.get(other, "control") in CONTROL_CLASSES
            if (hit := episodes.first_within(levels, lo, hi)) is not None
        ),
        None,
    )


def _verdict(
    name: str,
    det: Detector,
    ep: Episode,
    timeline: Timeline,
    intrinsic: _Intrinsic,
    classes: Mapping[str, str],
    rule: ConsequenceRule,
    reward: _Reward,
) -> tuple[Verdict, int]:
    """The verdict on ``name``'s episode ``ep`` (:data:`~rlguard.guards.consequence.episodes.Verdict`: the
    warning its findings carry, if any) and the level of its findings critical in themselves
    (:meth:`Episode.positions`), given the other detectors' ``intrinsic`` criticals. A reward's episode without an
    established peak is a warning; a sustained episode is a warning where the reward rose over its window and
    nothing lost control, and it is present from the first observations, a condition of the budget or a drift
    below the absolute bound, or where its class costs nothing at a converged reward (:data:`_AT_TOP`);
    otherwise its sustained findings are critical."""
    kind = classes.get(name, "control")
    if kind == "reward" and ep.recoverable and not reward.established(ep.first):
        return ("no established reward peak to collapse from (never clearly above its start)", False), UNRECOVERABLE
    if len(ep.sets[SUSTAINED]) == len(ep.sets[UNRECOVERABLE]):  # nothing sustained: its lone findings, later
        return (None, False), SUSTAINED
    window_end = min(ep.last + rule.horizon, len(timeline.steps) - 1)
    rising = reward.rises(ep.first, window_end)
    from_start = ep.first_obs < det.warmup + rule.start
    lost = _lost_control(name, timeline, intrinsic, classes, ep.first, window_end)
    if rising and lost is None and (kind == "budget" or from_start):
        where = "present from the first observations" if from_start else "a condition of the generation budget"
        return (f"{where}, while the reward rose and nothing lost control", False), UNRECOVERABLE
    if rising and lost is None and kind == "drift":
        if not ep.relative:
            return (None, False), SUSTAINED
        where = "a drift above the run's baseline (below its absolute bound)"
        return (f"{where}, while the reward rose and nothing lost control", True), SUSTAINED_ABSOLUTE
    if kind in _AT_TOP and lost is None and reward.at_top(ep.first, window_end):
        return (_AT_TOP[kind], False), UNRECOVERABLE
    return (None, False), SUSTAINED


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
    episodes: Episodes,
    verdicts: Sequence[Verdict],
    intrinsic: _Intrinsic,
    classes: Mapping[str, str],
    rule: ConsequenceRule,
    reward: _Reward,
) -> None:
    """Label ``name``'s lone critical observations (neither unrecoverable nor sustained, in an episode whose verdict
    carries no warning): critical when lost control follows within the horizon or
    recovery does not show within it; a warning otherwise (and for a class of :data:`_AT_TOP` at a converged reward
    over the horizon, nothing losing control). A lone observation near the end of the log that has
    not had the chance to recover (the log ends before recovery or its absence could show) is unresolved: a
    warning that says so. Principle: the rule needs what followed, and nothing followed; unrecoverable and
    sustained findings need no future and stay critical."""
    n = len(timeline.steps)
    own_episodes, own_levels = intrinsic[name]
    kind = classes.get(name, "control")
    for ep, (warning, _) in zip(episodes.episodes, verdicts, strict=True):
        if warning is not None:
            continue
        settling = True  # the lone findings before this one stay
        for j in range(ep.settled, len(ep.lone)):
            i = ep.lone[j]
            k, p, _f = mine_found[i]
            label: tuple[Severity, str]
            hi = min(p + rule.horizon, n - 1)
            own = own_episodes.first_within(own_levels, p, hi)
            lost = _lost_control(name, timeline, intrinsic, classes, p, hi)
            recovery = episodes.recovered.get(i)
            if recovery is None:
                recovery, told = _recovery(name, timeline, obs, k + 1, p + rule.horizon, rule.recovered)
                if recovery is not None and told < n - 1:  # told by steps that stay (not the last, which may change)
                    episodes.recovered[i] = recovery
            seen_after = len(obs) - k - 1
            if own is not None:
                label = (
                    "critical",
                    f"sustained: critical in {rule.sustained} of {rule.within} observations by step "
                    f"{timeline.steps[own]}",
                )
            elif lost is not None:
                label = ("critical", f"followed by lost control ({lost})")
            elif kind in _AT_TOP and reward.at_top(p, hi):
                label = ("warn", _AT_TOP[kind])
            elif recovery is None:
                label = (
                    "warn",
                    f"unresolved: the log ends {seen_after} observations after it, before recovery could show "
                    f"({rule.recovered} clean observations in a row) or lost control did",
                )
            elif not recovery:
                label = (
                    "critical",
                    f"no sign of recovery within {rule.horizon} logged steps "
                    f"({rule.recovered} clean observations in a row)",
                )
            else:
                label = (
                    "warn",
                    "a single observation the run recovered from: nothing lost control after it (the live guard "
                    "skips such a step)",
                )
            episodes.write(ep, i, label)
            # it stays where what decided it stays: its horizon and recovery told by steps before the last, the
            # reward's range over the log (``at_top``) not asked; an intrinsic critical changing in it unsettles it
            stays = p + rule.horizon < n - 1 and i in episodes.recovered
            if settling and stays and (own is not None or lost is not None or kind not in _AT_TOP):
                ep.settled = j + 1
            else:
                settling = False


def _recovery(
    name: str, timeline: Timeline, obs: Sequence[int], first: int, until: int, clean: int
) -> tuple[bool | None, int]:
    """Whether ``name`` recovered over the positions ``obs[first:]`` (its observations after a lone critical one):
    :class:`RecoveryWatch`; None when the log ends before it could tell (unresolved). And the position at which it
    could tell (``len(timeline.steps)`` where it could not)."""
    watch = RecoveryWatch(until, clean)
    for k in range(first, len(obs)):
        q = obs[k]
        verdict = watch.see(q, name in timeline.findings[q])
        if verdict is not None:
            return verdict, q
    return None, len(timeline.steps)


def label_findings(
    timeline: Timeline, detectors: Mapping[str, Detector], rule: ConsequenceRule | None = None
) -> dict[str, dict[int, tuple[Severity, str]]]:
    """Detector -> position -> (severity by consequence, why) for each of its critical findings over the log. Each
    episode of a detector's findings gets one verdict (:func:`_verdict`), its lone findings one label each
    (:func:`_lone`). The labels are those the timeline's index keeps (:meth:`FindingIndex.episodes`), written again
    only for an episode whose verdict changed: read them before the timeline grows."""
    rule = rule or ConsequenceRule()
    index = timeline_index(timeline)
    classes = {name: det.finding_class for name, det in detectors.items()}
    episodes = {name: index.episodes(name, det, rule) for name, det in detectors.items()}
    # each detector's intrinsic criticals: every critical finding at first
    intrinsic: _Intrinsic = {name: (e, [CRITICAL] * len(e.episodes)) for name, e in episodes.items()}
    reward = _Reward(timeline.rewards, rule, index)
    verdicts: dict[str, list[Verdict]] = {}
    for _ in range(3):  # exemptions need the others' intrinsic criticals, which need theirs: iterate to a fixpoint
        results = {
            n: [_verdict(n, d, ep, timeline, intrinsic, classes, rule, reward) for ep in episodes[n].episodes]
            for n, d in detectors.items()
        }
        verdicts = {n: [v for v, _ in r] for n, r in results.items()}
        new: _Intrinsic = {n: (episodes[n], [level for _, level in r]) for n, r in results.items()}
        if all(episodes[n].same(new[n][1], intrinsic[n][1]) for n in detectors):
            break
        intrinsic = new
    changed = [  # the episodes whose intrinsic criticals changed since the last lone findings were labelled
        (ep.first, ep.last)
        for name in detectors
        for ep, old, level in zip(episodes[name].episodes, episodes[name].levels, intrinsic[name][1], strict=False)
        if old != level
    ]
    for name in detectors:
        episodes[name].unsettle(changed, rule.horizon)
        episodes[name].levels = list(intrinsic[name][1])
        episodes[name].apply(index.found(name), verdicts[name])
        _lone(
            name, timeline, index.positions(name), index.found(name), episodes[name], verdicts[name], intrinsic,
            classes, rule, reward,
        )  # fmt: skip
    return {name: e.labels for name, e in episodes.items()}


def judge_log(
    timeline: Timeline,
    detectors: Mapping[str, Detector],
    rule: ConsequenceRule | None = None,
    labels: Mapping[str, Mapping[int, tuple[Severity, str]]] | None = None,
) -> list[Event]:
    """The detectors' events over the log with severity by consequence, in step order: each detector's alarm is
    replayed as the guard raises it (``patience`` findings in a row, cleared after ``clear_after`` clean
    observations: :meth:`Episodes.replay`), from its findings labelled by :func:`label_findings` (or ``labels``,
    already computed); a label's reason ends its message."""
    rule = rule or ConsequenceRule()
    labels = labels if labels is not None else label_findings(timeline, detectors, rule)
    index = timeline_index(timeline)
    events = [
        event
        for name, det in detectors.items()
        for ep, episodes in labelled_episodes(index, name, det, rule, labels)
        for _, event in episodes.replay(ep, index.found(name), det, timeline.steps, name)
    ]
    return sorted(events, key=lambda e: e.step)


def labelled_episodes(
    index: FindingIndex,
    name: str,
    det: Detector,
    rule: ConsequenceRule,
    labels: Mapping[str, Mapping[int, tuple[Severity, str]]],
) -> list[tuple[Episode, Episodes]]:
    """``name``'s episodes with ``labels``: the index's (:meth:`FindingIndex.episodes`), where ``labels`` are its
    own (:func:`label_findings` of this timeline); else episodes of their own, read whole, with ``labels``."""
    episodes = index.episodes(name, det, rule)
    if labels.get(name) is not episodes.labels:
        episodes = Episodes(det.clear_after, rule)
        episodes.read(index.found(name), det)
        episodes.labels = dict(labels.get(name, {}))
    return [(ep, episodes) for ep in episodes.episodes]


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
