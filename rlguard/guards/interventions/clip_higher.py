"""Clip-higher on demand: widen the upper clip bound while the policy's entropy is collapsing and the
reward is not improving, and narrow it back once the entropy holds.

DAPO (Yu et al. 2025, arXiv 2503.14476, sec. 3.1) raises ``clip_high`` above ``clip_low`` so that low-probability
tokens can grow and the entropy does not collapse; Cui et al. (arXiv 2505.22617) show that the entropy falls
through the covariance of log-probability and advantage of the high-probability tokens, which the clip bounds
limit. :class:`ClipHigher` makes clip-higher adaptive: it acts on the findings of the ``entropy_collapse``
detector (entropy far below the run's own early baseline while the reward shows no rising trend, the one
definition of collapse in :mod:`rlguard.guards.detectors`), so it needs no threshold of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlguard.guards.events import SEVERITY_LEVEL, Severity
from rlguard.guards.interventions.base import Intervention, Proposal, StepContext

__all__ = ["ClipHigher"]


@dataclass(kw_only=True)
class ClipHigher(Intervention):
    """Clip-higher on demand: ``clip_high_scale *= factor`` (up to ``max_scale``) on each finding of ``on`` of at
    least ``severity``, ``cooldown`` steps after the last raise; ``/= factor`` (down to 1) after ``quiet_steps``
    steps without.

    Attributes:
        on: the detector whose findings mean the entropy is collapsing with flat reward.
        severity: the least severity that widens the bound. ``critical`` (entropy under 0.2x its baseline with flat
            reward, or under 0.05x): healthy runs on the collapse benchmark reach the ``warn`` level (0.5x) and
            learn on, so widening there changes healthy runs.
        factor: multiplier of one change of the upper clip bound.
        max_scale: the widest upper bound, times the configured one (DAPO: 0.28 / 0.2 = 1.4).
        cooldown: steps between two raises (the effect of a wider bound shows over several steps).
        quiet_steps: steps without a finding before each step back towards 1.
    """

    # registered under the name configs have always used; the module and the class say what it does
    name = "entropy_control"
    enabled_by_default = False
    summary = "clip_high x1.2 (up to x1.44) on critical entropy_collapse findings >= 5 steps apart; back after 20 quiet"

    on: str = "entropy_collapse"
    severity: Severity = "critical"
    factor: float = 1.2
    max_scale: float = 1.44
    cooldown: int = 5
    quiet_steps: int = 20

    def __post_init__(self) -> None:
        if not (self.factor > 1 and self.max_scale >= 1 and self.cooldown >= 1 and self.quiet_steps >= 1):
            raise ValueError(
                f"entropy_control needs factor > 1, max_scale >= 1, cooldown >= 1 and quiet_steps >= 1; got "
                f"factor={self.factor!r}, max_scale={self.max_scale!r}, cooldown={self.cooldown!r}, "
                f"quiet_steps={self.quiet_steps!r}."
            )
        self._s_scale = 1.0
        self._s_last_raise: int | None = None
        self._s_quiet = 0

    @property
    def scale(self) -> float:
        """The current multiplier of the upper clip bound."""
        return self._s_scale

    def propose(self, ctx: StepContext) -> Proposal | None:
        old = self._s_scale
        finding = ctx.findings.get(self.on)
        if finding is not None and SEVERITY_LEVEL[finding.severity] < SEVERITY_LEVEL[self.severity]:
            finding = None
        if finding is not None:
            self._s_quiet = 0
            ready = self._s_last_raise is None or ctx.step - self._s_last_raise >= self.cooldown
            if ready and old < self.max_scale:
                self._s_scale = min(old * self.factor, self.max_scale)
                self._s_last_raise = ctx.step
                why = f"{self.on}: {finding.message.split('. ')[0]}"
                return self._proposal(f"clip-higher: upper clip bound x{self._s_scale:.3g} ({why})")
        elif old > 1.0:
            self._s_quiet += 1
            if self._s_quiet >= self.quiet_steps:
                self._s_quiet = 0
                self._s_scale = max(old / self.factor, 1.0)
                return self._proposal(
                    f"clip-higher: upper clip bound back to x{self._s_scale:.3g} ({self.quiet_steps} steps without "
                    f"{self.on})"
                )
        return Proposal(controls={"clip_high_scale": self._s_scale})

    def _proposal(self, reason: str) -> Proposal:
        return Proposal("step", reason, {"clip_high_scale": self._s_scale})
