"""Where each detector judged and what it found over a log's timeline (:class:`~rlguard.guards.consequence.offline.
Timeline`), read once per timeline and kept with it: the consequence rule's passes (labels, the alarms' replay,
excursions) visit a detector's findings, a few steps of a long log, not each of its observations once per pass.

Between two findings of a detector, what its alarm does depends only on how many clean observations lie between
them (its hysteresis counts them): that is the difference of the findings' indices among its observations
(:func:`observation_index`).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from array import array
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from rlguard.guards.events import Finding

if TYPE_CHECKING:
    from rlguard.guards.consequence.offline import Timeline

__all__ = ["found_positions", "observation_index", "observed_positions"]


def observed_positions(timeline: Timeline, name: str) -> Sequence[int]:
    """The positions (indices into ``timeline``) of the steps detector ``name`` judged, increasing: a ``range``
    where it judged every step, else an ``array('q')`` (8 bytes a position, where a list costs 36)."""
    key = ("observed", name)
    if key not in timeline.index:
        observed = timeline.observed
        judged = list(map(operator.contains, observed, itertools.repeat(name)))  # the loop in C: 24 detectors a step
        if all(judged):
            timeline.index[key] = range(len(observed))
        else:
            timeline.index[key] = array("q", itertools.compress(range(len(observed)), judged))
    return timeline.index[key]  # type: ignore[return-value]


def found_positions(timeline: Timeline, name: str) -> Mapping[int, Finding]:
    """Position -> the finding of detector ``name`` there, at the steps it judged, by increasing position (read only:
    shared by every pass over the timeline)."""
    key = ("found", name)
    if key not in timeline.index:
        findings = timeline.findings
        if "any" not in timeline.index:  # the positions with a finding of any detector: most steps have none
            timeline.index["any"] = array("q", itertools.compress(range(len(findings)), findings))
        somewhere = cast("array[int]", timeline.index["any"])
        every = isinstance(observed_positions(timeline, name), range)
        observed = timeline.observed
        timeline.index[key] = {
            p: f for p in somewhere if (f := findings[p].get(name)) is not None and (every or name in observed[p])
        }
    return timeline.index[key]  # type: ignore[return-value]


def observation_index(obs: Sequence[int], position: int) -> int:
    """The index among a detector's observations ``obs`` (:func:`observed_positions`) of the one at ``position``."""
    return position - obs.start if isinstance(obs, range) else bisect.bisect_left(obs, position)
