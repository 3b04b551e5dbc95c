"""Stop the run when a critical alarm persists despite the other interventions."""

from __future__ import annotations

from dataclasses import dataclass

from rlguard.guards.interventions.base import Intervention, Proposal, StepContext

__all__ = ["Halt"]


@dataclass(kw_only=True)
class Halt(Intervention):
    """Stop the run with a report when a critical alarm persists despite the other interventions.

    Attributes:
        critical_steps: steps a critical alarm may last before the run halts.
        ignore: detectors whose persistent alarms do not halt (data-side problems such as easy prompts).
    """

    name = "halt"
    summary = "halt when any critical alarm persists 25 steps (zero_variance_groups and truncation excepted)"

    critical_steps: int = 25
    ignore: tuple[str, ...] = ("zero_variance_groups", "truncation")

    def propose(self, ctx: StepContext) -> Proposal | None:
        stuck = [n for n, age in ctx.alarm_age.items() if age >= self.critical_steps and n not in self.ignore]
        return Proposal("halt", f"critical for {self.critical_steps}+ steps: {', '.join(stuck)}") if stuck else None
