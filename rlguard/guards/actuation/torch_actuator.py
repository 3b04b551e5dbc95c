"""The actuator of a plain PyTorch loop: :class:`TorchActuator`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rlguard.core_losses import Objective
from rlguard.guards.actuation.budget import SnapshotCost
from rlguard.guards.actuation.snapshot import ModelSnapshot
from rlguard.guards.actuation.update_meter import UpdateMeter
from rlguard.guards.decision import Controls

__all__ = ["TorchActuator"]


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
            (:class:`~rlguard.guards.actuation.snapshot.ModelSnapshot`).
        replicas: the process group over which the weights are replicated (DDP): each rank keeps its share of the
            snapshot and measures its share of the update. ``"auto"``: the group of a ``DistributedDataParallel``
            ``model``, else none (this rank keeps all of its own).
        measure_update: record ``update_ratio`` = ||theta_after - theta_before|| / ||theta_before|| of each
            applied step, read with :meth:`take_update_ratio`
            (:class:`~rlguard.guards.actuation.update_meter.UpdateMeter`: a host copy of the trainable parameters, a
            bounded chunk on the device).
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
