"""The doctor's judgement as a fold over a log's steps (:class:`DoctorFold`): what :func:`rlguard.doctor.diagnose`
and ``rlguard watch`` run, the warm-ups fitted to the log's length (:func:`fit_warmups`), and the report's series
read from the log's columns when asked for."""

from __future__ import annotations

import copy
import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np

from rlguard.doctor.canonical import CanonicalRows
from rlguard.doctor.diagnose import CanonicalLog, Diagnosis, _coverage, _findings, detector_metrics, read_canonical
from rlguard.doctor.keyvalues import ValueIndex
from rlguard.doctor.readers import LogInputError, MetricLog, events_file
from rlguard.doctor.warmups import count_observations, enough_observations, fit_plan, fit_warmups
from rlguard.guards import Event, Guard, GuardConfig
from rlguard.guards.consequence.excursions import excursions, recovered_incidents
from rlguard.guards.consequence.index import FindingIndex
from rlguard.guards.consequence.offline import Timeline, judge_log, label_findings, relabel
from rlguard.guards.consequence.rule import ConsequenceRule
from rlguard.guards.events import EventsFileError, Finding, read_events

__all__ = ["DoctorFold", "fit_warmups"]

_V = TypeVar("_V")


class DoctorFold:
    """The doctor's judgement as a fold over a log's steps: each step's canonical stats go once through the guard
    (:meth:`~rlguard.guards.Guard.observe`), and what the consequence rule needs of it is kept (its detectors, a
    shared set; its findings and change points, one shared empty mapping where none: 24 bytes a step, plus the
    findings themselves). :meth:`judge` of a log that extends the last one judged feeds only the steps added since;
    ``rlguard watch`` keeps one fold per log, so each appended record goes through the guard once.

    Its verdict on a log equals :func:`~rlguard.doctor.diagnose.diagnose_log`'s on the same log (the same code:
    that is one judgement of a new fold). Two things are not a fold, and :meth:`judge` does them again each time:
    the keys' mapping (auto-mapping reads the values of the whole log; a mapping that changes replays the log from
    its first step) and the warm-ups fitted to the log's length (:func:`fit_warmups`: they change only while a
    detector has fewer than ``WARMUP_SHARE`` times its warm-up in observations, and a change replays the log). The
    consequence rule's hindsight (:func:`~rlguard.guards.consequence.offline.label_findings`, ``judge_log``,
    ``excursions``: a finding is judged by what followed it) reads the kept timeline through a
    :class:`~rlguard.guards.consequence.index.FindingIndex` brought up to date with the steps added since the last
    judgement, then works on the findings and the steps near them, not on every step; the reward's established peak
    and a critical excursion's recovery read the index's
    :class:`~rlguard.guards.consequence.history.RewardHistory`, kept as the timeline grows. The table judged is a
    snapshot of the follower's (:meth:`~rlguard.doctor.columns.Columns.copy`), its steps with a stat kept from the
    last judgement (``CanonicalRows(previous=...)``), and the diagnosis reads a stat's values when asked for.
    The last step of a log that may still grow (``final=False``) can still be merged with a record of the same
    step: it is judged by a copy of the guard (its state, :meth:`~rlguard.guards.Guard.state_dict`) and fed for
    good at the next judgement.

    Attributes:
        replays: the times the log was fed again from its first step (a new mapping of keys or new warm-ups).
    """

    def __init__(
        self,
        path: str | Path,
        config: GuardConfig | None = None,
        key_map: Mapping[str, str] | None = None,
        *,
        auto_map: bool = True,
        rule: ConsequenceRule | None = None,
    ) -> None:
        self.path, self.key_map, self.auto_map, self.rule = path, key_map, auto_map, rule
        self.config = config or GuardConfig.preset("monitor")
        self.replays = 0
        self._mapped: dict[str, str] | None = None  # the key map the kept steps were read with
        self._canonical: CanonicalRows | None = None  # the last table's stats (their steps kept, read again from)
        self._values = ValueIndex()  # what the mapping of keys read of the last table's values (kept, likewise)
        self._start()

    def _start(self) -> None:
        self._guard = Guard(self.config)
        self._defaults = {n: det.warmup for n, det in self._guard.detectors.items()}
        self._needs = {n: det.baseline_needed() for n, det in self._guard.detectors.items()}
        self._warmups: dict[str, int] = {}  # detector -> the warm-up fitted (those shortened)
        self._fed = 0  # canonical steps fed to the guard
        self._last: int | None = None  # the last step fed
        self._findings: _Sparse[Finding] = _Sparse()
        self._observed: list[frozenset[str]] = []
        self._points: _Sparse[int] = _Sparse()
        self._rewards = array("d")  # reward_mean at each step fed, NaN where absent (the series, kept as fed)
        self._index = FindingIndex()  # what the consequence rule reads of the steps fed
        self._distinct: dict[frozenset[str], frozenset[str]] = {}  # one object per set of detectors: a log has few
        self._last_observed: list[str] = []  # the detectors of the last step observed, and their set
        self._last_set: frozenset[str] = frozenset()

    def judge(self, log: MetricLog, *, final: bool = True) -> Diagnosis:
        """The diagnosis of ``log`` (the log last judged, grown; or another, judged from its first step).
        ``final``: no record will be added to its last step (a whole file); otherwise that step is judged by a copy
        of the guard and fed at the next judgement (module docstring)."""
        read = read_canonical(
            self.path, self.key_map, auto_map=self.auto_map, log=log, previous=self._canonical, index=self._values
        )
        rows = read.rows
        keep = len(rows) if final else max(len(rows) - 1, 0)
        steps = rows.steps
        extends = self._fed <= keep and (self._fed == 0 or steps[self._fed - 1] == self._last)
        if read.keys.key_map != self._mapped or not extends:
            self._mapped = dict(read.keys.key_map)
            self._restart()
        # the next judgement's table extends this one where the log grew (another log is judged from its start)
        self._canonical = rows
        enough = enough_observations(self._defaults, self._needs)
        self._index.sync(self._observed, self._findings, self._rewards)  # each detector's observations in the steps fed
        fed = {name: self._index.count(name) for name in self._guard.detectors}
        counts = count_observations(self._guard.detectors, rows.name_sets(self._fed, len(rows)), fed, enough)
        if fit_plan(self._defaults, self._needs, counts) != self._warmups:
            self._restart()
        self._warmups = fit_plan(self._defaults, self._needs, counts)
        if self._fed == 0:
            for name, warmup in self._warmups.items():
                self._guard.detectors[name].warmup = warmup
        for step, stats in rows.iter_from(self._fed, keep):
            self._observe(self._guard, step, stats)
            self._fed += 1
            self._last = step
        self._index.sync(self._observed, self._findings, self._rewards)
        guard, tail, mark = self._guard, len(self._findings), self._index.mark()
        if keep < len(rows):  # the last step, judged by a copy of the guard
            guard = Guard(self.config)
            for name, warmup in self._warmups.items():
                guard.detectors[name].warmup = warmup
            # a copy: a detector's state_dict hands out its own lists and dicts, which the copy's step would change;
            # without the events recorded (they grow with the log's alarms, and the diagnosis does not read them)
            recorded, self._guard.events = self._guard.events, []
            try:
                state = copy.deepcopy(self._guard.state_dict())
            finally:
                self._guard.events = recorded
            guard.load_state_dict(state)
            step, stats = rows[keep]
            self._observe(guard, step, stats)
        try:
            fitted = {n: self._defaults[n] for n in self._warmups}
            return self._conclude(read, guard, fitted)
        finally:  # the copy's step leaves the kept timeline
            self._findings.truncate(tail)
            self._points.truncate(tail)
            del self._observed[tail:], self._rewards[tail:]
            self._index.restore(mark)

    def _restart(self) -> None:
        if self._fed:
            self.replays += 1
        self._start()

    def _observe(self, guard: Guard, step: int, stats: Mapping[str, float]) -> None:
        guard.observe(step, stats)
        self._rewards.append(stats.get("reward_mean", math.nan))
        if guard.last_observed != self._last_observed:  # most steps: the detectors of the step before
            seen = frozenset(guard.last_observed)
            self._last_observed, self._last_set = guard.last_observed, self._distinct.setdefault(seen, seen)
        self._observed.append(self._last_set)
        found = guard.last_findings  # a new dict at every step (Guard._run_detectors): kept as it is
        self._findings.append(found)  # most steps: none
        self._points.append(
            {n: cp for n in found if (cp := guard.detectors[n].change_point()) is not None} if found else _NONE
        )

    def _conclude(self, read: CanonicalLog, guard: Guard, fitted: Mapping[str, int]) -> Diagnosis:
        log, keys, rule = read.log, read.keys, self.rule
        steps = read.rows.steps
        names = read.rows.names
        series = _Series(read.rows, names)
        rewards = self._rewards
        timeline = Timeline(steps, rewards, self._findings, self._observed, self._points, self._index)
        labels = label_findings(timeline, guard.detectors, rule)
        events = judge_log(timeline, guard.detectors, rule, labels)
        coverage = _coverage(guard, keys, set(names), fitted)
        live_path = None if log.streamed else events_file(Path(self.path), log.path)  # a stream has no run folder
        live: list[Event] = []
        live_warnings: list[str] = []
        if live_path is not None:
            try:
                recorded = read_events(live_path)
            except EventsFileError as err:
                raise LogInputError(str(err)) from None
            checked = frozenset(n for n, (ok, _) in coverage.items() if ok)
            live, live_warnings = relabel(recorded.events, timeline, labels, checked, rule), recorded.warnings
        findings = _findings(events, excursions(timeline, guard.detectors, labels, rule))
        critical = [x for f in findings for x in f.excursions if x.severity == "critical"]
        return Diagnosis(
            log,
            keys,
            steps,
            series,
            events,
            findings,
            detector_metrics(guard),
            coverage,
            live,
            live_path,
            live_warnings,
            recovered_incidents(steps, rewards, critical, rule, self._index.history),
        )


#: the findings and change points of a step without findings (shared, read only)
_NONE: Mapping[str, Any] = {}


class _Sparse(Sequence[Mapping[str, _V]]):
    """Each step's mapping (its findings, their change points) where most steps have none: the others kept by
    position, so that a step without one costs nothing (a list would hold a pointer a step: 8 MB a million); an
    empty one reads as the shared :data:`_NONE`."""

    def __init__(self) -> None:
        self._at: dict[int, Mapping[str, _V]] = {}
        self._n = 0

    def append(self, item: Mapping[str, _V]) -> None:
        """Add the next step's mapping."""
        if item:
            self._at[self._n] = item
        self._n += 1

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` steps (the steps taken back, not every step with a mapping, are read)."""
        for k in range(n, self._n):
            self._at.pop(k, None)
        self._n = min(self._n, n)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> Mapping[str, _V]: ...
    @overload
    def __getitem__(self, index: slice) -> list[Mapping[str, _V]]: ...
    def __getitem__(self, index: int | slice) -> Mapping[str, _V] | list[Mapping[str, _V]]:
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(self._n))]
        if not -self._n <= index < self._n:
            raise IndexError(f"step {index} of {self._n}")
        item = self._at.get(index % self._n)
        return _NONE if item is None else item

    def __iter__(self) -> Iterator[Mapping[str, _V]]:
        at = self._at
        return (at.get(k, _NONE) for k in range(self._n))


class _Series(Mapping[str, Sequence[float]]):
    """Canonical name -> its value at each step of ``rows`` (NaN where not logged), read from the columns when
    asked for: a 1,000,000-step log's dozen stats are not kept beside its columns."""

    def __init__(self, rows: CanonicalRows, names: list[str]) -> None:
        self._rows, self._names = rows, names

    def __getitem__(self, name: str) -> Sequence[float]:
        if name not in self._names:
            raise KeyError(name)
        return _Stat(self._rows, name)

    def __contains__(self, name: object) -> bool:
        return name in self._names  # without reading the series (Mapping's own test reads it)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class _Stat(Sequence[float]):
    """One stat at each step of ``rows``, read when asked for: a value alone (``rlguard watch`` shows the last
    values of a growing log at each judgement: the last steps read, not the series) or the series whole, once."""

    def __init__(self, rows: CanonicalRows, name: str) -> None:
        self._rows, self._name = rows, name

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, k: int) -> float: ...
    @overload
    def __getitem__(self, k: slice) -> Sequence[float]: ...
    def __getitem__(self, k: int | slice) -> float | Sequence[float]:
        if isinstance(k, slice):
            return self._rows.series(self._name)[k]
        return self._rows.value(self._name, k)

    def __iter__(self) -> Iterator[float]:
        return iter(self._rows.series(self._name))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        return np.asarray(self._rows.series(self._name), dtype=dtype)
