"""Offline diagnosis: replay a log's canonical stats through the live guard's detectors (``monitor`` preset), then
judge each finding by its consequence with the hindsight of the whole log.

Nothing is re-implemented here: :class:`rlguard.guards.Guard` judges every step exactly as it would in training,
and the consequence rule (:mod:`rlguard.guards.consequence`, shared with the live guard) says which of
its findings are critical. The events become the findings, one per detector: the most severe level reached, the
step of onset (its first event) and that level's message, which carries the evidence and the suggested fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlguard.doctor.canonical import CanonicalRows
from rlguard.doctor.keys import KeyReport, canonical_name, classify_keys
from rlguard.doctor.keyvalues import ValueIndex
from rlguard.doctor.readers import LogInputError, MetricLog, read_log
from rlguard.doctor.readreport import ReadReport
from rlguard.guards import Event, Guard, GuardConfig
from rlguard.guards.consequence.excursions import Excursion, Incident
from rlguard.guards.consequence.rule import ConsequenceRule
from rlguard.guards.events import SEVERITY_LEVEL, Severity

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
        incidents: the critical excursions the run recovered from before its failure (the reward fell after them and
            came back to its level: :func:`~rlguard.guards.consequence.excursions.recovered_incidents`), in order.
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
    incidents: list[Incident] = field(default_factory=list)

    @property
    def read(self) -> ReadReport:
        """What was read of the log and what was not."""
        return self.log.report

    @property
    def onset(self) -> int | None:
        """The step at which the run's failure began, where a critical finding says it failed: the earliest onset of
        a critical excursion from the reward's last recovery on (each critical excursion the run recovered from
        before it is in ``incidents``); without incidents, the earliest onset of a critical finding. None without
        one. A detector's excursion that ends is not a run that recovered (an entropy blow-up that subsides after
        230 steps of a destroyed run): the run's recovery is judged by its reward, not by the detector's stat."""
        if self.incidents:
            back = self.incidents[-1].recovered
            after = [
                x.onset for f in self.findings for x in f.excursions if x.severity == "critical" and x.onset >= back
            ]
            if after:
                return min(after)
        return min((f.step for f in self.findings if f.severity == "critical"), default=None)

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
            "onset": self.onset,
            "incidents": [i.to_dict() for i in self.incidents],
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
            ``log.rows`` that computes a step's stats when read (:class:`~rlguard.doctor.canonical.CanonicalRows`).
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
    previous: CanonicalRows | None = None,
    index: ValueIndex | None = None,
) -> CanonicalLog:
    """Read the log at ``path`` and its canonical stats, step by step (``key_map``: ``--map``; ``auto_map``: map
    keys that match exactly one canonical stat and whose values are evidence for it). The one reading of a log
    that the doctor and its live replay (:mod:`rlguard.doctor.live`) share. LogInputError when no key maps to a
    stat a detector reads, or for a ``key_map`` naming a key the log lacks or a stat it has. ``log``: the log at
    ``path`` already read (the watch reads it by increments); ``step_key``, ``row_steps``, ``run``: as
    :func:`~rlguard.doctor.readers.read_log`'s; ``previous``: the stats of an earlier snapshot of ``log``'s table
    (:class:`~rlguard.doctor.canonical.CanonicalRows`: only the rows appended since are read); ``index``: what the
    mapping of keys by their values read of an earlier snapshot (:class:`~rlguard.doctor.keyvalues.ValueIndex`,
    likewise)."""
    log = read_log(path, step_key=step_key, row_steps=row_steps, run=run) if log is None else log
    _check_key_map(log, key_map or {})
    keys = classify_keys(log.keys, key_map, auto_map, rows=log.rows, index=index)
    if not keys.judged:
        found = ", ".join(sorted(log.keys)[:8]) + (", ..." if len(log.keys) > 8 else "")
        hint = "; ".join(f"--map {k}={c}" for k, c in keys.suggestions.items())
        raise LogInputError(
            f"no usable metric in {log.path} ({log.format}, {len(log.rows)} steps): none of its keys ({found}) maps "
            "to a stat the detectors read (e.g. TRL's reward, entropy, kl, grad_norm; verl's actor/entropy)"
            + (f"; try {hint}" if hint else "; map your own names with --map KEY=CANONICAL")
        )
    return CanonicalLog(log, keys, CanonicalRows(log.rows, keys.key_map, previous))


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
    columns (:class:`~rlguard.doctor.columns.Columns`), and per step what
    :class:`~rlguard.doctor.fold.DoctorFold` keeps."""
    from rlguard.doctor.fold import DoctorFold  # the fold module reads this one's types: imported when called

    return DoctorFold(path, config, key_map, auto_map=auto_map, rule=rule).judge(log)


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


def _coverage(
    guard: Guard, keys: KeyReport, present: set[str], fitted: Mapping[str, int]
) -> dict[str, tuple[bool, str]]:
    """Per detector: whether it judged a step past its warm-up, and on how many steps, or why not (``fitted``:
    detector -> its own warm-up, where :func:`~rlguard.doctor.warmups.fit_warmups` shortened it)."""
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
