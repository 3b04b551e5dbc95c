"""The TRL adapter's actuators (``docs/design.md``, "Actuator contract"): how a decision acts on transformers'
``Trainer`` under DDP (:class:`TrainerActuator`) and under DeepSpeed ZeRO-1/2/3 (:class:`ZeroActuator`).

Both only supply the mechanism; :func:`rlguard.guards.actuator.apply_decision` decides what runs. The objective's
controls need ``GuardedGRPOTrainer.rlguard_set_controls``; on a stock ``GRPOTrainer`` the actuators do not declare
``clip``, ``beta`` and ``entropy_coef``, so such schedules are refused and such actions recorded only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from rlguard.adapters.trl.compat import EngineStepApplying
from rlguard.guards.actuator import TorchActuator
from rlguard.guards.decision import Controls

__all__ = ["TrainerActuator", "ZeroActuator", "trainer_capabilities"]

#: the DeepSpeed engine's step counters, kept across a rollback (the schedule follows the trainer's global_step)
_ENGINE_COUNTERS = ("global_steps", "global_samples", "skipped_steps", "micro_steps")
_ENGINE_SNAPSHOT_TAG = "rlguard_snapshot"
_BASE = frozenset({"snapshot", "restore", "drop_update", "lr_scale", "stop"})
_OBJECTIVE = frozenset({"clip", "beta", "entropy_coef"})


def trainer_capabilities(trainer: Any) -> frozenset[str]:
    """What the guard can do to ``trainer``: everything, the objective's controls only on ``GuardedGRPOTrainer``."""
    return _BASE | (_OBJECTIVE if callable(getattr(trainer, "rlguard_set_controls", None)) else frozenset())


@dataclass
class TrainerActuator(TorchActuator):
    """transformers' ``Trainer`` without DeepSpeed: the decision is applied in ``on_pre_optimizer_step`` and the
    trainer runs ``optimizer.step()`` right after (``owns_step=False``): a dropped update is gradients set to None
    (weights and Adam's state untouched, the scheduler still steps); the LR scale is undone in
    ``on_optimizer_step`` (:meth:`~rlguard.guards.actuator.TorchActuator.finish_step`), which also measures the
    update's size with ``measure_update``."""

    trainer: Any = None
    stop_requested: bool = field(init=False, default=False)

    @property
    def capabilities(self) -> frozenset[str]:  # type: ignore[override]
        return trainer_capabilities(self.trainer) | ({"update_ratio"} if self.measure_update else set())

    def set_controls(self, controls: Controls) -> None:
        if "clip" in self.capabilities:
            self.trainer.rlguard_set_controls(controls)

    def stop(self) -> None:
        self.stop_requested = True


class ZeroActuator:
    """A DeepSpeed engine at the accumulation boundary, after ``engine.backward`` and before ``engine.step``
    (:class:`~rlguard.adapters.trl.compat.GuardedEngineWrapper` calls the guard there).

    ``snapshot``/``restore``: ``engine.save_checkpoint``/``load_checkpoint`` of one tag in ``folder`` (collective;
    not CPU memory: the state is partitioned), keeping the engine's step counters; ``drop_update`` and
    ``set_lr_scale`` take effect inside :meth:`apply_update`'s ``engine.step()``
    (:class:`~rlguard.adapters.trl.compat.EngineStepApplying`).
    """

    def __init__(self, engine: Any, folder: Path, trainer: Any) -> None:
        self.engine = engine
        self.folder = folder
        self.trainer = trainer
        self.capabilities = trainer_capabilities(trainer)
        self.snapshot_step: int | None = None
        self.stop_requested = False
        self.grad_norm: Tensor | None = None
        self._drop = False
        self._lr_scale = 1.0

    def snapshot(self, step: int) -> None:
        self.engine.save_checkpoint(str(self.folder), tag=_ENGINE_SNAPSHOT_TAG, save_latest=False)
        self.snapshot_step = step

    def has_snapshot(self) -> bool:
        return self.snapshot_step is not None

    def set_lr_scale(self, scale: float) -> None:
        self._lr_scale = scale

    def drop_update(self) -> None:
        self._drop = True

    def apply_update(self) -> None:
        assert self.grad_norm is not None, "set grad_norm before apply_decision"
        step = EngineStepApplying(
            self.engine.optimizer, drop=self._drop, lr_scale=self._lr_scale, grad_norm=self.grad_norm
        )
        with step:
            self.engine.step()
        self._drop, self._lr_scale = False, 1.0

    def restore(self) -> bool:
        # no local existence check: every rank must take the same (collective) path
        engine = self.engine
        counters = {name: getattr(engine, name) for name in _ENGINE_COUNTERS if hasattr(engine, name)}
        path, _ = engine.load_checkpoint(
            str(self.folder), tag=_ENGINE_SNAPSHOT_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        for name, value in counters.items():
            setattr(engine, name, value)
        return path is not None

    def set_controls(self, controls: Controls) -> None:
        if "clip" in self.capabilities:
            self.trainer.rlguard_set_controls(controls)

    def stop(self) -> None:
        self.stop_requested = True
