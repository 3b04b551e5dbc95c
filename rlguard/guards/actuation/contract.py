"""The actuator contract: what a training loop implements so that a guard's :class:`~rlguard.guards.Decision`
takes effect (:class:`Actuator`), what it may declare (:data:`CAPABILITIES`), and what each outcome needs.

A decision is an *outcome* (``step``, ``skip``, ``rollback``, ``halt``) plus *controls* (:class:`Controls`: the
LR multiplier, the clip range, ``beta``, the entropy coefficient). :func:`apply_decision` is the single place
where a decision becomes actions; every training loop supplies only an :class:`Actuator`: TRL under DDP and under
DeepSpeed ZeRO-2/3 (:mod:`rlguard.adapters.trl.actuators`), verl's driver (:mod:`rlguard.adapters.verl.driver`),
the benchmarks' plain-torch loop (:class:`TorchActuator`). See ``docs/design.md`` ("Actuator contract").

Per optimizer step, after the step's gradients are complete and before the optimizer applies them::

    snapshot (if due) -> set this step's LR scale -> drop the update (skip, rollback, halt)
    -> apply the update (the optimizer step, or nothing if dropped) -> restore (rollback; none: halt)
    -> set the objective's controls (from the next loss on) -> stop (halt)

An actuator declares :attr:`Actuator.capabilities`: what each outcome needs is :data:`OUTCOME_CAPABILITY`, what
each control needs is declared on :class:`~rlguard.guards.Controls`. :func:`check_capabilities` runs at start-up:
a schedule the actuator cannot carry out is refused with a ``ValueError``; an intervention whose effect it cannot
carry out is accepted and its proposals are recorded with ``record-only`` in the event's message
(:func:`bind_guard`), never silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from rlguard.guards.config import GuardConfig
from rlguard.guards.decision import Controls, Outcome

__all__ = ["CAPABILITIES", "OUTCOME_CAPABILITY", "Actuator", "Applied", "Capability", "check_capabilities"]

Capability = Literal[
    "snapshot",
    "restore",
    "drop_update",
    "lr_scale",
    "clip",
    "beta",
    "entropy_coef",
    "stop",
    "update_ratio",
    "kept_gradient",
    "rollout_correction",
    "rollout_mask",
    "off_policy_mask",
    "staleness_bound",
    "drop_stale",
]
#: every capability: what an actuator may declare
CAPABILITIES: frozenset[str] = frozenset(get_args(Capability))
#: what each outcome needs beyond applying the update (``rollback`` also wants a ``snapshot`` taken earlier)
OUTCOME_CAPABILITY: dict[Outcome, Capability] = {"skip": "drop_update", "rollback": "restore", "halt": "stop"}
#: what the interventions may ask for: their outcomes, the snapshots rollbacks need, and the controls they set
_INTERVENTIONS_NEED = frozenset({"snapshot", *OUTCOME_CAPABILITY.values(), "lr_scale", "clip"})


class Actuator(Protocol):
    """What a training loop implements so that a decision can act on it. Methods are called by
    :func:`apply_decision` only, in the order of the module docstring, identically on every rank.

    Attributes:
        capabilities: what this actuator can do (:data:`CAPABILITIES`); a method outside them is never called.
    """

    @property
    def capabilities(self) -> frozenset[str]:
        """What this actuator can do (:data:`CAPABILITIES`)."""

    def snapshot(self, step: int) -> None:
        """Save model and optimizer state before this step's update (the weights the healthy stats came from)."""

    def has_snapshot(self) -> bool:
        """Whether :meth:`restore` has something to restore."""

    def set_lr_scale(self, scale: float) -> None:
        """This step's LR is the scheduler's times ``scale``; the scale never compounds (restored after the step)."""

    def drop_update(self) -> None:
        """This step's update is dropped: weights and optimizer state stay as they are; the scheduler advances."""

    def apply_update(self) -> None:
        """Run the optimizer step now (with the LR scale; a no-op after :meth:`drop_update`), where the actuator
        owns it; where the training loop steps right after the decision, nothing."""

    def restore(self) -> bool:
        """Load the last snapshot back (after the dropped update); False when there is none."""

    def set_controls(self, controls: Controls) -> None:
        """The objective's clip range, ``beta`` and entropy coefficient from the next loss on."""

    def stop(self) -> None:
        """End training on every rank after this step."""


@dataclass(frozen=True)
class Applied:
    """What :func:`apply_decision` did.

    Attributes:
        outcome: the outcome carried out (``rollback`` without a snapshot becomes ``halt``).
        record_only: parts of the decision the actuator cannot carry out (recorded, not applied).
    """

    outcome: Outcome
    record_only: tuple[str, ...] = ()


def check_capabilities(config: GuardConfig, capabilities: Iterable[str], *, where: str) -> frozenset[str]:
    """Refuse at start-up a guard whose schedules ``where`` (an actuator's name) cannot carry out; return the
    capabilities its interventions need and it lacks (their actions are recorded only, see :func:`bind_guard`)."""
    can = frozenset(capabilities)
    unknown = sorted(can - CAPABILITIES)
    if unknown:
        raise ValueError(f"{where} declares unknown capabilities {unknown}; known: {sorted(CAPABILITIES)}.")
    needed = Controls.capabilities()
    refused = sorted(k for k in config.schedules if needed[k] not in can)
    if refused:
        raise ValueError(
            f"the guard's schedules {refused} cannot be carried out by {where} (it can: {sorted(can)}): remove "
            "them from GuardConfig.schedules or use a training loop whose adapter supports them (docs/design.md)."
        )
    if config.observe_only:
        return frozenset()
    return _INTERVENTIONS_NEED - can
