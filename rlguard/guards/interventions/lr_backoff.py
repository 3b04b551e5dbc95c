"""Back the learning rate off on trouble, and let it recover after a quiet period."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlguard.guards.events import Severity
from rlguard.guards.interventions.base import Intervention, Proposal, StepContext, findings_at_least

__all__ = ["LRBackoff"]


@dataclass(kw_only=True)
class LRBackoff(Intervention):
    """Scale the learning rate down on trouble and let it recover after a quiet period.

    Attributes:
        on: detectors whose findings back the LR off.
        severity: the least severity that backs off.
        factor: multiplier per back-off.
        min_scale: the scale never goes below this.
        cooldown: steps between two back-offs.
        quiet_steps: steps without trouble before each recovery step.
        recover_factor: multiplier per recovery step (capped at 1).

    On a step where a detector whose cause another enabled intervention answers found something (the cause table,
    :data:`~rlguard.guards.interventions.causes.CAUSES`: a train-inference gap, ``mismatch_growth``, answered by
    ``mismatch_remedy``, which backs the LR off as its last rung), the scale holds: the LR back-off is the last
    answer to a gap, not the first, and the gap also explains the signals themselves (the ratio to the engine's
    pi_old carries it; a biased gradient grows). Where no enabled intervention answers it (``"mismatch_remedy":
    None``), the back-off acts on it as usual.
    """

    name = "lr_backoff"
    summary = "LR x0.5 on warn from KL/grad/mismatch/clip detectors (>= 10 steps apart); x2 after 20 quiet steps"

    renamed_fields: ClassVar[dict[str, str]] = {"hold_on": ""}  # the cause table decides it now

    on: tuple[str, ...] = (
        "grad_norm_spike",
        "grad_norm_explosion",
        "kl_ref_blowup",
        "kl_old_blowup",
        "clip_frac_burst",
        "mismatch_growth",
        "ratio_explosion",
        "length_explosion",
    )
    severity: Severity = "warn"
    factor: float = 0.5
    min_scale: float = 0.05
    cooldown: int = 10
    quiet_steps: int = 20
    recover_factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.factor < 1 or not 0 < self.min_scale <= 1 or self.recover_factor <= 1:
            raise ValueError("lr_backoff needs 0 < factor < 1, 0 < min_scale <= 1 and recover_factor > 1.")
        self._s_scale = 1.0
        self._s_last_backoff: int | None = None
        self._s_last_trouble: int | None = None
        self._s_last_recover: int | None = None

    def propose(self, ctx: StepContext) -> Proposal | None:
        hits = findings_at_least(ctx.findings, self.on, self.severity)
        if hits and ctx.yields(self.name):
            return Proposal(controls={"lr_scale": self._s_scale})
        if hits:
            self._s_last_trouble = ctx.step
            ready = self._s_last_backoff is None or ctx.step - self._s_last_backoff >= self.cooldown
            if ready and self._s_scale > self.min_scale:
                self._s_scale = max(self._s_scale * self.factor, self.min_scale)
                self._s_last_backoff = ctx.step
                return Proposal("step", f"LR x{self._s_scale:.3g} ({', '.join(hits)})", {"lr_scale": self._s_scale})
            return Proposal(controls={"lr_scale": self._s_scale})
        if self._s_scale < 1.0:
            since = [s for s in (self._s_last_trouble, self._s_last_recover) if s is not None]
            if not since or ctx.step - max(since) >= self.quiet_steps:
                self._s_scale = min(self._s_scale * self.recover_factor, 1.0)
                self._s_last_recover = ctx.step
                return Proposal("step", f"LR recovering to x{self._s_scale:.3g}", {"lr_scale": self._s_scale})
        return Proposal(controls={"lr_scale": self._s_scale})
