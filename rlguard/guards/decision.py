"""What the guard decides each step: an outcome plus :class:`Controls` (``docs/design.md``, "Actuator contract").

:func:`rlguard.guards.actuator.apply_decision` is the one place where a :class:`Decision` takes effect.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from rlguard.guards.events import Event
from rlguard.guards.interventions import Action

__all__ = ["Controls", "Decision", "Outcome"]

Outcome = Literal["step", "skip", "rollback", "halt"]
_OUTCOME: dict[str, Outcome] = {"skip_step": "skip", "rollback": "rollback", "halt": "halt"}


@dataclass(frozen=True)
class Controls:
    """The knobs a decision sets, whatever its outcome (``docs/design.md``, "Actuator contract").

    Attributes:
        lr_scale: this step's LR is the scheduler's times this. It is the whole multiplier (interventions' persistent
            scales, e.g. the LR back-off's, times the ``lr_scale`` schedule), restated every step: actuators apply
            it to one step and never compound it.
        clip_scale: multiplies both clip bounds (the clip controller).
        clip_high_scale: multiplies the upper clip bound only, on top of ``clip_scale`` (clip-higher, DAPO).
        clip_low, clip_high: scheduled bounds replacing the configured ones before scaling; None keeps them.
        beta: scheduled KL coefficient; None keeps the configured one.
        entropy_coef: scheduled entropy-bonus coefficient; None keeps the configured one.
    """

    lr_scale: float = 1.0
    clip_scale: float = 1.0
    clip_high_scale: float = 1.0
    clip_low: float | None = None
    clip_high: float | None = None
    beta: float | None = None
    entropy_coef: float | None = None

    def capabilities_needed(self) -> frozenset[str]:
        """The actuator capabilities these controls need beyond ``lr_scale`` (``clip``, ``beta``, ``entropy_coef``)."""
        needed = set()
        if (
            self.clip_scale != 1.0
            or self.clip_high_scale != 1.0
            or self.clip_low is not None
            or self.clip_high is not None
        ):
            needed.add("clip")
        if self.beta is not None:
            needed.add("beta")
        if self.entropy_coef is not None:
            needed.add("entropy_coef")
        return frozenset(needed)

    def without(self, capabilities: Iterable[str]) -> Controls:
        """These controls with the objective's knobs of ``capabilities`` back at their configured values."""
        drop = set(capabilities)
        changes: dict[str, Any] = {}
        if "clip" in drop:
            changes.update(clip_scale=1.0, clip_high_scale=1.0, clip_low=None, clip_high=None)
        if "beta" in drop:
            changes["beta"] = None
        if "entropy_coef" in drop:
            changes["entropy_coef"] = None
        return replace(self, **changes) if changes else self


@dataclass(frozen=True)
class Decision:
    """What the adapter applies this step, identically on every rank: an outcome plus :class:`Controls`.

    Carried out by :func:`rlguard.guards.actuator.apply_decision`, the one place where a decision takes effect.

    Attributes:
        step: the optimizer step judged.
        action: the winning intervention's action: ``continue``, ``set_clip``, ``scale_lr`` (these three give the
            outcome ``step``), ``skip_step``, ``rollback`` or ``halt``.
        lr_scale, clip_scale, clip_high_scale, clip_low, clip_high, beta, entropy_coef: the controls
            (:class:`Controls`), applied whatever the outcome.
        rollback_to: the healthy step to restore, for ``rollback``.
        snapshot: this step was healthy and a snapshot is due: save model and optimizer state.
        events: events raised this step.
        reason: why the action was taken.
    """

    step: int
    action: Action = "continue"
    lr_scale: float = 1.0
    clip_scale: float = 1.0
    clip_low: float | None = None
    clip_high: float | None = None
    beta: float | None = None
    entropy_coef: float | None = None
    rollback_to: int | None = None
    snapshot: bool = False
    events: tuple[Event, ...] = ()
    reason: str = ""
    clip_high_scale: float = 1.0

    @property
    def outcome(self) -> Outcome:
        """``step`` (the update is applied), ``skip``, ``rollback`` or ``halt``."""
        return _OUTCOME.get(self.action, "step")

    @property
    def controls(self) -> Controls:
        """The knobs this decision sets."""
        return Controls(
            lr_scale=self.lr_scale,
            clip_scale=self.clip_scale,
            clip_high_scale=self.clip_high_scale,
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            beta=self.beta,
            entropy_coef=self.entropy_coef,
        )
