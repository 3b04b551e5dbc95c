"""Roll back to the last healthy snapshot on a slow failure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlguard.guards.interventions.base import Intervention, Proposal, StepContext

__all__ = ["Rollback", "rollback_trigger"]


def rollback_trigger(ctx: StepContext, critical: Sequence[str], max_consecutive_skips: int) -> str | None:
    """Why this step rolls back, or None: the detectors with a ``critical`` alarm, or the skipped steps in a row
    once they reach ``max_consecutive_skips`` (a run that keeps being skipped no longer learns)."""
    if critical:
        return ", ".join(critical)
    if ctx.consecutive_skips >= max_consecutive_skips:
        return f"{ctx.consecutive_skips} skipped steps in a row"
    return None


@dataclass(kw_only=True)
class Rollback(Intervention):
    """Roll model and optimizer back to the last healthy snapshot on a critical alarm of a slow failure
    (collapse cannot be undone by skipping a step), or after too many skipped steps in a row.

    Attributes:
        on: detectors whose critical alarm rolls back.
        max_consecutive_skips: skipped steps in a row that also roll back.
        max_rollbacks: after this many rollbacks the guard halts instead.
    """

    name = "rollback"
    summary = (
        "roll back on critical entropy/reward collapse, KL blow-up, repetition or mismatch growth, or 3 skips in a row"
    )

    on: tuple[str, ...] = ("entropy_collapse", "reward_collapse", "kl_ref_blowup", "repetition", "mismatch_growth")
    max_consecutive_skips: int = 3
    max_rollbacks: int = 3

    def __post_init__(self) -> None:
        self._s_rollbacks = 0

    def propose(self, ctx: StepContext) -> Proposal | None:
        why = rollback_trigger(ctx, [n for n in self.on if ctx.alarms.get(n) == "critical"], self.max_consecutive_skips)
        if why is None:
            return None
        if self._s_rollbacks >= self.max_rollbacks:
            return Proposal("halt", f"{why}; {self._s_rollbacks} rollbacks did not help")
        if ctx.last_healthy_step is None:
            return Proposal("halt", f"{why}; no healthy snapshot to roll back to")
        self._s_rollbacks += 1
        return Proposal("rollback", why, rollback_to=ctx.last_healthy_step)
