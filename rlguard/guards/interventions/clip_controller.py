"""The dynamic stability boundary: a clip range that keeps a divergence near its target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlguard.guards.interventions.base import Intervention, Proposal, StepContext

__all__ = ["ClipController"]


@dataclass(kw_only=True)
class ClipController(Intervention):
    """The dynamic stability boundary: scale the clip range so that ``metric`` stays near ``target``, the way
    PPO's adaptive KL coefficient keeps the KL near its target (Schulman et al. 2017, sec. 4):
    ``scale /= factor`` when ``metric > target * tolerance``, ``scale *= factor`` when
    ``metric < target / tolerance``, within ``[min_scale, max_scale]``.

    Attributes:
        metric: the divergence to control (``kl_old``: KL from the behaviour policy).
        target: its target value.
        tolerance: the band ``[target / tolerance, target * tolerance]`` leaves the scale alone.
        factor: multiplicative step of the scale.
        min_scale: tightest scale (of the objective's configured clip range).
        max_scale: widest scale; 1.0 never widens beyond the configured range.
        floor: values at or below it leave the scale alone: the on-policy first optimizer step of each batch has
            ``kl_old = 0`` whatever the update size, and would otherwise relax the range every other step.
        explained_by: detectors whose finding this step holds the scale where it is: a divergence they explain is not
            the step's (``stable``: ``mismatch_growth``: where pi_old is the engine's, ``kl_old`` measures the gap
            to the engine, not the update; :meth:`StepContext.gap_in_ratio`).
    """

    name = "clip_controller"
    summary = "clip range x1/1.5 when kl_old > 1.5 x target (0.02), x1.5 back when < target/1.5; scale in [0.25, 1]"

    renamed_fields: ClassVar[dict[str, str]] = {"hold_on": "explained_by"}

    metric: str = "kl_old"
    target: float = 0.02
    tolerance: float = 1.5
    factor: float = 1.5
    min_scale: float = 0.25
    max_scale: float = 1.0
    floor: float = 1e-8
    explained_by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.target <= 0 or self.tolerance <= 1 or self.factor <= 1 or not 0 < self.min_scale <= self.max_scale:
            raise ValueError("clip_controller needs target > 0, tolerance > 1, factor > 1, 0 < min_scale <= max_scale.")
        self._s_scale = 1.0

    def propose(self, ctx: StepContext) -> Proposal | None:
        value = ctx.stats.get(self.metric)
        held = ctx.gap_in_ratio(self.explained_by)
        if value is None or value != value or value <= self.floor or held:
            return Proposal(controls={"clip_scale": self._s_scale})
        old = self._s_scale
        if value > self.target * self.tolerance:
            self._s_scale = max(old / self.factor, self.min_scale)
        elif value < self.target / self.tolerance:
            self._s_scale = min(old * self.factor, self.max_scale)
        if self._s_scale != old:
            verb = "tighten" if self._s_scale < old else "relax"
            return Proposal(
                "step",
                f"{verb} clip range to x{self._s_scale:.3g} ({self.metric}={value:.3g}, target {self.target:g})",
                {"clip_scale": self._s_scale},
            )
        return Proposal(controls={"clip_scale": self._s_scale})
