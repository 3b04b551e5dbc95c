"""Offline diagnosis: replay a log's canonical stats through the live guard's detectors (``monitor`` preset).

Nothing is re-implemented here: :class:`rlguard.guards.Guard` judges every step exactly as it would in training,
and its events become the findings, one per detector: the most severe level reached, the step of onset (its
first event) and that level's message, which carries the evidence and the suggested fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlguard.doctor.keys import KeyReport, canonical_stats, classify_keys
from rlguard.doctor.readers import LogInputError, MetricLog, read_log
from rlguard.guards import Event, Guard, GuardConfig
from rlguard.guards.events import SEVERITY_LEVEL, Severity

#: stats plotted for detectors that read several (the rest read their ``metric`` field)
_MULTI_STAT: dict[str, tuple[str, ...]] = {
    "nonfinite": ("loss", "grad_norm", "nonfinite"),
    "entropy_collapse": ("entropy", "reward_mean"),
    "reward_collapse": ("reward_mean",),
}


@dataclass(frozen=True)
class DoctorFinding:
    """One detector's verdict on the whole log.

    Attributes:
        detector: the detector's registered name.
        severity: the highest level it reached.
        step: step of onset, its first event.
        message: the message at ``severity``: evidence, threshold and suggested fix.
        value: the statistic judged when ``severity`` was reached.
        severity_step: the step at which ``severity`` was first reached.
        event_steps: steps of all its events (an alarm that clears and rises again has several).
    """

    detector: str
    severity: Severity
    step: int
    message: str
    value: float
    severity_step: int
    event_steps: list[int] = field(default_factory=list)

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
        }


@dataclass(frozen=True)
class Diagnosis:
    """What the doctor found in one log.

    Attributes:
        log: the raw log read.
        keys: how its keys were mapped onto canonical names.
        steps: the optimizer steps judged, increasing.
        series: canonical name -> value at each of ``steps`` (NaN where the step did not log it).
        events: the guard's events, in order.
        findings: one per detector that raised an event, most severe first, then by onset.
        detector_metrics: detector name -> the canonical stats it reads (for plots).
    """

    log: MetricLog
    keys: KeyReport
    steps: list[int]
    series: dict[str, list[float]]
    events: list[Event]
    findings: list[DoctorFinding]
    detector_metrics: dict[str, tuple[str, ...]]

    @property
    def critical(self) -> bool:
        """Whether any finding is critical."""
        return any(f.severity == "critical" for f in self.findings)

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
            "mapped_keys": self.keys.mapped,
        }


def detector_metrics(guard: Guard) -> dict[str, tuple[str, ...]]:
    """Detector name -> the canonical stats it reads."""
    out: dict[str, tuple[str, ...]] = {}
    for name, det in guard.detectors.items():
        metric = getattr(det, "metric", "")
        out[name] = _MULTI_STAT.get(name, (metric,) if isinstance(metric, str) and metric else ())
    return out


def diagnose(path: str | Path, config: GuardConfig | None = None) -> Diagnosis:
    """Read the log at ``path`` and judge every step with a guard (``monitor`` preset unless ``config``)."""
    log = read_log(path)
    keys = classify_keys(log.keys)
    if not keys.judged:
        found = ", ".join(sorted(log.keys)[:8]) + (", ..." if len(log.keys) > 8 else "")
        raise LogInputError(
            f"no usable metric in {log.path} ({log.format}, {len(log.rows)} steps): none of its keys ({found}) maps "
            "to a stat the detectors read (e.g. TRL's reward, entropy, kl, grad_norm; verl's actor/entropy)"
        )
    guard = Guard(config or GuardConfig.preset("monitor"))
    steps: list[int] = []
    rows: list[dict[str, float]] = []
    for step, raw in log.rows:
        stats = canonical_stats(raw)
        if not stats:
            continue
        guard.observe(step, stats)
        steps.append(step)
        rows.append(stats)
    names = sorted({n for r in rows for n in r})
    series = {n: [r.get(n, math.nan) for r in rows] for n in names}
    events = [e for e in guard.events if not e.detector.startswith("action:")]
    return Diagnosis(log, keys, steps, series, list(guard.events), _findings(events), detector_metrics(guard))


def _findings(events: list[Event]) -> list[DoctorFinding]:
    by_detector: dict[str, list[Event]] = {}
    for e in events:
        by_detector.setdefault(e.detector, []).append(e)
    findings = []
    for name, evs in by_detector.items():
        worst = max(evs, key=lambda e: (SEVERITY_LEVEL[e.severity], -e.step))
        findings.append(
            DoctorFinding(
                detector=name,
                severity=worst.severity,
                step=evs[0].step,
                message=worst.message,
                value=worst.value,
                severity_step=worst.step,
                event_steps=[e.step for e in evs],
            )
        )
    return sorted(findings, key=lambda f: (-SEVERITY_LEVEL[f.severity], f.step, f.detector))
