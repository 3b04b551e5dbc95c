"""Rollbacks that learn: roll back on the same alarms as :class:`~rlguard.guards.interventions.rollback.Rollback`, and
on any critical alarm that persists (where :class:`~rlguard.guards.interventions.halt.Halt` would stop the run), but
halt only after repeated *failed* recoveries, not after a fixed number of rollbacks over the whole run.

A recovery fails when the next rollback is needed within ``probation`` steps of the last one: the run walked into
the same crash again. A recovery that held for ``probation`` steps resets the count. What makes the next attempt
differ from the last is in the other interventions' :meth:`~rlguard.guards.interventions.Intervention.on_rollback`
(:class:`~rlguard.guards.interventions.trust_region.TrustRegion` lowers its LR cap and tightens its limits for good).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlguard.guards.interventions.base import Intervention, Proposal, StepContext
from rlguard.guards.interventions.halt import Halt
from rlguard.guards.interventions.rollback import Rollback, no_snapshot_before, rollback_trigger

__all__ = ["Recovery"]


@dataclass(kw_only=True)
class Recovery(Intervention):
    """:class:`~rlguard.guards.interventions.rollback.Rollback` that halts after ``max_failures`` failed recoveries in a
    row.

    Attributes:
        on: detectors whose critical alarm rolls back at once (as ``rollback``).
        critical_steps: any other detector's critical alarm rolls back once it lasts this many steps (``halt``'s
            rule, turned into a recovery attempt).
        ignore: detectors whose persistent alarms do not roll back (data-side problems, as for ``halt``).
        max_consecutive_skips: poisoned batches skipped in a row that also roll back (as ``rollback``).
        max_failures: rollbacks in a row, each within ``probation`` steps of the previous one, before halting.
        probation: steps after a rollback within which the next one counts the recovery as failed.

    ``on`` and ``max_consecutive_skips`` default to ``rollback``'s, ``critical_steps`` and ``ignore`` to ``halt``'s.
    """

    name = "recovery"
    enabled_by_default = False
    summary = (
        "rollback on rollback's alarms or any critical alarm lasting 25 steps; halt only after 3 rollbacks in a row "
        "each within 30 steps of the last"
    )

    on: tuple[str, ...] = Rollback.on
    max_consecutive_skips: int = Rollback.max_consecutive_skips
    critical_steps: int = Halt.critical_steps
    ignore: tuple[str, ...] = Halt.ignore
    max_failures: int = 3
    probation: int = 30

    def __post_init__(self) -> None:
        if self.max_failures < 1 or self.probation < 1 or self.critical_steps < 1:
            raise ValueError(
                f"recovery needs max_failures >= 1, probation >= 1 and critical_steps >= 1; got "
                f"max_failures={self.max_failures!r}, probation={self.probation!r}, "
                f"critical_steps={self.critical_steps!r}."
            )
        self._s_rollbacks = 0
        self._s_failures = 0
        self._s_last_rollback: int | None = None

    def propose(self, ctx: StepContext) -> Proposal | None:
        critical = [n for n in self.on if ctx.alarms.get(n) == "critical"]
        critical += [
            n
            for n, age in ctx.alarm_age.items()
            if age >= self.critical_steps and n not in self.ignore and n not in critical
        ]
        why = rollback_trigger(ctx, critical, self.max_consecutive_skips)
        if why is None:
            return None
        last = self._s_last_rollback
        failed = last is not None and ctx.step - last < self.probation
        failures = self._s_failures + 1 if failed else 0
        if failures >= self.max_failures:
            return Proposal("halt", f"{why}; {failures} recoveries in a row failed within {self.probation} steps")
        if (none := no_snapshot_before(ctx, critical)) is not None:
            return Proposal("halt", f"{why}; {none}")
        self._s_failures, self._s_last_rollback = failures, ctx.step
        self._s_rollbacks += 1
        note = f" (recovery {failures} in a row failed)" if failed else ""
        return Proposal("rollback", f"{why}{note}", rollback_to=ctx.last_healthy_step)
