"""Offline diagnosis: replay a log's canonical stats through the live guard's detectors (``monitor`` preset), then
judge each finding by its consequence with the hindsight of the whole log.

Nothing is re-implemented here: :class:`rlguard.guards.Guard` judges every step exactly as it would in training,
and the consequence rule (:mod:`rlguard.guards.consequence`, shared with the live guard) says which of
its findings are critical. The events become the findings, one per detector: the most severe level reached, the
step of onset (its first event) and that level's message, which carries the evidence and the suggested fix.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlguard.doctor.columns import CanonicalRows
from rlguard.doctor.keys import KeyReport, canonical_name, classify_keys
from rlguard.doctor.readers import LogInputError, MetricLog, events_file, read_log
from rlguard.doctor.readreport import ReadReport
from rlguard.guards import Event, Guard, GuardConfig
from rlguard.guards.consequence.excursions import Excursion, excursions
from rlguard.guards.consequence.offline import Timeline, judge_log, label_findings, relabel
from rlguard.guards.consequence.rule import ConsequenceRule
from rlguard.guards.events import SEVERITY_LEVEL, EventsFileError, Finding, Severity, read_events

#: the fewest observations a detector's robust baseline is built from: the median and MAD of 5 observations survive
#: two outliers among them (their breakdown point, Hampel 1974), a rolling z-score needs a spread, a 3-of-5 run rule
#: needs a window of 5
MIN_BASELINE = 5
#: in the doctor a detector's warm-up takes at most 1/WARMUP_SHARE of its observations, so that most of a short
#: log is judged (a log of 21 records: a warm-up of 5, 16 judged)
WARMUP_SHARE = 4

#: exit status of ``rlguard doctor``, ``report`` and ``watch``: every record read and no critical finding, a critical
#: finding, bad input, could not judge (part of the log unread, or too little of it), an internal error (a bug)
EXIT_OK, EXIT_CRITICAL, EXIT_BAD_INPUT, EXIT_CANNOT_JUDGE, EXIT_INTERNAL = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class DoctorFinding:
    """One detector's verdict on the whole log.

    Attributes:
        detector: the detector's registered name.
        severity: the highest level it reached.
        step: step of onset: the first finding of the excursion in which it first reached ``severity`` (a
            critical finding's onset is the start of the excursion that became critical, not of an earlier one it
            recovered from; :mod:`rlguard.guards.consequence.excursions`).
        message: the message at ``severity``: evidence, threshold, suggested fix, and why it has that severity.
        value: the statistic judged when ``severity`` was reached.
        severity_step: the step at which ``severity`` was first reached.
        event_steps: steps of all its events (an alarm that clears and rises again has several).
        excursions: each episode of its findings that raised the alarm, with its own onset, end, severity by
            consequence and outcome (recovered, relapsed, unresolved).
    """

    detector: str
    severity: Severity
    step: int
    message: str
    value: float
    severity_step: int
    event_steps: list[int] = field(default_factory=list)
    excursions: list[Excursion] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite ``value`` as a string)."""
        value: float | str = self.value if math.isfinite(self.value) else str(self.value)
        return {
            "detector": self.detector,
            "severity": self.severity,
            "step": self.step,
            "message": self.message,
            "value": value,
            "severity_step": self.severity_step,
            "event_steps": self.event_steps,
            "excursions": [x.to_dict() for x in self.excursions],
        }


@dataclass(frozen=True)
class Diagnosis:
    """What the doctor found in one log.

    Attributes:
        log: the raw log read (with the account of the read, ``log.report``).
        keys: how its keys were mapped onto canonical names (``keys.auto_mapped``: those mapped automatically).
        steps: the optimizer steps judged, increasing.
        series: canonical name -> value at each of ``steps`` (NaN where the step did not log it), each read from
            the log's columns when asked for (not kept).
        events: the detectors' events, severity by consequence, in order.
        findings: one per detector that raised an event, most severe first, then by onset.
        detector_metrics: detector name -> the canonical stats it reads (for plots).
        coverage: detector name -> ``(checked, why)``: whether it judged at least one step past its warm-up, and
            on how many steps, or why it could not.
        live_events: the events the live guard recorded in the run folder's ``events.jsonl``, their critical
            detector events judged again with the log's hindsight (empty if none).
        live_events_path: that file, or None.
        live_warnings: lines of ``events.jsonl`` skipped (a torn last line).
    """

    log: MetricLog
    keys: KeyReport
    steps: Sequence[int]
    series: Mapping[str, Sequence[float]]
    events: list[Event]
    findings: list[DoctorFinding]
    detector_metrics: dict[str, tuple[str, ...]]
    coverage: dict[str, tuple[bool, str]] = field(default_factory=dict)
    live_events: list[Event] = field(default_factory=list)
    live_events_path: Path | None = None
    live_warnings: list[str] = field(default_factory=list)

    @property
    def read(self) -> ReadReport:
        """What was read of the log and what was not."""
        return self.log.report

    @property
    def critical(self) -> bool:
        """Whether any finding, or any detector event the live guard recorded (after hindsight), is critical, or the
        live guard halted the run (a halted run has failed, whatever the log shows before it)."""
        return any(f.severity == "critical" for f in self.findings) or any(map(critical_event, self.live_events))

    @property
    def unchecked(self) -> dict[str, str]:
        """Detector -> why it could not check this log."""
        return {name: why for name, (checked, why) in self.coverage.items() if not checked}

    @property
    def judged(self) -> bool:
        """Whether any detector but ``nonfinite`` judged a step past its warm-up."""
        return any(checked for name, (checked, _) in self.coverage.items() if name != "nonfinite")

    @property
    def exit_code(self) -> int:
        """1 a critical finding (or a critical live detector event, or a halt by the live guard); 3 could not
        judge: no detector but ``nonfinite`` got past its warm-up, or part of the log could not be read (damage); 0
        otherwise. (2, bad input, is raised before.)"""
        if self.critical:
            return EXIT_CRITICAL
        return EXIT_OK if self.judged and not self.read.partial else EXIT_CANNOT_JUDGE

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {
            "findings": [f.to_dict() for f in self.findings],
            "unrecognised_keys": self.keys.unrecognised,
            "steps": len(self.steps),
            "format": self.log.format,
            "path": str(self.log.path),
            "first_step": self.steps[0],
            "last_step": self.steps[-1],
            "read": self.read.to_dict(),
            "mapped_keys": self.keys.mapped,
            "auto_mapped_keys": self.keys.auto_mapped,
            "auto_map_evidence": self.keys.evidence,
            "refused_keys": self.keys.refused,
            "suggested_maps": self.keys.suggestions,
            "coverage": {n: {"checked": c, "why": why} for n, (c, why) in self.coverage.items()},
            "live_events": [e.to_dict() for e in self.live_events],
            "live_warnings": self.live_warnings,
            "exit_code": self.exit_code,
        }


def critical_event(e: Event) -> bool:
    """Whether a live guard's event makes a run critical: a critical detector event, or a halt (a critical action
    other than a halt, a rollback say, is the guard's answer, not a verdict of its own)."""
    return e.severity == "critical" and (e.detector == "action:halt" or not e.detector.startswith("action:"))


def detector_metrics(guard: Guard) -> dict[str, tuple[str, ...]]:
    """Detector name -> the canonical stats it reads."""
    return {name: det.reads() for name, det in guard.detectors.items()}


@dataclass(frozen=True)
class CanonicalLog:
    """A log read as the doctor reads it: the raw log, how its keys map, and each step's canonical stats.

    Attributes:
        log: the raw log (with the account of the read, ``log.report``).
        keys: how its keys map onto canonical names.
        rows: ``(step, canonical stats)`` for every step that has at least one, by increasing step: a view of
            ``log.rows`` that computes a step's stats when read (:class:`~rlguard.doctor.columns.CanonicalRows`).
    """

    log: MetricLog
    keys: KeyReport
    rows: CanonicalRows


def read_canonical(
    path: str | Path,
    key_map: Mapping[str, str] | None = None,
    *,
    auto_map: bool = True,
    log: MetricLog | None = None,
    step_key: str | None = None,
    row_steps: bool = False,
    run: str | None = None,
) -> CanonicalLog:
    """Read the log at ``path`` and its canonical stats, step by step (``key_map``: ``--map``; ``auto_map``: map
    keys that match exactly one canonical stat and whose values are evidence for it). The one reading of a log
    that the doctor and its live replay (:mod:`rlguard.doctor.live`) share. LogInputError when no key maps to a
    stat a detector reads, or for a ``key_map`` naming a key the log lacks or a stat it has. ``log``: the log at
    ``path`` already read (the watch reads it by increments); ``step_key``, ``row_steps``, ``run``: as
    :func:`~rlguard.doctor.readers.read_log`'s."""
    log = read_log(path, step_key=step_key, row_steps=row_steps, run=run) if log is None else log
    _check_key_map(log, key_map or {})
    keys = classify_keys(log.keys, key_map, auto_map, rows=log.rows)
    if not keys.judged:
        found = ", ".join(sorted(log.keys)[:8]) + (", ..." if len(log.keys) > 8 else "")
        hint = "; ".join(f"--map {k}={c}" for k, c in keys.suggestions.items())
        raise LogInputError(
            f"no usable metric in {log.path} ({log.format}, {len(log.rows)} steps): none of its keys ({found}) maps "
            "to a stat the detectors read (e.g. TRL's reward, entropy, kl, grad_norm; verl's actor/entropy)"
            + (f"; try {hint}" if hint else "; map your own names with --map KEY=CANONICAL")
        )
    return CanonicalLog(log, keys, CanonicalRows(log.rows, keys.key_map))


def diagnose(
    path: str | Path,
    config: GuardConfig | None = None,
    key_map: Mapping[str, str] | None = None,
    *,
    auto_map: bool = True,
    rule: ConsequenceRule | None = None,
    step_key: str | None = None,
    row_steps: bool = False,
    run: str | None = None,
) -> Diagnosis:
    """Read the log at ``path`` and judge every step with a guard (``monitor`` preset unless ``config``), then
    each finding by its consequence (``rule``, :class:`~rlguard.guards.consequence.rule.ConsequenceRule`).

    ``key_map`` maps the log's own column names onto canonical ones (``--map reward_avg=reward_mean``); with
    ``auto_map`` a key that matches exactly one canonical stat is mapped too (``--no-auto-map`` turns it off). A
    run folder's ``events.jsonl`` (what the live guard recorded) is read too. ``step_key``, ``row_steps`` and ``run``
    say where the steps are and which run to judge (:func:`~rlguard.doctor.readers.read_log`).
    """
    log = read_log(path, step_key=step_key, row_steps=row_steps, run=run)
    return diagnose_log(log, path, config, key_map, auto_map=auto_map, rule=rule)


def diagnose_log(
    log: MetricLog,
    path: str | Path,
    config: GuardConfig | None = None,
    key_map: Mapping[str, str] | None = None,
    *,
    auto_map: bool = True,
    rule: ConsequenceRule | None = None,
) -> Diagnosis:
    """:func:`diagnose` of a log already read (``rlguard watch`` reads its log by increments): ``path`` is what
    the user gave (a run folder or the log file), where the run's ``events.jsonl`` is looked for. Memory: the log's
    columns (:class:`~rlguard.doctor.columns.Columns`), and per step what :class:`DoctorFold` keeps."""
    return DoctorFold(path, config, key_map, auto_map=auto_map, rule=rule).judge(log)


class DoctorFold:
    """The doctor's judgement as a fold over a log's steps: each step's canonical stats go once through the guard
    (:meth:`~rlguard.guards.Guard.observe`), and what the consequence rule needs of it is kept (its detectors, a
    shared set; its findings and change points, one shared empty mapping where none: 24 bytes a step, plus the
    findings themselves). :meth:`judge` of a log that extends the last one judged feeds only the steps added since;
    ``rlguard watch`` keeps one fold per log, so each appended record goes through the guard once.

    Its verdict on a log equals :func:`diagnose_log`'s on the same log (the same code: :func:`diagnose_log` is one
    judgement of a new fold). Three things are not a fold, and :meth:`judge` does them again each time:
    the keys' mapping (auto-mapping reads the values of the whole log; a mapping that changes replays the log from
    its first step), the warm-ups fitted to the log's length (:func:`fit_warmups`: they change only while a
    detector has fewer than ``WARMUP_SHARE`` times its warm-up in observations, and a change replays the log), and
    the consequence rule's hindsight (:func:`~rlguard.guards.consequence.offline.label_findings`, ``judge_log``,
    ``excursions``: a finding is judged by what followed it, so every judgement reads the kept timeline whole).
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
        self._start()

    def _start(self) -> None:
        self._guard = Guard(self.config)
        self._defaults = {n: det.warmup for n, det in self._guard.detectors.items()}
        self._warmups: dict[str, int] = {}  # detector -> the warm-up fitted (those shortened)
        self._counts = dict.fromkeys(self._guard.detectors, 0)  # observations in the steps fed
        self._fed = 0  # canonical steps fed to the guard
        self._last: int | None = None  # the last step fed
        self._findings: list[Mapping[str, Finding]] = []
        self._observed: list[frozenset[str]] = []
        self._points: list[Mapping[str, int]] = []
        self._distinct: dict[frozenset[str], frozenset[str]] = {}  # one object per set of detectors: a log has few

    def judge(self, log: MetricLog, *, final: bool = True) -> Diagnosis:
        """The diagnosis of ``log`` (the log last judged, grown; or another, judged from its first step).
        ``final``: no record will be added to its last step (a whole file); otherwise that step is judged by a copy
        of the guard and fed at the next judgement (module docstring)."""
        read = read_canonical(self.path, self.key_map, auto_map=self.auto_map, log=log)
        rows = read.rows
        keep = len(rows) if final else max(len(rows) - 1, 0)
        steps = rows.steps
        extends = self._fed <= keep and (self._fed == 0 or steps[self._fed - 1] == self._last)
        if read.keys.key_map != self._mapped or not extends:
            self._mapped = dict(read.keys.key_map)
            self._restart()
        counts = _count_observations(self._guard, (rows[k][1] for k in range(self._fed, len(rows))), self._counts)
        if _fit_plan(self._defaults, counts) != self._warmups:
            self._restart()
        self._warmups = _fit_plan(self._defaults, counts)
        if self._fed == 0:
            for name, warmup in self._warmups.items():
                self._guard.detectors[name].warmup = warmup
        for k in range(self._fed, keep):
            step, stats = rows[k]
            self._feed(self._guard, step, stats)
        guard, tail = self._guard, len(self._findings)
        if keep < len(rows):  # the last step, judged by a copy of the guard
            guard = Guard(self.config)
            for name, warmup in self._warmups.items():
                guard.detectors[name].warmup = warmup
            guard.load_state_dict(self._guard.state_dict())
            step, stats = rows[keep]
            self._observe(guard, step, stats)
        try:
            fitted = {n: self._defaults[n] for n in self._warmups}
            return self._conclude(read, guard, fitted)
        finally:  # the copy's step leaves the kept timeline
            del self._findings[tail:], self._observed[tail:], self._points[tail:]

    def _restart(self) -> None:
        if self._fed:
            self.replays += 1
        self._start()

    def _feed(self, guard: Guard, step: int, stats: Mapping[str, float]) -> None:
        self._observe(guard, step, stats)
        for name in guard.last_observed:
            self._counts[name] += 1
        self._fed += 1
        self._last = step

    def _observe(self, guard: Guard, step: int, stats: Mapping[str, float]) -> None:
        guard.observe(step, stats)
        seen = frozenset(guard.last_observed)
        self._observed.append(self._distinct.setdefault(seen, seen))
        found = guard.last_findings  # a new dict at every step (Guard._run_detectors): kept as it is
        if found:  # most steps: none
            self._findings.append(found)
            points = {n: cp for n in found if (cp := guard.detectors[n].change_point()) is not None}
            self._points.append(points or _NONE)
        else:
            self._findings.append(_NONE)
            self._points.append(_NONE)

    def _conclude(self, read: CanonicalLog, guard: Guard, fitted: Mapping[str, int]) -> Diagnosis:
        log, keys, rule = read.log, read.keys, self.rule
        steps = read.rows.steps
        names = read.rows.names
        series = _Series(read.rows, names)
        rewards = series["reward_mean"] if "reward_mean" in series else array("d", [math.nan]) * len(steps)
        timeline = Timeline(steps, rewards, self._findings, self._observed, self._points)
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
        return Diagnosis(
            log,
            keys,
            steps,
            series,
            events,
            _findings(events, excursions(timeline, guard.detectors, labels, rule)),
            detector_metrics(guard),
            coverage,
            live,
            live_path,
            live_warnings,
        )


#: the findings and change points of a step without findings (shared, read only)
_NONE: Mapping[str, Any] = {}


def _check_key_map(log: MetricLog, key_map: Mapping[str, str]) -> None:
    """LogInputError for a ``--map KEY=CANONICAL`` whose key the log lacks, or whose stat another key of the log
    already holds (which of the two would be judged?); ``--map KEY=`` (a refusal) needs only the key."""
    present = log.keys
    for key, name in key_map.items():
        if key not in present:
            raise LogInputError(
                f"--map {key}={name}: the log {log.path} has no key {key!r} (its keys: "
                f"{', '.join(sorted(present)[:8])}{', ...' if len(present) > 8 else ''}); map one of its own keys"
            )
        if not name:
            continue
        holders = sorted(
            k for k in present if k not in key_map and (hit := canonical_name(k)) is not None and hit[0] == name
        )
        others = sorted(k for k, n in key_map.items() if n == name and k != key)
        if holders or others:
            raise LogInputError(
                f"--map {key}={name}: the log already has {name} (key {(holders or others)[0]!r}); map {key} onto "
                f"another stat, or map {(holders or others)[0]} elsewhere"
            )


def fit_warmups(guard: Guard, rows: Iterable[Mapping[str, float]]) -> dict[str, int]:
    """Fit each detector's warm-up (stated in observations: logged records that carry its stats) to the log: at
    most ``1/WARMUP_SHARE`` of its observations, never fewer than ``MIN_BASELINE`` nor more than its own, and only
    for a detector with at least ``2 * MIN_BASELINE`` observations (a baseline, then a window of the 3-of-5 run rule
    to judge; fewer cannot be judged). A short or sparse log (21 records logged every 20 steps) is judged instead
    of refused. ``rows``: each step's canonical stats, read once. Returns detector -> its own
    warm-up, for those whose warm-up was shortened. The live guard cannot know a run's length: it keeps its
    detectors' warm-ups (set them lower in its ``GuardConfig`` for a sparse log cadence)."""
    counts = _count_observations(guard, rows, dict.fromkeys(guard.detectors, 0))
    plan = _fit_plan({n: det.warmup for n, det in guard.detectors.items()}, counts)
    fitted = {}
    for name, warmup in plan.items():
        det = guard.detectors[name]
        fitted[name], det.warmup = det.warmup, warmup
    return fitted


def _count_observations(guard: Guard, rows: Iterable[Mapping[str, float]], counts: Mapping[str, int]) -> dict[str, int]:
    """``counts`` plus, per detector of ``guard``, the steps of ``rows`` that carry its evidence
    (``Detector.observes``)."""
    out = dict(counts)
    detectors = list(guard.detectors.items())
    for stats in rows:
        for name, det in detectors:
            if det.observes(stats):
                out[name] += 1
    return out


def _fit_plan(warmups: Mapping[str, int], counts: Mapping[str, int]) -> dict[str, int]:
    """Detector -> its warm-up fitted to ``counts`` observations, for those :func:`fit_warmups` shortens from their
    own ``warmups``."""
    plan = {}
    for name, own in warmups.items():
        seen = counts.get(name, 0)
        warmup = min(own, max(MIN_BASELINE, seen // WARMUP_SHARE))
        if warmup < own and seen >= 2 * MIN_BASELINE:  # a baseline, then a 3-of-5 window to judge
            plan[name] = warmup
    return plan


class _Series(Mapping[str, Sequence[float]]):
    """Canonical name -> its value at each step of ``rows`` (NaN where not logged), read from the columns when
    asked for: a 1,000,000-step log's dozen stats are not kept beside its columns."""

    def __init__(self, rows: CanonicalRows, names: list[str]) -> None:
        self._rows, self._names = rows, names

    def __getitem__(self, name: str) -> Sequence[float]:
        if name not in self._names:
            raise KeyError(name)
        return self._rows.series(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _coverage(
    guard: Guard, keys: KeyReport, present: set[str], fitted: Mapping[str, int]
) -> dict[str, tuple[bool, str]]:
    """Per detector: whether it judged a step past its warm-up, and on how many steps, or why not (``fitted``:
    detector -> its own warm-up, where :func:`fit_warmups` shortened it)."""
    seen = guard.observations()
    out: dict[str, tuple[bool, str]] = {}
    for name, det in guard.detectors.items():
        n, reads = seen.get(name, 0), det.reads()
        stats = " or ".join(reads) if reads else "its stats"
        if n == 0 and reads and all(r in present for r in reads):
            # the stats are there, but no step was evidence for the detector (``Detector.observes``)
            why = f"not checked: {stats} at its floor on every step (as on on-policy steps): no evidence for it"
            out[name] = (False, why)
        elif n == 0:
            missing = [r for r in reads if r not in present] or list(reads)
            hint = [f"--map {k}={c}" for k, c in keys.suggestions.items() if c in missing]
            why = f"not checked: the log has no {' or '.join(missing)}" + (f" (try {', '.join(hint)})" if hint else "")
            out[name] = (False, why)
        elif n <= det.warmup:
            out[name] = (False, f"not checked: {n} steps with {stats}, all inside its warm-up of {det.warmup}")
        else:
            of = f", fitted to the log: {fitted[name]} by default" if name in fitted else ""
            out[name] = (True, f"checked {n - det.warmup} of {n} steps with {stats} (warm-up {det.warmup}{of})")
    return out


def _findings(events: list[Event], spans: Mapping[str, list[Excursion]]) -> list[DoctorFinding]:
    by_detector: dict[str, list[Event]] = {}
    for e in events:
        by_detector.setdefault(e.detector, []).append(e)
    findings = []
    for name, evs in by_detector.items():
        worst = max(evs, key=lambda e: (SEVERITY_LEVEL[e.severity], -e.step))
        mine = spans.get(name, [])
        # the onset: the start of the excursion in which the worst severity was first reached
        onset = next((x.onset for x in mine if x.onset <= worst.step <= x.end), evs[0].step)
        findings.append(
            DoctorFinding(
                detector=name,
                severity=worst.severity,
                step=onset,
                message=worst.message,
                value=worst.value,
                severity_step=worst.step,
                event_steps=[e.step for e in evs],
                excursions=mine,
            )
        )
    return sorted(findings, key=lambda f: (-SEVERITY_LEVEL[f.severity], f.step, f.detector))
