"""Trust-region control of the step size: keep how far each optimizer step moves the policy inside a band by a
persistent LR multiplier, from the first step and without a baseline.

PPO implementations adapt the learning rate to the measured KL of each update (OpenAI baselines'
``ppo1``/``adaptive`` schedule and rl_games' ``AdaptiveScheduler``: ``lr /= 1.5`` when ``kl > 2 * kl_target``,
``lr *= 1.5`` when ``kl < kl_target / 2``, within bounds). :class:`TrustRegion` does that for each signal in
``limits`` (the largest tolerated value of ``kl_old`` on off-policy steps, and of ``update_ratio``,
``||theta_t - theta_(t-1)|| / ||theta_(t-1)||``, which actuators that measure it report into the next step's
stats), with two differences:

- the cut is proportional: a signal ``p`` times over its limit that grows like ``lr ** order`` (``order`` 1 for
  the update norm under Adam, whose step is about ``lr`` per coordinate; 2 for a KL, quadratic in a small step)
  divides the scale by ``p ** (1 / order)`` (at most ``max_cut``), which lands on the limit in one step;
- the scale never exceeds ``cap`` (1.0: the configured LR), so on a healthy run whose signals stay below their
  limits the controller never acts; recovery is slow (``recover_factor`` after ``quiet_steps`` steps with every
  signal below ``limit / band``).

After a rollback the cap is multiplied by ``rollback_cap`` and every limit by ``rollback_tighten``, for good:
the run does not walk back into the same crash at the same step size (:meth:`TrustRegion.on_rollback`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlguard.guards.interventions.base import Intervention, Proposal, StepContext

if TYPE_CHECKING:
    from rlguard.guards.guard import Guard

__all__ = ["TrustRegion", "measures_update"]


@dataclass(kw_only=True)
class TrustRegion(Intervention):
    """Scale the LR so that each step's movement of the policy stays within ``limits`` (module docstring).

    Attributes:
        limits: ``(metric, limit, order)``: the largest tolerated value of ``metric`` and the power of the LR it
            grows with. Missing metrics, and values at or below ``floor`` (the on-policy first step of a batch has
            ``kl_old = 0`` whatever the update size), are not evidence.
        band: recovery only when every observed signal is below ``limit / band``.
        max_cut: one step divides the scale by at most this.
        min_scale: the scale never goes below this.
        quiet_steps: steps with evidence, all below the band, before each recovery step.
        recover_factor: multiplier of one recovery step (up to ``cap``).
        rollback_cap: each rollback multiplies the cap (the largest scale, 1.0 at first) by this.
        rollback_tighten: each rollback multiplies every limit by this.
        floor: values at or below it are not evidence.
    """

    name = "trust_region"
    enabled_by_default = False
    summary = (
        "LR x(limit/value)^(1/order) when update_ratio > 0.02; x1.25 back (up to the cap) after "
        "5 steps below limit/4; a rollback halves the cap and tightens the limits x0.7 for good"
    )

    limits: tuple[tuple[str, float, float], ...] = (("update_ratio", 0.02, 1.0),)
    band: float = 4.0
    max_cut: float = 10.0
    min_scale: float = 0.01
    quiet_steps: int = 5
    recover_factor: float = 1.25
    rollback_cap: float = 0.5
    rollback_tighten: float = 0.7
    floor: float = 1e-8

    def __post_init__(self) -> None:
        for metric, limit, order in self.limits:
            if not (limit > 0 and order > 0):
                raise ValueError(
                    f"trust_region limits need limit > 0 and order > 0; got {(metric, limit, order)!r} for {metric!r}."
                )
        checks = {
            "band": self.band > 1,
            "max_cut": self.max_cut > 1,
            "min_scale": 0 < self.min_scale <= 1,
            "quiet_steps": self.quiet_steps >= 1,
            "recover_factor": self.recover_factor > 1,
            "rollback_cap": 0 < self.rollback_cap <= 1,
            "rollback_tighten": 0 < self.rollback_tighten <= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                f"trust_region got {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)}; it needs band > 1, "
                "max_cut > 1, 0 < min_scale <= 1, quiet_steps >= 1, recover_factor > 1, 0 < rollback_cap <= 1 and "
                "0 < rollback_tighten <= 1."
            )
        self._s_scale = 1.0
        self._s_cap = 1.0
        self._s_tighten = 1.0
        self._s_quiet = 0
        self._s_proposed = 1.0  # the scale of the last proposal: a change of it is an event
        self._s_note = ""

    @property
    def scale(self) -> float:
        """The current LR multiplier."""
        return self._s_scale

    @property
    def cap(self) -> float:
        """The largest multiplier the controller recovers to (1.0 until a rollback)."""
        return self._s_cap

    def _evidence(self, ctx: StepContext) -> list[tuple[str, float, float, float]]:
        """``(metric, value, limit now, order)`` of each signal with evidence this step."""
        found = []
        for metric, limit, order in self.limits:
            value = ctx.stats.get(metric)
            if value is not None and math.isfinite(value) and value > self.floor:
                found.append((metric, value, limit * self._s_tighten, order))
        return found

    def propose(self, ctx: StepContext) -> Proposal | None:
        evidence = self._evidence(ctx)
        why = self._s_note  # set by on_rollback: the cap came down since the last proposal
        self._s_note = ""
        if evidence:
            # the LR factor each signal asks to divide by: (value / limit) ** (1 / order)
            factor, metric, value, limit = max(((v / b) ** (1.0 / o), m, v, b) for m, v, b, o in evidence)
            signal = f"{metric}={value:.3g}, limit {limit:.3g}"
            if factor > 1.0:
                self._s_quiet = 0
                self._s_scale = max(self._s_scale / min(factor, self.max_cut), self.min_scale)
                why = f"LR cut to x{self._s_scale:.3g} ({signal})"
            elif all(v < b / self.band for _, v, b, _ in evidence):
                self._s_quiet += 1
                if self._s_quiet >= self.quiet_steps and self._s_scale < self._s_cap:
                    self._s_quiet = 0
                    self._s_scale = min(self._s_scale * self.recover_factor, self._s_cap)
                    quiet = f"below limit/{self.band:g} for {self.quiet_steps} steps"
                    why = f"LR recovers to x{self._s_scale:.3g} ({signal}; {quiet})"
            else:
                self._s_quiet = 0
        if self._s_scale != self._s_proposed:
            self._s_proposed = self._s_scale
            return Proposal("step", f"trust region: {why}", {"lr_scale": self._s_scale})
        return Proposal(controls={"lr_scale": self._s_scale})

    def on_rollback(self, step: int) -> None:
        """The rolled-back stretch crashed at this step size: lower the cap and tighten the limits for good."""
        self._s_cap = max(self._s_cap * self.rollback_cap, self.min_scale)
        self._s_tighten *= self.rollback_tighten
        self._s_scale = min(self._s_scale, self._s_cap)
        self._s_quiet = 0
        self._s_note = (
            f"rollback at step {step}: LR x{self._s_scale:.3g}, cap x{self._s_cap:.3g}, limits x{self._s_tighten:.3g}"
        )


def measures_update(guard: Guard | None) -> bool:
    """Whether ``guard`` runs a :class:`TrustRegion` that reads ``update_ratio``: the actuator must then measure
    each update (``TorchActuator(measure_update=True)``: a float64 host copy of the trained parameters, this
    rank's share under DDP, and one chunk in transit; :mod:`rlguard.guards.actuation.update_meter`)."""
    if guard is None:
        return False
    return any(
        isinstance(iv, TrustRegion) and any(metric == "update_ratio" for metric, _, _ in iv.limits)
        for iv in guard.interventions.values()
    )
