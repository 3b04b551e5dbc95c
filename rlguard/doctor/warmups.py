"""The detectors' warm-ups fitted to a log's length (:func:`fit_warmups`): each detector's observations counted, once
per set of stat names where the names settle them (:class:`~rlguard.doctor.canonical.NameSet`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from rlguard.doctor.canonical import NameSet, name_sets
from rlguard.doctor.diagnose import WARMUP_SHARE
from rlguard.guards import Guard
from rlguard.guards.alarms import AlarmState
from rlguard.guards.detectors.base import MIN_BASELINE, Detector
from rlguard.guards.observers import Observers

__all__ = ["count_observations", "enough_observations", "fit_plan", "fit_warmups"]


def fit_warmups(guard: Guard, rows: Iterable[Mapping[str, float]]) -> dict[str, int]:
    """Fit each detector's warm-up (stated in observations: logged records that carry its stats) to the log: at
    most ``1/WARMUP_SHARE`` of its observations, never fewer than ``MIN_BASELINE`` nor more than its own, and only
    for a detector with at least ``2 * MIN_BASELINE`` observations (a baseline, then a window of the 3-of-5 run rule
    to judge; fewer cannot be judged). A short or sparse log (21 records logged every 20 steps) is judged instead
    of refused. A detector whose judgement needs a fixed number of observations (``Detector.baseline_needed``:
    0 for absolute bounds alone; ``zero_variance_groups`` the reward level it tells solved from failed groups by)
    gets that warm-up in any log long enough to judge: a condition at the first records (100% of groups without reward
    variance at a reward of 0) is a fact there, and the consequence rule still exempts a condition present from the
    first observations while the reward rises. ``rows``: each step's canonical stats, read once. Returns detector ->
    its own warm-up, for those whose warm-up was shortened. The live guard counts its warm-ups in optimizer steps
    (``GuardConfig.warmup_unit``), with at least ``MIN_BASELINE`` observations."""
    dets = guard.detectors.items()
    warmups, needs = {n: det.warmup for n, det in dets}, {n: det.baseline_needed() for n, det in dets}
    enough = enough_observations(warmups, needs)
    counts = count_observations(guard.detectors, name_sets(rows), dict.fromkeys(guard.detectors, 0), enough)
    plan = fit_plan(warmups, needs, counts)
    fitted = {}
    for name, warmup in plan.items():
        det = guard.detectors[name]
        fitted[name], det.warmup = det.warmup, warmup
    return fitted


def count_observations(
    detectors: Mapping[str, Detector], steps: Iterable[NameSet], counts: Mapping[str, int], enough: Mapping[str, int]
) -> dict[str, int]:
    """``counts`` plus, per detector (a guard's, by name), the ``steps`` that carry its evidence
    (``Detector.observes``), counted up to ``enough`` (:func:`enough_observations`): past it the count changes no
    warm-up.

    The guard's own plan of a set of names (:class:`~rlguard.guards.observers.Observers`, from
    ``Detector.observed_with``) counts a group of steps whole where the names and the values' finiteness settle a
    detector's verdict (a detector whose stats the log lacks: every step, at no cost); only a detector whose verdict
    the values decide is asked at each of the group's steps, until it has ``enough``. The count is the same as
    asking ``observes`` at every step: a count stopped at ``enough`` is ``min(count, enough)`` in any order."""
    out = dict(counts)
    counting = {name for name in detectors if out[name] < enough[name]}
    plans = Observers(detectors, dict.fromkeys(detectors, AlarmState()))  # the plans' alarms are not read here
    for names, finite, size, stats in steps:
        if not counting:
            break
        # a plan is read from the names and whether every value is finite: a mapping of this group's names says both
        plan = plans.at(dict.fromkeys(names, 0.0 if finite else math.nan))
        asked = []
        for name, _, _, observes, *_ in plan:  # a Watch (name, detector, alarm, its observes where asked, ...)
            if name not in counting:
                continue
            if observes is not None:
                asked.append((name, observes))
                continue
            out[name] = min(out[name] + size, enough[name])  # every step of the group is an observation
            if out[name] >= enough[name]:
                counting.discard(name)
        for row in stats if asked else ():
            done = False
            for name, observes in asked:
                if observes(row):
                    out[name] += 1
                    done = done or out[name] >= enough[name]
            if done:
                counting.difference_update(name for name, _ in asked if out[name] >= enough[name])
                asked = [(name, observes) for name, observes in asked if name in counting]
                if not asked:
                    break
    return out


def enough_observations(warmups: Mapping[str, int], needs: Mapping[str, int | None]) -> dict[str, int]:
    """Detector -> the observations from which :func:`fit_plan` no longer depends on its count: its warm-up is then
    its own (``WARMUP_SHARE`` times it) or the fixed one its judgement needs, and it has a baseline and a window to
    judge (``2 * MIN_BASELINE``)."""
    return {
        name: max(2 * MIN_BASELINE, WARMUP_SHARE * own if needs.get(name) is None else 0)
        for name, own in warmups.items()
    }


def fit_plan(warmups: Mapping[str, int], needs: Mapping[str, int | None], counts: Mapping[str, int]) -> dict[str, int]:
    """Detector -> its warm-up fitted to ``counts`` observations, for those :func:`fit_warmups` shortens from their
    own ``warmups`` (``needs``: ``Detector.baseline_needed``, the observations a judgement needs where that is
    fixed)."""
    plan = {}
    for name, own in warmups.items():
        seen, need = counts.get(name, 0), needs.get(name)
        warmup = min(own, need if need is not None else max(MIN_BASELINE, seen // WARMUP_SHARE))
        if warmup < own and seen >= 2 * MIN_BASELINE:  # a baseline, then a 3-of-5 window to judge
            plan[name] = warmup
    return plan
