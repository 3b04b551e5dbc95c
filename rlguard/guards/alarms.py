"""One detector's alarm: raised after ``patience`` findings in a row, cleared after ``clear_after`` clean
observations (hysteresis), so that one noisy step neither raises nor clears it."""

from __future__ import annotations

from dataclasses import dataclass

from rlguard.guards.events import SEVERITY_LEVEL, Event, Finding

__all__ = ["AlarmState"]


@dataclass
class AlarmState:
    """The alarm of one detector, as saved in the guard's state (:data:`~rlguard.guards.state.ALARM_FIELDS`).

    Attributes:
        level: 0 none, 1 warn, 2 critical.
        streak: consecutive findings.
        clean: consecutive clean observations.
        critical_age: consecutive steps at critical.
    """

    level: int = 0
    streak: int = 0
    clean: int = 0
    critical_age: int = 0

    def see(self, step: int, name: str, finding: Finding | None, patience: int, clear_after: int) -> Event | None:
        """One observation of detector ``name``: the event of the alarm it raises (or raises to critical), or None."""
        if finding is None:
            self.streak, self.clean = 0, self.clean + 1
            if self.level and self.clean >= clear_after:
                self.level = 0
            return None
        self.streak, self.clean = self.streak + 1, 0
        level = SEVERITY_LEVEL[finding.severity]
        if self.streak >= patience and level > self.level:
            self.level = level
            return Event(step, name, finding.severity, finding.value, finding.message, finding.threshold)
        return None

    def raise_critical(self, step: int, name: str, finding: Finding) -> Event | None:
        """An earlier lone critical finding whose consequence showed at this step: the alarm goes critical."""
        if self.level >= 2:
            return None
        self.level = 2
        return Event(step, name, "critical", finding.value, finding.message, finding.threshold)
