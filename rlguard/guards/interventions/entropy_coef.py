"""Adaptive entropy control: an entropy bonus whose coefficient rises while the policy's entropy is at or below a
target and falls above it, applied only at or below the target.

Skywork-OR1 (He et al. 2025, arXiv 2505.22312, "Adaptive Entropy Control", part of its MAGIC recipe) keeps the
entropy near a target ``H*`` with the loss ``L - c_k H``: after each optimizer step ``k`` with entropy ``H_k``,

    c_{k+1} = min(c_k + delta, c_max)   if H_k <= H*
    c_{k+1} = max(c_k - delta, c_min)   otherwise,

and the bonus of step ``k + 1`` is ``c_{k+1} H`` where ``H_k <= H*``, none otherwise (no coefficient before the first
measured entropy). This is TRL 1.16's ``use_adaptive_entropy`` controller (``GRPOTrainer._compute_loss``): the same
update, gate and order, with ``H_k`` the step's token-weighted mean entropy over every micro-batch and process (the
guard's ``entropy`` stat, :data:`rlguard.metrics.METRICS`). :class:`AdaptiveEntropy` proposes the resulting
``entropy_coef`` control; ``GuardedGRPOTrainer(use_adaptive_entropy=True)`` runs it in place of TRL's copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlguard.guards.interventions.base import Intervention, Proposal, StepContext

__all__ = ["AdaptiveEntropy"]


@dataclass(kw_only=True)
class AdaptiveEntropy(Intervention):
    """Skywork-OR1's adaptive entropy coefficient (module docstring): ``coef += delta`` (up to ``coef_max``) after a
    step whose ``stat`` is at or below ``target``, ``coef -= delta`` (down to ``coef_min``) after one above; the
    next step's ``entropy_coef`` control is ``coef`` at or below the target, 0 above it and before the first step.

    Attributes:
        target: the entropy ``H*`` (nats per token) below which the bonus acts (TRL's ``entropy_target``).
        delta: the change of the coefficient per optimizer step (TRL's ``entropy_coef_delta``).
        coef_min, coef_max: the coefficient's bounds (TRL's ``entropy_coef_min``, ``entropy_coef_max``).
        initial_coef: the coefficient before the first step (TRL's ``entropy_coef``), within the bounds.
        stat: the reduced stat measured (``entropy``: the token-weighted mean over the step's micro-batches and
            processes). A step without a finite value leaves the coefficient and its gate as they are.
    """

    name = "adaptive_entropy"
    enabled_by_default = False
    summary = "entropy bonus coef +0.005 per step at entropy <= 0.2, -0.005 above, in [0, 1]; applied only at <= 0.2"

    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    initial_coef: float = 0.0
    stat: str = "entropy"

    def __post_init__(self) -> None:
        values = {k: getattr(self, k) for k in ("target", "delta", "coef_min", "coef_max", "initial_coef")}
        bad = [f"{k}={v!r}" for k, v in values.items() if not _is_finite(v)]
        if bad:
            raise ValueError(f"adaptive_entropy needs finite numbers; got {', '.join(bad)}.")
        if not (
            self.target >= 0 and self.delta > 0 and 0 <= self.coef_min <= self.initial_coef <= self.coef_max
        ) or not (isinstance(self.stat, str) and self.stat):
            raise ValueError(
                "adaptive_entropy needs target >= 0, delta > 0, 0 <= coef_min <= initial_coef <= coef_max and a stat "
                f"name; got target={self.target!r}, delta={self.delta!r}, coef_min={self.coef_min!r}, "
                f"initial_coef={self.initial_coef!r}, coef_max={self.coef_max!r}, stat={self.stat!r}. With TRL these "
                "are entropy_target, entropy_coef_delta, entropy_coef_min, entropy_coef and entropy_coef_max."
            )
        self._s_coef = float(self.initial_coef)
        self._s_entropy: float | None = None  # the last step's entropy; None before the first (TRL: inf)

    @property
    def coef(self) -> float:
        """The controller's coefficient ``c`` after the last step (TRL logs it as ``entropy_coef``)."""
        return self._s_coef

    @property
    def applied_coef(self) -> float:
        """The coefficient of the next step's bonus: ``c`` if the last entropy was at or below the target, else 0."""
        return self._s_coef if self._s_entropy is not None and self._s_entropy <= self.target else 0.0

    def propose(self, ctx: StepContext) -> Proposal | None:
        before = self.applied_coef
        value = ctx.stats.get(self.stat)
        if value is not None and math.isfinite(value):
            if value <= self.target:
                self._s_coef = min(self._s_coef + self.delta, self.coef_max)
            else:
                self._s_coef = max(self._s_coef - self.delta, self.coef_min)
            self._s_entropy = float(value)
        after = self.applied_coef
        controls = {"entropy_coef": after}
        if (after > 0) != (before > 0):  # the bonus switches on or off; its steps of delta are not announced
            state = f"on at {after:.3g}" if after > 0 else "off"
            side = "<=" if after > 0 else ">"
            why = f"{self.stat}={self._s_entropy:.3g} {side} target {self.target:g}"
            return Proposal("step", f"adaptive entropy bonus {state} ({why}; coef {self._s_coef:.3g})", controls)
        return Proposal(controls=controls)


def _is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
