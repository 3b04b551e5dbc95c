"""What the consequence rule reads of a timeline, kept up to date as it grows (:class:`FindingIndex`): each
detector's observed positions and its findings among them, and the extremes of the finite rewards.

Why: the rule labels a finding by its episode and the ``rule.horizon`` logged steps after it, so all it needs of a
long log is where each detector observed and where it found something; findings are rare. Reading that from the
timeline at every judgement costs the whole log each time (``rlguard watch`` judges a growing log again and again);
kept here, a judgement reads only the positions added since the last (:meth:`FindingIndex.sync`) and then works on
the findings, not on the steps.

Memory, beyond the timeline itself: per detector one int64 per observed position where the detector skipped a step
(none for a detector that observed every step: a ``range``), one tuple per finding, and two floats; and each
detector's findings by episode with their labels (:class:`~rlguard.guards.consequence.episodes.Episodes`, kept
here so that a judgement labels only what changed since the last).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlguard.guards.consequence.episodes import Episodes
from rlguard.guards.consequence.history import RewardHistory

if TYPE_CHECKING:
    from rlguard.guards.consequence.rule import ConsequenceRule
    from rlguard.guards.detectors.base import Detector
    from rlguard.guards.events import Finding

__all__ = ["FindingIndex", "IndexMark"]

#: the rewards read at a time for their extremes (:meth:`FindingIndex.sync`)
_CHUNK = 1 << 14


@dataclass(frozen=True)
class IndexMark:
    """The state of a :class:`FindingIndex` to come back to (:meth:`FindingIndex.restore`)."""

    n: int
    counts: dict[str, int]
    lengths: dict[str, int]
    found: dict[str, int]
    lowest: float
    highest: float


class FindingIndex:
    """Each detector's observed positions and findings over a timeline's first :attr:`n` positions.

    Attributes:
        n: the positions read (:meth:`sync`).
        lowest: the least finite reward over them (the first where tied, as ``min``); NaN without one.
        highest: the greatest (the first where tied, as ``max``); NaN without one.
    """

    def __init__(self) -> None:
        self.n = 0
        self.lowest, self.highest = math.nan, math.nan
        self._counts: dict[str, int] = {}  # detector -> its observations
        self._sparse: dict[str, array[int]] = {}  # detector -> its observed positions, once it skipped one
        self._found: dict[str, list[tuple[int, int, Finding]]] = {}  # detector -> (observation, position, finding)
        self._dense: set[str] = set()  # the detectors that observed every position so far
        #: the finite rewards, read when the rule first asks of the whole series (an established peak)
        self.history = RewardHistory()
        self._episodes: dict[str, Episodes] = {}  # detector -> its findings by episode, and their labels

    def sync(
        self, observed: Sequence[frozenset[str]], findings: Sequence[Mapping[str, Finding]], rewards: Sequence[float]
    ) -> None:
        """Read the positions ``n..len(observed)-1``: which detectors observed each (``observed``), their findings
        there (``findings``; a finding of a detector that did not observe the position is not one of its
        observations and is left out, as the rule reads it) and the reward (``rewards``, NaN where absent)."""
        counts, sparse, found, dense = self._counts, self._sparse, self._found, self._dense
        end = len(observed)
        p = self.n
        while p < end:  # a run of positions observed by one set (the fold shares one object per set)
            seen = observed[p]
            q = p + 1
            while q < end and observed[q] is seen:
                q += 1
            if not seen >= dense:  # a detector that observed every position skips this one
                for name in dense - seen:
                    sparse[name] = array("q", range(counts[name]))
                dense &= seen
            for name in seen:
                k = counts.get(name)
                if k is None:  # first observed here: it observed every position only if this is the first
                    k = 0
                    if p:
                        sparse[name] = array("q")
                    else:
                        dense.add(name)
                if name in sparse:
                    sparse[name].extend(range(p, q))
                counts[name] = k + q - p
            for r in range(p, q):
                here = findings[r]
                if here:
                    for name, f in here.items():
                        if name in seen:  # its observation index: counts[name] - 1 at r
                            found.setdefault(name, []).append((counts[name] - q + r, r, f))
            p = q
        # the extremes of the finite rewards, a slice of _CHUNK at a time (a slice is a copy: 8 MB for 1,000,000
        # steps); ``min`` and ``max`` keep the first where tied, and a later chunk replaces only a strictly lower
        # or higher extreme: the first where tied, as one by one
        for a in range(self.n, end, _CHUNK):
            chunk = rewards[a : min(a + _CHUNK, end)]
            lowest = min(filter(math.isfinite, chunk), default=math.nan)
            highest = max(filter(math.isfinite, chunk), default=math.nan)
            if not lowest >= self.lowest and lowest == lowest:  # NaN at first
                self.lowest = lowest
            if not highest <= self.highest and highest == highest:
                self.highest = highest
        self.n = max(self.n, len(observed))

    def mark(self) -> IndexMark:
        """The index as it is, to :meth:`restore` (the fold judges a last step that may still change)."""
        return IndexMark(
            self.n,
            dict(self._counts),
            {name: len(a) for name, a in self._sparse.items()},
            {name: len(f) for name, f in self._found.items()},
            self.lowest,
            self.highest,
        )

    def restore(self, mark: IndexMark) -> None:
        """Forget the positions read since ``mark`` was taken."""
        self.n, self.lowest, self.highest = mark.n, mark.lowest, mark.highest
        self.history.forget(mark.n)
        self._counts = dict(mark.counts)
        for name in list(self._sparse):
            if name in mark.lengths:
                del self._sparse[name][mark.lengths[name] :]
            else:  # first observed, or first skipped a position, since the mark
                del self._sparse[name]
        for name, episodes in self._episodes.items():
            episodes.truncate(self.found(name), mark.found.get(name, 0))
        for name in list(self._found):
            del self._found[name][mark.found.get(name, 0) :]
        self._dense = {name for name in self._counts if name not in self._sparse}

    def positions(self, name: str) -> Sequence[int]:
        """The positions at which ``name`` observed, increasing (a ``range`` where it observed every one)."""
        if name in self._sparse:
            return self._sparse[name]
        return range(self._counts.get(name, 0))

    def count(self, name: str) -> int:
        """How many positions ``name`` observed."""
        return self._counts.get(name, 0)

    def found(self, name: str) -> Sequence[tuple[int, int, Finding]]:
        """``name``'s findings at its observations, in order: (observation index, position, finding)."""
        return self._found.get(name, ())

    def episodes(self, name: str, det: Detector, rule: ConsequenceRule) -> Episodes:
        """``name``'s findings by episode (:class:`~rlguard.guards.consequence.episodes.Episodes`), read up to its
        last finding; read again from its first where ``det``'s hysteresis or the ``rule`` differ from those it
        was read with."""
        episodes = self._episodes.get(name)
        if episodes is None or episodes.key != Episodes.key_for(det.clear_after, rule):
            episodes = self._episodes[name] = Episodes(det.clear_after, rule)
        episodes.read(self.found(name), det)
        return episodes

    def found_at(self, name: str) -> dict[int, Finding]:
        """Position -> ``name``'s finding there, for its findings at its observations."""
        return {p: f for _, p, f in self.found(name)}
