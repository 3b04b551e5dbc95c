"""A run folder with the guard's ``events.jsonl`` and no training log (a TRL run that died before its first checkpoint,
a job whose logger wrote elsewhere): the doctor reports the events the guard recorded instead of refusing the folder.

With no log there is nothing to judge the events against (no hindsight, :mod:`rlguard.guards.consequence`), so they
count as recorded: a critical detector event or a halt is a critical verdict (exit code 1, as
:attr:`Diagnosis.critical <rlguard.doctor.Diagnosis.critical>` counts them), anything less is still "no training log"
(exit code 2), with the events shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlguard.doctor.diagnose import EXIT_BAD_INPUT, EXIT_CRITICAL, critical_event
from rlguard.doctor.readers import LogInputError, find_log
from rlguard.guards.events import EVENTS_FILE, Event, EventsFileError, read_events

__all__ = ["EventsOnly", "events_only"]


@dataclass(frozen=True)
class EventsOnly:
    """The guard's events of a run folder that holds no training log.

    Attributes:
        path: the ``events.jsonl`` read.
        no_log: why there is no log to judge (the reader's error, naming what it looked for).
        events: the events, as the guard recorded them.
        warnings: lines of the file skipped (a torn last line).
    """

    path: Path
    no_log: str
    events: list[Event]
    warnings: list[str] = field(default_factory=list)

    @property
    def critical(self) -> list[Event]:
        """The events that make the run critical: critical detector events and halts."""
        return [e for e in self.events if critical_event(e)]

    @property
    def exit_code(self) -> int:
        """1 with a critical event, else 2 (no training log)."""
        return EXIT_CRITICAL if self.critical else EXIT_BAD_INPUT

    @property
    def summary(self) -> str:
        """One line: the events there are, and the verdict (:attr:`no_log` says what log is missing)."""
        n, k = len(self.events), len(self.critical)
        verdict = f"{k} of them critical" if k else "none critical"
        return f"the guard's {self.path} holds {n} event(s), {verdict}, as recorded (no training log to judge them by)"

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {
            "error": self.no_log,
            "live_events_path": str(self.path),
            "live_events": [e.to_dict() for e in self.events],
            "live_warnings": self.warnings,
            "critical_events": len(self.critical),
            "exit_code": self.exit_code,
        }


def events_only(path: str | Path) -> EventsOnly | None:
    """The events of run folder ``path`` when it holds an ``events.jsonl`` with at least one event and no training
    log; None otherwise (a log is there, or no events: the reader's own error stands)."""
    folder = Path(path)
    events_path = folder / EVENTS_FILE
    if not folder.is_dir() or not events_path.is_file():
        return None
    try:
        find_log(folder)
    except LogInputError as err:
        no_log = str(err)
    else:
        return None  # a log is there: its own error (a bad record, ...) is the answer
    try:
        read = read_events(events_path)
    except (EventsFileError, OSError):
        return None
    if not read.events:
        return None
    return EventsOnly(events_path, no_log, list(read.events), list(read.warnings))
