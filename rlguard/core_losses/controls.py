"""The knobs a guard turns while training runs: :class:`Controls` (``docs/design.md``, "Actuator contract").

They live here, below the guard layer, because the objective applies most of them itself
(:meth:`rlguard.core_losses.Objective.with_controls`); the guard's :class:`~rlguard.guards.Decision` carries one
``Controls`` per step and the framework's actuator carries out the rest (``lr_scale`` on the optimizer step).

A control is one field (:func:`_control`): its neutral default, its range, the actuator capability it needs, how the
guard combines the values interventions and schedules propose (a ``product`` of multipliers, or a value that
``replace``-s the configured one) and the action an intervention's change of it is logged as; what it does to the
objective is one line of ``Objective.with_controls``. Everything else (combining proposals, which controls an
actuator cannot carry out, resetting them to neutral, record-only marks) is derived from the fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

__all__ = ["Controls"]


Combine = Literal["product", "replace"]


def _control(
    default: float | None,
    capability: str,
    *,
    combine: Combine = "replace",
    logged_as: str = "set_clip",
    low: float = 0.0,
    strict: bool = False,
    kind: Literal["number", "flag"] = "number",
) -> Any:
    """A control's field: neutral ``default``, the actuator ``capability`` it needs, how proposals ``combine``
    (``product``: multiplied, schedules too; ``replace``: the schedule's value, then the last intervention's that
    sets one), the action an intervention's change of it is ``logged_as`` (``action:<name>`` events:
    ``set_clip`` for the objective's knobs, ``scale_lr`` for the LR), and its range (``> low`` if ``strict``);
    a ``flag`` is True or False (switched on by the last intervention that proposes it)."""
    metadata = {
        "capability": capability,
        "combine": combine,
        "logged_as": logged_as,
        "low": low,
        "strict": strict,
        "kind": kind,
    }
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Controls:
    """The knobs a decision sets, whatever its outcome. Defaults are neutral (the run as configured).

    Attributes:
        lr_scale: this step's LR is the scheduler's times this. It is the whole multiplier (interventions' persistent
            scales, e.g. the LR back-off's, times the ``lr_scale`` schedule), restated every step: actuators apply
            it to one step and never compound it. Carried out by the actuator, not the objective.
        clip_scale: multiplies both clip bounds of the objective (the clip controller).
        clip_high_scale: multiplies the upper clip bound only, on top of ``clip_scale`` (clip-higher, DAPO).
        clip_low, clip_high: scheduled bounds replacing the configured ones before scaling; None keeps them.
        beta: scheduled KL coefficient; None keeps the configured one.
        entropy_coef: scheduled entropy-bonus coefficient; None keeps the configured one.
        kept_gradient: the objective's hard clip becomes a truncated, detached weight at its upper bound, so that
            every token keeps its gradient (``Objective.kept_gradient``; the remedy for a train-inference gap where
            pi_old is the engine's).
        rollout_is_cap: token-level truncated importance sampling against the engine's log-probs with this cap
            (TIS), where the run configured none; needs the engine's log-probs beside the trainer's pi_old.
        rollout_mask_high: a geometric-mean rejection mask ``[1 / C, C]`` against the engine's log-probs
            (IcePop-style MIS), where the run configured none; likewise, and an actuator whose framework computes
            the correction itself declares ``rollout_mask`` only where it applies this very mask.
        off_policy_mask_delta: DeepSeek-V3.2's off-policy sequence mask with this ``delta`` (arXiv 2512.02556,
            eq. 9: a negative-advantage sequence whose token mean of ``log pi_behaviour - log pi`` exceeds ``delta``
            is dropped; the behaviour log-probs are the engine's where the loop passes them, else pi_old's), where
            the run configured none.
        max_staleness: the asynchronous pipeline's staleness bound in policy versions (TRL's ``max_staleness``,
            verl's ``async_training.staleness_threshold`` as the adapter translates it), where lower than the
            configured one; None keeps the configured. Carried out by the actuator, not the objective.
        stale_drop_age: samples older than this many policy versions are dropped before the loss, by the
            framework's own mechanism (TRL's queue drops samples over ``max_staleness``); None drops none beyond
            the configured. Carried out by the actuator.
    """

    lr_scale: float = _control(1.0, "lr_scale", combine="product", logged_as="scale_lr")
    clip_scale: float = _control(1.0, "clip", combine="product", strict=True)
    clip_high_scale: float = _control(1.0, "clip", combine="product", strict=True)
    clip_low: float | None = _control(None, "clip")
    clip_high: float | None = _control(None, "clip")
    beta: float | None = _control(None, "beta")
    entropy_coef: float | None = _control(None, "entropy_coef")
    kept_gradient: bool = _control(False, "kept_gradient", kind="flag")
    rollout_is_cap: float | None = _control(None, "rollout_correction", low=1.0)
    rollout_mask_high: float | None = _control(None, "rollout_mask", low=1.0)
    off_policy_mask_delta: float | None = _control(None, "off_policy_mask")
    max_staleness: int | None = _control(None, "staleness_bound")
    stale_drop_age: int | None = _control(None, "drop_stale")

    def __post_init__(self) -> None:
        for f in _FIELDS:
            value = getattr(self, f.name)
            if value is f.default:  # neutral (1.0, None, False) is always valid: most controls are, every step
                continue
            if f.metadata["kind"] == "flag":
                if not isinstance(value, bool):
                    raise ValueError(f"controls: {f.name} must be True or False; got {value!r}.")
                continue
            low, strict = f.metadata["low"], f.metadata["strict"]
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not (ok and (value > low if strict else value >= low)):
                need = f"a finite number {'>' if strict else '>='} {low:g}"
                raise ValueError(f"controls: {f.name} must be {'None or ' * (f.default is None)}{need}; got {value!r}.")

    @classmethod
    def capabilities(cls) -> dict[str, str]:
        """``{control: the actuator capability it needs}`` (``docs/design.md``, "Actuator contract")."""
        return {f.name: f.metadata["capability"] for f in _FIELDS}

    @classmethod
    def logged_as(cls) -> dict[str, str]:
        """``{control: the action an intervention's change of it is logged as}``."""
        return {f.name: f.metadata["logged_as"] for f in _FIELDS}

    @classmethod
    def combine(cls, proposed: Sequence[Mapping[str, float | None]], scheduled: Mapping[str, float]) -> Controls:
        """One step's controls from the interventions' ``proposed`` values (in their order) and the schedules'
        values: multipliers multiply (in that order, then the schedule's), other controls take the schedule's
        value, replaced by the last intervention that proposes one; what nobody sets stays neutral. A proposed
        ``None`` sets nothing (the control as configured, or as scheduled)."""
        values: dict[str, Any] = {}
        for f in _FIELDS:
            given = [v for p in proposed if (v := p.get(f.name)) is not None]
            if f.metadata["combine"] == "product":
                value = math.prod(given)
                values[f.name] = value * scheduled[f.name] if f.name in scheduled else value
            elif given or f.name in scheduled:
                values[f.name] = given[-1] if given else scheduled[f.name]
        return cls(**values)

    def capabilities_needed(self) -> frozenset[str]:
        """The actuator capabilities of the controls that differ from neutral."""
        return frozenset(f.metadata["capability"] for f in _FIELDS if getattr(self, f.name) != f.default)

    def without(self, capabilities: Iterable[str]) -> Controls:
        """These controls with those needing ``capabilities`` back at neutral."""
        drop = set(capabilities)
        changes: dict[str, Any] = {f.name: f.default for f in _FIELDS if f.metadata["capability"] in drop}
        return replace(self, **changes) if any(getattr(self, k) != v for k, v in changes.items()) else self

    def to_dict(self) -> dict[str, float | None]:
        """The controls as a JSON-ready dict (checkpoints, a framework's config); :meth:`from_dict` reads it."""
        return {f.name: getattr(self, f.name) for f in _FIELDS}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Controls:
        """Controls from :meth:`to_dict` (missing keys neutral); unknown keys raise ``ValueError`` naming them."""
        known = {f.name for f in _FIELDS}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"controls: unknown {unknown}; known: {sorted(known)}.")
        return cls(**dict(values))


_FIELDS = fields(Controls)
