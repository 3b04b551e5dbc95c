"""What detectors find and what the guard records."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["warn", "critical"]
SEVERITY_LEVEL: dict[str, int] = {"warn": 1, "critical": 2}


@dataclass(frozen=True)
class Finding:
    """One detector's verdict on one step.

    Attributes:
        severity: ``"warn"`` or ``"critical"``.
        value: the statistic it judged (e.g. the gradient norm, or its ratio to the baseline).
        threshold: the bound ``value`` crossed.
        message: what it saw, against which threshold, and what to do.
        transient: a one-step excursion over a rolling baseline (a spike). Its consequence shows only afterwards:
            the live guard acts on it at once (skip the step); the doctor, with hindsight, reports an isolated spike
            after which the run kept control as a warning (:mod:`rlguard.doctor.consequence`).
    """

    severity: Severity
    value: float
    threshold: float
    message: str
    transient: bool = False


@dataclass(frozen=True)
class Event:
    """A finding that changed a detector's alarm level, as recorded in ``Guard.events`` and ``events.jsonl``."""

    step: int
    detector: str
    severity: Severity
    value: float
    message: str
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)
