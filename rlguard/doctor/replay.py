"""The live guard replayed on a log (``rlguard doctor --live PRESET LOG``): every record, read as the doctor reads it
(:func:`~rlguard.doctor.diagnose.read_canonical`), goes through ``Guard.observe`` of that preset, its detectors,
interventions and live consequence rule as the preset configures them, and the decisions it would have made are
kept: every outcome other than ``step``, and every step whose controls change.

The log goes on as it was recorded: after a rollback the replay feeds the next records of the real run (the guard,
reset by its rollback, judges them afresh); a halt ends the replay, since the run would have stopped there. No
actuator is bound, so every intervention acts as where all capabilities are available.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlguard.doctor.diagnose import EXIT_CANNOT_JUDGE, EXIT_CRITICAL, EXIT_OK, CanonicalLog, read_canonical
from rlguard.doctor.readers import MetricLog
from rlguard.guards import Guard, GuardConfig
from rlguard.guards.decision import Controls, Decision, Outcome

__all__ = ["LiveDecision", "Replay", "non_neutral", "replay_live"]

_NEUTRAL = Controls()


def non_neutral(controls: Controls) -> dict[str, Any]:
    """The fields of ``controls`` that differ from neutral (``Controls()``: the run as configured)."""
    return {
        f.name: getattr(controls, f.name)
        for f in dataclasses.fields(controls)
        if getattr(controls, f.name) != getattr(_NEUTRAL, f.name)
    }


@dataclass(frozen=True)
class LiveDecision:
    """One decision of the replayed guard worth showing.

    Attributes:
        step: the logged step it judged.
        outcome: as in :class:`~rlguard.guards.decision.Decision`: ``step``, ``skip``, ``rollback`` or ``halt``.
        controls: its controls that differ from neutral.
        reason: why (the decision's reason, or for a change of controls the messages of its action events).
        rollback_to: the healthy step a rollback restores.
    """

    step: int
    outcome: Outcome
    controls: dict[str, Any]
    reason: str
    rollback_to: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"step", "outcome", "controls", "reason"}`` (and ``rollback_to`` for a rollback)."""
        out: dict[str, Any] = {"step": self.step, "outcome": self.outcome, "controls": self.controls}
        out["reason"] = self.reason
        if self.rollback_to is not None:
            out["rollback_to"] = self.rollback_to
        return out


@dataclass(frozen=True)
class Replay:
    """What the live guard of ``preset`` would have decided on a log.

    Attributes:
        preset: the guard preset replayed.
        read: the log as read (keys, canonical stats).
        decisions: non-``step`` outcomes and changes of controls, in order.
        replayed: records replayed (all of them, or up to a halt).
        judged: whether a detector other than ``nonfinite`` got past its warm-up.
    """

    preset: str
    read: CanonicalLog
    decisions: list[LiveDecision] = field(default_factory=list)
    replayed: int = 0
    judged: bool = False

    def count(self, outcome: Outcome) -> int:
        """Decisions with ``outcome``."""
        return sum(d.outcome == outcome for d in self.decisions)

    @property
    def first_action(self) -> LiveDecision | None:
        """The first skip, rollback or halt."""
        return next((d for d in self.decisions if d.outcome != "step"), None)

    @property
    def exit_code(self) -> int:
        """1 if the guard would have rolled back or halted (the run would not have gone on as it did); 3 if it
        could not judge (no detector but ``nonfinite`` past its warm-up, or part of the log unread); else 0.
        Skips and changes of controls alone leave the run's course, and exit 0."""
        if self.count("rollback") or self.count("halt"):
            return EXIT_CRITICAL
        return EXIT_OK if self.judged and not self.read.log.report.partial else EXIT_CANNOT_JUDGE

    def to_dict(self) -> dict[str, Any]:
        """The ``--live ... --json`` document."""
        return {
            "preset": self.preset,
            "path": str(self.read.log.path),
            "records": len(self.read.rows),
            "replayed": self.replayed,
            "decisions": [d.to_dict() for d in self.decisions],
            "auto_mapped_keys": self.read.keys.auto_mapped,
            "exit_code": self.exit_code,
        }


def replay_live(
    path: str | Path,
    preset: str,
    key_map: Mapping[str, str] | None = None,
    *,
    auto_map: bool = True,
    step_key: str | None = None,
    row_steps: bool = False,
    run: str | None = None,
    log: MetricLog | None = None,
) -> Replay:
    """Replay the log at ``path`` through a live ``Guard(GuardConfig.preset(preset))``, record by record
    (``step_key``, ``row_steps``, ``run``: as :func:`~rlguard.doctor.readers.read_log`'s; ``log``: the log at
    ``path`` already read, as :func:`~rlguard.doctor.diagnose.read_canonical` takes it)."""
    read = read_canonical(path, key_map, auto_map=auto_map, log=log, step_key=step_key, row_steps=row_steps, run=run)
    guard = Guard(GuardConfig.preset(preset))
    decisions: list[LiveDecision] = []
    previous: dict[str, Any] = {}
    replayed = 0
    for step, stats in read.rows:
        decision = guard.observe(step, stats)
        replayed += 1
        controls = non_neutral(decision.controls)
        if decision.outcome != "step" or controls != previous:
            decisions.append(LiveDecision(step, decision.outcome, controls, _reason(decision), decision.rollback_to))
        previous = controls
        if decision.outcome == "halt":
            break
    seen = guard.observations()
    judged = any(seen[n] > det.warmup for n, det in guard.detectors.items() if n != "nonfinite")
    return Replay(preset, read, decisions, replayed, judged)


def _reason(decision: Decision) -> str:
    if decision.reason:
        return decision.reason
    actions = [e.message for e in decision.events if e.detector.startswith("action:")]
    return "; ".join(actions) or ("controls changed" if non_neutral(decision.controls) else "controls back to neutral")
