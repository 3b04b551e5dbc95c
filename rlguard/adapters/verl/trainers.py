"""verl trainer classes with the guard on the driver: :func:`guarded_trainer_class` (see
:mod:`rlguard.adapters.verl.driver` for what the driver does) and verl's V1 trainer registry."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

from rlguard.adapters.verl.compat import guarded_tracking
from rlguard.adapters.verl.driver import GuardHalt, VerlGuardDriver
from rlguard.guards import Guard, GuardConfig

__all__ = ["guarded_tracking_for", "guarded_trainer_class", "register_v1_trainer"]


class _GuardedLogger:
    """verl's ``Tracking`` instance seen through the guard: ``log`` feeds the driver first (V1 trainers)."""

    def __init__(self, inner: Any, driver: VerlGuardDriver) -> None:
        self._inner = inner
        self._driver = driver

    def log(self, data: dict[str, Any], step: int, backend: Any = None) -> None:
        _log_guarded(self._driver, self._inner.log, data, step, backend)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _log_guarded(driver: VerlGuardDriver, log: Any, data: dict[str, Any], step: int, backend: Any) -> None:
    logged = driver.on_log(data, step)
    log(data={**data, **logged}, step=step, backend=backend)
    if driver.halted is not None:
        raise GuardHalt(driver.halted)


def guarded_tracking_for(driver: VerlGuardDriver) -> Any:
    """:func:`~rlguard.adapters.verl.compat.guarded_tracking` feeding ``driver``: within it, verl's ``Tracking``
    logs the guard's metrics too and raises :class:`GuardHalt` after logging a halted step."""
    return guarded_tracking(partial(_log_guarded, driver))


def guarded_trainer_class(base: type) -> type:
    """``base`` with the guard on the driver: verl's legacy ``RayPPOTrainer`` (``trainer.use_v1=false``) or a V1
    trainer (``PPOTrainerSync``, verl 0.9.1's default), or a subclass of either.

    The class takes ``guard=`` (as :class:`VerlGuardDriver`; default ``trainer.rlguard_guard`` of the config, else
    ``"default"``), watches ``fit`` and saves/restores the guard with verl's checkpoints. ``RayPPOTrainer.fit``
    makes its logger from ``verl.utils.tracking.Tracking`` (replaced while ``fit`` runs); a V1 ``fit`` stores it as
    ``self.logger`` before calling ``on_train_begin``, where it is wrapped.
    """

    class Guarded(base):  # type: ignore[valid-type, misc]  # verl's class, untyped
        def __init__(self, *args: Any, guard: str | GuardConfig | Guard | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if guard is None:
                guard = self.config.trainer.get("rlguard_guard", None) or "default"
            self.rlguard = VerlGuardDriver(self, guard)

        def fit(self, *args: Any, **kwargs: Any) -> None:
            """verl's ``fit``, with the guard watching each step; returns early when the guard halts."""
            with guarded_tracking_for(self.rlguard):
                try:
                    super().fit(*args, **kwargs)
                except GuardHalt as halt:
                    print(f"{halt}\n{self.rlguard.guard.report()}")
                    self._shutdown_dump_executor()

        def on_train_begin(self) -> None:
            parent = getattr(super(), "on_train_begin", None)
            if parent is not None:
                parent()
            logger = getattr(self, "logger", None)
            if logger is not None and not isinstance(logger, _GuardedLogger):
                self.logger = _GuardedLogger(logger, self.rlguard)

        def _save_checkpoint(self) -> None:
            super()._save_checkpoint()
            self.rlguard.save(self.rlguard.step_folder(self.global_steps))

        def _load_checkpoint(self) -> Any:
            result = super()._load_checkpoint()
            if self.global_steps > 0:
                trainer = self.config.trainer
                path = trainer.get("resume_from_path") if trainer.resume_mode == "resume_path" else None
                self.rlguard.load(Path(os.path.abspath(path)) if path else self.rlguard.step_folder(self.global_steps))
            return result

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


_TRAINERS: dict[str, type] = {}


def register_v1_trainer(name: str = "rlguard") -> type:
    """Register :data:`GuardedPPOTrainerSync` in verl's V1 trainer registry as ``trainer.v1.trainer_mode=<name>``.

    Call it in the process that runs verl's ``TaskRunnerV1`` (a Ray actor: e.g. in a ``TaskRunnerV1`` subclass's
    ``run`` before ``super().run(config)``); returns the class.
    """
    from verl.trainer.ppo.v1 import register_trainer

    cls: type = __getattr__("GuardedPPOTrainerSync")
    register_trainer(name)(cls)
    return cls


def __getattr__(name: str) -> Any:
    """``GuardedRayPPOTrainer`` and ``GuardedPPOTrainerSync``, built on first use: importing verl's trainers is
    slow and needs Ray (and, for V1, TransferQueue)."""
    if name not in ("GuardedRayPPOTrainer", "GuardedPPOTrainerSync"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _TRAINERS:
        if name == "GuardedRayPPOTrainer":
            from verl.trainer.ppo.ray_trainer import RayPPOTrainer

            _TRAINERS[name] = guarded_trainer_class(RayPPOTrainer)
        else:
            from verl.trainer.ppo.v1 import PPOTrainerSync

            _TRAINERS[name] = guarded_trainer_class(PPOTrainerSync)
    return _TRAINERS[name]
