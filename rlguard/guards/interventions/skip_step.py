"""Skip the optimizer step of a poisoned batch: the step itself decides."""

from __future__ import annotations

from dataclasses import dataclass

from rlguard.guards.events import SEVERITY_LEVEL, Severity
from rlguard.guards.interventions.base import Intervention, Proposal, StepContext

__all__ = ["SkipStep"]


@dataclass(kw_only=True)
class SkipStep(Intervention):
    """Skip the optimizer step when this step's batch is poisoned (non-finite values, a gradient spike, an
    exploding ratio): weights and optimizer state stay as they are.

    Attributes:
        on: detectors whose finding on this very step skips it.
        severity: the least severity that skips.
    """

    name = "skip_step"
    summary = "skip the optimizer step on a critical nonfinite / grad_norm_spike / ratio_explosion finding"

    on: tuple[str, ...] = ("nonfinite", "grad_norm_spike", "ratio_explosion")
    severity: Severity = "critical"

    def propose(self, ctx: StepContext) -> Proposal | None:
        # the step itself decides: the severity the detector observed (``Finding.observed``), not its label by
        # consequence (a lone spike is a warning by consequence, and still a poisoned step)
        level = SEVERITY_LEVEL[self.severity]
        hits = [
            n
            for n in self.on
            if n in ctx.findings and SEVERITY_LEVEL[ctx.findings[n].observed or ctx.findings[n].severity] >= level
        ]
        return Proposal("skip", f"poisoned step ({', '.join(hits)})") if hits else None
