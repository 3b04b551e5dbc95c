"""A detector's findings by episode, with what the consequence rule's labels read of each, kept up to date as
findings are appended (:class:`Episodes`, one per detector in a
:class:`~rlguard.guards.consequence.index.FindingIndex`).

Why: during a long critical episode every record adds a finding, and the rule's verdict on the episode (did the
reward rise over its window, did another detector lose control in it, was the reward at the top) is one verdict
for all its findings; what differs between its findings is fixed when each is made (unrecoverable, sustained and
why, absolute). So the labels of an episode are a function of that verdict: which findings of the episode are
critical in themselves is one of four nested sets kept here (:data:`CRITICAL` ⊇ :data:`SUSTAINED` ⊇
:data:`SUSTAINED_ABSOLUTE` ⊇ :data:`UNRECOVERABLE`), and the labels written for an episode are written again only
where its verdict changes (:meth:`Episodes.apply`). A judgement then costs the findings appended since the last,
the episodes (a verdict each) and the lone findings, not the findings of an episode going on.

Memory: per finding its position, observation index and sustained reason (or None); per critical finding up to four
int64 (its position in each set it is in); per detector the labels written.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlguard.guards.consequence.rule import ConsequenceRule, sustained_count, sustained_why

if TYPE_CHECKING:
    from rlguard.guards.detectors.base import Detector
    from rlguard.guards.events import Finding, Severity

from rlguard.guards.events import SEVERITY_LEVEL, Event

__all__ = ["CRITICAL", "SUSTAINED", "SUSTAINED_ABSOLUTE", "UNRECOVERABLE", "Episode", "Episodes", "Verdict"]

#: which of an episode's critical findings are critical in themselves (:meth:`Episode.positions`): nested sets
UNRECOVERABLE, SUSTAINED_ABSOLUTE, SUSTAINED, CRITICAL = range(4)

#: an episode's verdict: the warning its findings that are not critical in themselves carry (None: none is a
#: warning), and whether its absolute sustained findings stay critical (a drift's exemption spares only those
#: below the absolute bound)
Verdict = tuple[str | None, bool]


class Episode:
    """One episode of a detector's findings: findings separated by fewer than ``clear_after`` clean observations
    (the alarm's hysteresis).

    Attributes:
        first_i: index (into the detector's findings, ``FindingIndex.found``) of its first finding.
        last_i: of its last.
        first_obs: the observation index of its first finding.
        first: position (index into the timeline) of its first finding.
        last: position of its last finding.
        recoverable: its critical findings that are not unrecoverable.
        relative: its sustained findings that are not absolute (``Finding.absolute``).
        lone: indices (into the findings) of its critical findings neither unrecoverable nor sustained.
        settled: how many of the first of them have labels that stay while no episode of any detector within the
            rule's horizon after them changes what of it is critical in itself (:meth:`Episodes.unsettle`).
        applied: the verdict its labels were written with (:meth:`Episodes.apply`), and up to which finding.
    """

    __slots__ = ("applied", "applied_to", "checkpoints", "dirty", "events", "first", "first_i", "first_obs", "last",
                 "last_i", "lone", "onset", "recoverable", "relative", "sets", "settled")  # fmt: skip

    def __init__(self, i: int, k: int, p: int) -> None:
        self.first_i = self.last_i = i
        self.first_obs = k
        self.first = self.last = p
        self.sets = tuple(array("q") for _ in range(4))  # the positions of each set (:meth:`positions`)
        self.recoverable = self.relative = 0
        self.lone: list[int] = []
        self.settled = 0  # the first lone findings whose labels stay (``offline._lone``)
        self.applied: Verdict | None = None
        self.applied_to = i
        self.dirty = i  # the first finding whose label changed since the alarm's replay (:meth:`Episodes.replay`)
        #: the replay's state after some of its findings (finding index, level, streak, observation, events), the
        #: last two: the one before its last finding is where the replay goes on after the fold takes that back
        self.checkpoints: list[tuple[int, int, int, int, int]] = []
        self.events: list[tuple[int, Event]] = []  # the alarm's events in it: (position, event)
        self.onset: tuple[int, int] | None = None  # (reached, critical onset) (``excursions._critical_onset``)

    def positions(self, level: int) -> array[int]:
        """The positions, increasing, of its critical findings that are critical in themselves under a verdict at
        ``level``: :data:`UNRECOVERABLE` (those only), :data:`SUSTAINED_ABSOLUTE` (and the absolute sustained ones),
        :data:`SUSTAINED` (and every sustained one), :data:`CRITICAL` (every critical finding)."""
        return self.sets[level]


class Episodes:
    """A detector's findings (``FindingIndex.found``) by episode, read as they are appended (:meth:`read`) and
    forgotten from the end (:meth:`truncate`), and the labels of its critical findings (:attr:`labels`, position
    -> (severity by consequence, why)), written by :meth:`apply`.

    ``clear_after``: the detector's alarm hysteresis; ``rule``: the rule whose ``within`` and ``sustained`` say which
    findings are sustained (a finding's sustained reason is fixed when it is read: it looks back only), and whose
    ``horizon`` and ``recovered`` say whether a lone one recovered (:attr:`recovered`)."""

    def __init__(self, clear_after: int, rule: ConsequenceRule) -> None:
        self.key = self.key_for(clear_after, rule)
        self.clear_after, self.rule = max(clear_after, 1), rule
        self.episodes: list[Episode] = []
        self.firsts, self.lasts = array("q"), array("q")  # each episode's first and last position
        self.positions, self.observations = array("q"), array("q")  # each finding's
        self.why: list[str | None] = []  # each finding's sustained reason (None: not critical, or not sustained)
        self.labels: dict[int, tuple[Severity, str]] = {}
        #: finding -> whether the detector recovered after it, for lone findings where the log told before its last
        #: step (``offline._recovery``: it reads the detector's own findings after it, which stay)
        self.recovered: dict[int, bool] = {}
        self.levels: list[int] = []  # each episode's level (:meth:`Episode.positions`) when lone ones were labelled

    @staticmethod
    def key_for(clear_after: int, rule: ConsequenceRule) -> tuple[int, ...]:
        """What the episodes and what is kept of them depend on besides the findings."""
        return (clear_after, rule.within, rule.sustained, rule.horizon, rule.recovered)

    @property
    def n(self) -> int:
        """The findings read."""
        return len(self.positions)

    def read(self, found: Sequence[tuple[int, int, Finding]], det: Detector) -> None:
        """Read the findings ``found[n:]`` (observation index, position, finding) of detector ``det``."""
        for i in range(self.n, len(found)):
            k, p, f = found[i]
            if not self.episodes or k - self.observations[-1] - 1 >= self.clear_after:
                self.episodes.append(Episode(i, k, p))
                self.firsts.append(p)
                self.lasts.append(p)
            ep = self.episodes[-1]
            ep.last_i, ep.last = i, p
            self.lasts[-1] = p
            self.positions.append(p)
            self.observations.append(k)
            why = None
            if f.severity == "critical":
                sets = ep.sets
                sets[CRITICAL].append(p)
                if f.unrecoverable:
                    for level in (UNRECOVERABLE, SUSTAINED_ABSOLUTE, SUSTAINED):
                        sets[level].append(p)
                else:
                    ep.recoverable += 1
                    recent = sustained_count(self._recent_critical(found, i).__contains__, k, self.rule)
                    why = sustained_why(recent, det.evidence(f), self.rule)
                    if why is None:
                        ep.lone.append(i)
                    else:
                        sets[SUSTAINED].append(p)
                        if f.absolute:
                            sets[SUSTAINED_ABSOLUTE].append(p)
                        else:
                            ep.relative += 1
            self.why.append(why)

    def _recent_critical(self, found: Sequence[tuple[int, int, Finding]], i: int) -> set[int]:
        """The observation indices of the critical findings among the last ``rule.within`` findings up to ``i``
        (those that :func:`sustained_count` can count: observation indices increase)."""
        return {
            found[j][0] for j in range(max(i - self.rule.within + 1, 0), i + 1) if found[j][2].severity == "critical"
        }

    def truncate(self, found: Sequence[tuple[int, int, Finding]], m: int) -> None:
        """Forget the findings from ``m`` on (``found``: the findings as read, before they are truncated)."""
        while self.n > m:
            i = self.n - 1
            p, f, why = self.positions.pop(), found[i][2], self.why.pop()
            self.observations.pop()
            ep = self.episodes[-1]
            self.labels.pop(p, None)
            self.recovered.pop(i, None)
            if f.severity == "critical":
                for positions in ep.sets:
                    if positions and positions[-1] == p:
                        positions.pop()
                if not f.unrecoverable:
                    ep.recoverable -= 1
                    if why is None:
                        ep.lone.pop()
                        ep.settled = min(ep.settled, len(ep.lone))
                    elif not f.absolute:
                        ep.relative -= 1
            ep.onset = None
            if ep.first_i == i:
                self.episodes.pop()
                self.firsts.pop()
                self.lasts.pop()
            else:
                ep.last_i, ep.last = i - 1, self.positions[-1]
                self.lasts[-1] = ep.last
                ep.applied_to = min(ep.applied_to, i)

    def unsettle(self, changed: Sequence[tuple[int, int]], horizon: int) -> None:
        """Label again the lone findings within ``horizon`` positions before or in a range of positions in
        ``changed`` (episodes, of any detector, whose findings critical in themselves changed)."""
        for a, b in changed:
            for j in range(bisect.bisect_left(self.lasts, a - horizon), bisect.bisect_right(self.firsts, b)):
                ep = self.episodes[j]
                x = bisect.bisect_left(ep.lone, a - horizon, hi=ep.settled, key=self.positions.__getitem__)
                if x < ep.settled and self.positions[ep.lone[x]] <= b:
                    ep.settled = x

    def first_within(self, levels: Sequence[int], lo: int, hi: int) -> int | None:
        """The first position in ``lo..hi`` of a finding critical in itself, each episode's at its level in
        ``levels`` (:meth:`Episode.positions`), or None."""
        for j in range(bisect.bisect_left(self.lasts, lo), bisect.bisect_right(self.firsts, hi)):
            positions = self.episodes[j].sets[levels[j]]
            x = bisect.bisect_left(positions, lo)
            if x < len(positions) and positions[x] <= hi:
                return positions[x]
        return None

    def same(self, a: Sequence[int], b: Sequence[int]) -> bool:
        """Whether levels ``a`` and ``b`` (one per episode) select the same positions: the sets are nested, so
        those of one episode are the same where they are as many."""
        return all(x == y or len(ep.sets[x]) == len(ep.sets[y]) for ep, x, y in zip(self.episodes, a, b, strict=True))

    def apply(self, found: Sequence[tuple[int, int, Finding]], verdicts: Sequence[Verdict]) -> None:
        """Write the labels of each episode's critical findings under its verdict (one per episode): those of an
        episode whose verdict is the one written last are written only for its findings appended since. An
        unrecoverable finding is critical; a sustained one is critical with its reason unless the verdict's warning
        spares it; a lone one (neither) carries the verdict's warning, and is left to the lone findings' judgement
        (not written) without one."""
        labels = self.labels
        for ep, verdict in zip(self.episodes, verdicts, strict=True):
            start = ep.applied_to if ep.applied == verdict else ep.first_i
            if start == ep.first_i:
                ep.settled = 0
            warning, absolute_critical = verdict
            for i in range(start, ep.last_i + 1):
                f = found[i][2]
                if f.severity != "critical":
                    continue
                p, why = self.positions[i], self.why[i]
                if f.unrecoverable:
                    self.write(ep, i, ("critical", ""))
                elif why is None:
                    if warning is None:
                        if labels.pop(p, None) is not None:
                            ep.dirty = min(ep.dirty, i)
                    else:
                        self.write(ep, i, ("warn", warning))
                elif warning is not None and not (absolute_critical and f.absolute):
                    self.write(ep, i, ("warn", warning))
                else:
                    self.write(ep, i, ("critical", why))
            ep.applied, ep.applied_to = verdict, ep.last_i + 1

    def write(self, ep: Episode, i: int, label: tuple[Severity, str]) -> None:
        """Label finding ``i`` of episode ``ep``; a label that changes marks the episode's replay from there."""
        p = self.positions[i]
        if self.labels.get(p) != label:
            self.labels[p] = label
            ep.dirty = min(ep.dirty, i)

    def replay(
        self, ep: Episode, found: Sequence[tuple[int, int, Finding]], det: Detector, steps: Sequence[int], name: str
    ) -> list[tuple[int, Event]]:
        """The events of ``name``'s alarm in episode ``ep`` (position, event), replayed as the guard raises it:
        ``patience`` findings in a row raise it at the severity of the last (its label by consequence, else its
        own); it rises to a higher severity the same way; each episode starts it again (``clear_after`` clean
        observations cleared it). Replayed from the last state whose findings' labels have not changed since."""
        state = next((c for c in reversed(ep.checkpoints) if c[0] <= min(ep.last_i + 1, ep.dirty)), None)
        start, level, streak, previous, count = state or (ep.first_i, 0, 0, ep.first_obs - 1, 0)
        del ep.events[count:]
        checkpoints = [c for c in ep.checkpoints if c[0] <= start]
        labels = self.labels
        for i in range(start, ep.last_i + 1):
            if i == ep.last_i:
                checkpoints = [*checkpoints[-1:], (i, level, streak, previous, len(ep.events))]
            k, p, f = found[i]
            if k - previous - 1:  # a clean observation between: the streak starts again
                streak = 0
            previous, streak = k, streak + 1
            severity, why = labels.get(p, (f.severity, ""))
            if streak >= det.patience and SEVERITY_LEVEL[severity] > level:
                level = SEVERITY_LEVEL[severity]
                note = f" [{severity}: {why}]" if why else ""
                ep.events.append((p, Event(steps[p], name, severity, f.value, f.message + note, f.threshold)))
        before = [c for c in checkpoints if c[0] <= ep.last_i][-1:]
        ep.checkpoints = [*before, (ep.last_i + 1, level, streak, previous, len(ep.events))]
        ep.dirty = ep.last_i + 1
        return ep.events
