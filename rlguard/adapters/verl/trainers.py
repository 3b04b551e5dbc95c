"""verl trainer classes with the guard on the driver: :func:`guarded_trainer_class` (see
:mod:`rlguard.adapters.verl.driver` for what the driver does) and verl's V1 trainer registry."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

from rlguard.adapters.verl.compat import guarded_tracking, use_lr_worker, v1_maps_stock_workers
from rlguard.adapters.verl.driver import GuardHalt, VerlGuardDriver, v1_mode
from rlguard.adapters.verl.settings import resolve_guard_setting
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

    The guard's LR scale reaches the actor where its worker class is rlguard's
    (:class:`~rlguard.adapters.verl.worker.GuardedActorRolloutRefWorker`): a V1 trainer that builds its worker
    mapping with verl's own method gets it from the guarded class; the legacy trainer from the mapping it is given
    (:mod:`rlguard.adapters.verl.main_ppo`'s task runner maps it). Elsewhere ``lr_scale`` is recorded only.
    """

    is_v1 = hasattr(base, "_build_replay_buffer")  # verl's V1 trainers; the legacy RayPPOTrainer has none

    class Guarded(base):  # type: ignore[valid-type, misc]  # verl's class, untyped
        rlguard_guarded = True
        #: a V1 trainer whose actor worker this class makes rlguard's (read by the driver before ``init``)
        rlguard_lr_worker = is_v1 and v1_maps_stock_workers(base)
        #: the driver built in ``__init__`` (a subclass adds what its pipeline needs)
        rlguard_driver_class: type[VerlGuardDriver] = VerlGuardDriver

        def __init__(self, *args: Any, guard: str | GuardConfig | Guard | None = None, **kwargs: Any) -> None:
            if is_v1:
                _keep_v1_mode(type(self), kwargs.get("config", args[0] if args else None))
            super().__init__(*args, **kwargs)
            if guard is None:
                guard = resolve_guard_setting(self.config.trainer.get("rlguard_guard", None) or "default")
            self.rlguard = type(self).rlguard_driver_class(self, guard)

        def fit(self, *args: Any, **kwargs: Any) -> None:
            """verl's ``fit``, with the guard watching each step; returns early when the guard halts."""
            with guarded_tracking_for(self.rlguard):
                try:
                    super().fit(*args, **kwargs)
                except GuardHalt as halt:
                    print(f"{halt}\n{self.rlguard.guard.report()}")
                    self._shutdown_dump_executor()

        if is_v1:

            def _init_resource_pool_mgr(self) -> None:
                super()._init_resource_pool_mgr()
                if type(self).rlguard_lr_worker and not use_lr_worker(self.role_worker_mapping, _lr_worker()):
                    raise RuntimeError(
                        f"{type(self).__name__}: verl's V1 worker mapping has no stock ActorRolloutRefWorker for "
                        f"the actor ({self.role_worker_mapping}); rlguard's LR scale cannot reach the workers."
                    )

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


def _lr_worker() -> type:
    """rlguard's actor worker class (importing verl's workers is slow: on use)."""
    from rlguard.adapters.verl.worker import GuardedActorRolloutRefWorker

    return GuardedActorRolloutRefWorker


def _keep_v1_mode(cls: type, config: Any) -> None:
    """Set ``config.trainer.v1.trainer_mode`` back to the mode of ``cls``'s verl base before verl reads it.

    verl selects the V1 trainer class by ``trainer.v1.trainer_mode`` and then *also* branches on it: anything but
    ``"sync"`` takes the asynchronous paths (async replay buffer, ``gen_batch_size`` 1, TransferQueue state in every
    checkpoint; ``trainer_base.py``). The guarded class is registered under its own name, so that name selects it;
    from here on verl sees its base's mode and behaves exactly as that trainer.
    """
    from omegaconf import open_dict

    mode = v1_mode(cls)
    if config is None or mode is None:
        return
    with open_dict(config):
        config.trainer.v1.trainer_mode = mode


_TRAINERS: dict[str, type] = {}


def register_v1_trainer(name: str = "rlguard", base_mode: str = "sync") -> type:
    """Register the guarded version of verl's V1 trainer ``base_mode`` (``"sync"``: ``PPOTrainerSync``) in verl's
    V1 trainer registry as ``trainer.v1.trainer_mode=<name>``; idempotent, returns the class.

    Call it in the process that runs verl's ``TaskRunnerV1`` (a Ray actor): :mod:`rlguard.adapters.verl.main_ppo`
    does. The trainer then runs in ``base_mode`` (verl branches on the mode name; see :func:`_keep_v1_mode`).
    """
    from verl.trainer.ppo.v1 import get_trainer_cls, register_trainer
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    if name == base_mode:
        raise ValueError(
            f"register_v1_trainer(name={name!r}) would replace verl's own {base_mode!r} trainer; choose another name "
            "(the guarded trainer still runs in that mode)."
        )
    existing = TRAINER_REGISTRY.get(name)
    if existing is not None and getattr(existing, "rlguard_guarded", False) and v1_mode(existing) == base_mode:
        return existing
    key = f"Guarded:{base_mode}"
    if key not in _TRAINERS:
        base = get_trainer_cls(base_mode)
        _TRAINERS[key] = __getattr__("GuardedPPOTrainerSync") if base_mode == "sync" else guarded_trainer_class(base)
    cls = _TRAINERS[key]
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
