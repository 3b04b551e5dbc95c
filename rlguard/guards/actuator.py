"""How a guard's :class:`~rlguard.guards.Decision` takes effect: the one executor and the ``Actuator`` protocol.

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
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import torch
from torch import nn

from rlguard.core_losses import Objective
from rlguard.guards.config import PRESETS, GuardConfig
from rlguard.guards.decision import Controls, Decision, Outcome
from rlguard.guards.guard import Guard
from rlguard.guards.snapshot import ModelSnapshot, SnapshotCost, check_snapshot_budget
from rlguard.guards.update_norm import UpdateMeter
from rlguard.plugins import plugin_manager

__all__ = [
    "CAPABILITIES",
    "EVENTS_FILE",
    "GUARD_STATE_FILE",
    "OUTCOME_CAPABILITY",
    "SEVERITY_CODE",
    "Actuator",
    "Applied",
    "Capability",
    "TorchActuator",
    "apply_decision",
    "bind_guard",
    "check_capabilities",
    "make_guard",
]

#: the guard's state in each checkpoint folder, and its events next to the run's logs
GUARD_STATE_FILE = "rlguard_guard.json"
EVENTS_FILE = "events.jsonl"
#: how an event's severity is logged as a number (``rlguard/event/*``); a decision's: ``decision.action_code``
SEVERITY_CODE: dict[str, float] = {"warn": 1.0, "critical": 2.0}

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


def apply_decision(decision: Decision, actuator: Actuator) -> Applied:
    """Carry out ``decision`` on ``actuator``: the one place where a decision takes effect (module docstring)."""
    can = actuator.capabilities
    skipped: list[str] = []

    def able(capability: str) -> bool:
        if capability not in can:
            skipped.append(capability)
            return False
        return True

    outcome, controls = decision.outcome, decision.controls
    if decision.snapshot and able("snapshot"):
        actuator.snapshot(decision.step)
    if outcome == "rollback" and not (able("restore") and actuator.has_snapshot()):
        outcome = "halt"  # nothing to go back to: stop rather than train on
    if controls.lr_scale != 1.0 and able("lr_scale"):
        actuator.set_lr_scale(controls.lr_scale)
    if outcome != "step" and able("drop_update"):
        actuator.drop_update()
    actuator.apply_update()
    if outcome == "rollback" and not actuator.restore():
        outcome = "halt"
    missing = sorted(controls.capabilities_needed() - can)
    skipped.extend(missing)
    actuator.set_controls(controls.without(missing))
    if outcome == "halt" and able("stop"):
        actuator.stop()
    applied = Applied(outcome, tuple(dict.fromkeys(skipped)))
    plugin_manager().hook.rlguard_on_decision(decision=decision, applied=applied)
    return applied


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


def bind_guard(guard: Guard, actuator: Actuator, *, where: str) -> None:
    """At start-up: refuse ``guard``'s schedules that ``actuator`` (named ``where`` in messages) cannot carry out
    (:func:`check_capabilities`) and tell the guard which outcomes and controls it cannot carry out, so that their
    events say ``record-only``; log what a rollback snapshot costs and refuse one over the guard's
    ``snapshot_budget`` (:func:`~rlguard.guards.snapshot.check_snapshot_budget`), for an actuator that reports its
    cost (``snapshot_cost()``; the plain-torch and TRL actuators do)."""
    missing = check_capabilities(guard.config, actuator.capabilities, where=where)
    unable: dict[str, str] = {o: c for o, c in OUTCOME_CAPABILITY.items() if c in missing}
    unable.update({name: c for name, c in Controls.capabilities().items() if c in missing})
    guard.set_record_only(unable, where=where)
    guard.capabilities = frozenset(actuator.capabilities)
    cost = getattr(actuator, "snapshot_cost", None)
    if not guard.config.observe_only and "snapshot" in actuator.capabilities and cost is not None:
        check_snapshot_budget(cost(), guard.config.snapshot_budget, where=where)


def make_guard(guard: str | GuardConfig | Guard) -> Guard:
    """A guard from a preset name (:data:`~rlguard.guards.PRESETS`), a ``GuardConfig`` or a ``Guard``."""
    if isinstance(guard, Guard):
        return guard
    if isinstance(guard, GuardConfig):
        return Guard(guard)
    if isinstance(guard, str):
        return Guard(GuardConfig.preset(guard))
    raise ValueError(
        f"guard must be a preset name ({', '.join(map(repr, PRESETS))}), a GuardConfig or a Guard; got {guard!r}."
    )


@dataclass
class TorchActuator:
    """The actuator of a plain PyTorch loop (and of transformers' ``Trainer`` under DDP, where the trainer runs
    ``optimizer.step()`` right after the decision: ``owns_step=False``).

    Args:
        model: the trained module (DDP-wrapped or not: its ``state_dict`` and ``parameters``).
        optimizer: its optimizer; param-group ``lr`` is scaled for one step and restored by :meth:`finish_step`.
        objective: the configured objective, whose controls :meth:`set_controls` changes (``current`` holds the
            one to use); None where the loop has no rlguard objective (then clip/beta/entropy are not capable).
        owns_step: :meth:`apply_update` runs ``optimizer.step()`` (plain loop) or leaves it to the trainer, which
            then calls :meth:`finish_step` after its step.
        snapshot_path: keep the snapshot in this safetensors file (one per rank) instead of host memory
            (:class:`~rlguard.guards.snapshot.ModelSnapshot`).
        replicas: the process group over which the weights are replicated (DDP): each rank keeps its share of the
            snapshot and measures its share of the update. ``"auto"``: the group of a ``DistributedDataParallel``
            ``model``, else none (this rank keeps all of its own).
        measure_update: record ``update_ratio`` = ||theta_after - theta_before|| / ||theta_before|| of each
            applied step, read with :meth:`take_update_ratio` (:class:`~rlguard.guards.update_norm.UpdateMeter`:
            a host copy of the trainable parameters, a bounded chunk on the device).
        rollout_correction: the loop passes the engine's log-probs as ``rollout_logprobs`` beside a pi_old the
            trainer recomputed, so a rollout correction (``rollout_is_cap``, ``rollout_mask_high``) can act. False
            where pi_old is the engine's own (then ``kept_gradient`` is the mismatch remedy).

    Attributes:
        current: the objective with the latest controls.
        stopped: :meth:`stop` was called.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    objective: Objective | None = None
    owns_step: bool = True
    snapshot_path: str | None = None
    replicas: Any = "auto"
    measure_update: bool = False
    rollout_correction: bool = False
    current: Objective | None = field(init=False, default=None)
    stopped: bool = field(init=False, default=False)
    snapshot_step: int | None = field(init=False, default=None)
    _snapshot: ModelSnapshot | None = field(init=False, default=None, repr=False)
    _meter: UpdateMeter | None = field(init=False, default=None, repr=False)
    _unscaled: list[float] | None = field(init=False, default=None, repr=False)
    _dropped: bool = field(init=False, default=False)
    _update_ratio: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.current = self.objective
        if self.replicas == "auto":
            ddp = isinstance(self.model, nn.parallel.DistributedDataParallel)
            self.replicas = self.model.process_group if ddp else None

    @property
    def capabilities(self) -> frozenset[str]:
        """Everything; the objective's controls only with an objective (``kept_gradient`` where it changes the
        objective, a rollout correction where the loop passes the engine's log-probs, the off-policy mask always: its
        behaviour log-probs are the engine's where passed, else pi_old's); ``update_ratio`` when measured."""
        can = {"snapshot", "restore", "drop_update", "lr_scale", "stop"}
        if self.objective is not None:
            can |= {"clip", "beta", "entropy_coef", "off_policy_mask"}
            if self.objective.applies_kept_gradient():
                can.add("kept_gradient")
            if self.rollout_correction:
                can |= {"rollout_correction", "rollout_mask"}
        if self.measure_update:
            can.add("update_ratio")
        return frozenset(can)

    @property
    def snapshots(self) -> ModelSnapshot:
        """The rollback snapshot (made on first use)."""
        if self._snapshot is None:
            self._snapshot = ModelSnapshot(self.model, self.optimizer, group=self.replicas, path=self.snapshot_path)
        return self._snapshot

    def snapshot_cost(self) -> SnapshotCost:
        """What this rank's snapshot costs (checked against the guard's budget by :func:`bind_guard`)."""
        return self.snapshots.cost()

    def snapshot(self, step: int) -> None:
        self.snapshots.take()
        self.snapshot_step = step

    def has_snapshot(self) -> bool:
        return self.snapshot_step is not None and self.snapshots.has()

    def set_lr_scale(self, scale: float) -> None:
        self._unscaled = [group["lr"] for group in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["lr"] = group["lr"] * scale

    def restore_lr(self) -> None:
        """Put back the LRs :meth:`set_lr_scale` scaled (after the optimizer step)."""
        if self._unscaled is not None:
            for group, lr in zip(self.optimizer.param_groups, self._unscaled, strict=True):
                group["lr"] = lr
            self._unscaled = None

    def drop_update(self) -> None:
        for p in self.model.parameters():
            p.grad = None  # optimizer.step() skips parameters without a gradient
        self._dropped = True

    def apply_update(self) -> None:
        if self.measure_update and not self._dropped:
            if self._meter is None:
                self._meter = UpdateMeter(self.model, self.optimizer, group=self.replicas)
            self._meter.capture()
        if self.owns_step:
            if not self._dropped:
                self.optimizer.step()
            self.finish_step()
        self._dropped = False

    def finish_step(self) -> None:
        """After the optimizer step: the LRs back to the scheduler's and, when measured, the update's size.
        :meth:`apply_update` calls it when it owns the step; otherwise the loop does, after its own step (on every
        rank: under DDP the ranks sum their shares of the update's norm)."""
        self.restore_lr()
        if self._meter is not None:
            ratio = self._meter.ratio()
            if ratio is not None:
                self._update_ratio = ratio

    @property
    def objective_in_use(self) -> Objective:
        """The objective with the latest controls (the configured one until the guard changes them)."""
        if self.current is None:
            raise ValueError("this TorchActuator was built without an objective (objective=None).")
        return self.current

    def take_update_ratio(self) -> float | None:
        """The relative size of the last applied update (None if none was measured since the last call)."""
        ratio, self._update_ratio = self._update_ratio, None
        return ratio

    def restore(self) -> bool:
        return self.snapshot_step is not None and self.snapshots.restore()

    def set_controls(self, controls: Controls) -> None:
        if self.objective is not None:
            updated = self.objective.with_controls(controls)
            if updated != self.current:  # keep the instance while the controls stay (callers may compare)
                self.current = updated

    def stop(self) -> None:
        self.stopped = True
