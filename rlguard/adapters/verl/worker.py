"""verl's actor worker with one more driver call: the guard's LR scale (``lr_scale``) on the actor's optimizer.

verl 0.9.1 gives the driver no call that sets the actor's learning rate. Its workers are extended the way verl
extends them itself: a subclass of ``verl.workers.engine_workers.ActorRolloutRefWorker`` with a method registered
``@register(dispatch_mode=Dispatch.ONE_TO_ALL)`` (as verl's own ``set_loss_fn``), which the driver's worker group
then offers as ``actor_rollout_wg.rlguard_set_lr_scale(scale)``. The guarded trainers put this class in verl's
worker mapping where verl would use the stock one (:func:`rlguard.adapters.verl.compat.use_lr_worker`).

The FSDP engine keeps ``optimizer`` and ``lr_scheduler`` (a ``LambdaLR``: ``lr = base_lr * lr_lambda(step)``,
recomputed from ``base_lrs`` at every ``lr_scheduler.step()``). A scale written into ``param_groups[i]["lr"]``
would be lost at the next scheduler step, so it goes into what the scheduler multiplies:
``base_lrs[i] = initial_lr[i] * scale`` (``initial_lr`` is the configured LR, which the scheduler never changes),
and the LR in force is recomputed at once. The scale is absolute, never compounded: 1 restores the schedule.
A checkpoint load restores the scheduler's ``base_lrs`` as saved; the driver sends the scale in force again after
every load (rollback, resume).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

__all__ = ["GuardedActorRolloutRefWorker", "set_scheduled_lr_scale"]


def set_scheduled_lr_scale(optimizer: Optimizer, scheduler: Any, scale: float) -> None:
    """Make ``optimizer``'s LR ``scheduler``'s times ``scale``, now and after every later ``scheduler.step()``.

    ``scheduler`` must be a ``LambdaLR`` on ``optimizer`` (verl's constant and cosine schedules are); ``scale`` is
    the whole multiplier (1 restores the schedule), not a factor on the previous one.
    """
    if isinstance(scale, bool) or not isinstance(scale, Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0 (1 restores the scheduler's LR); got {scale!r}.")
    if not isinstance(scheduler, LambdaLR):
        raise TypeError(
            f"the LR scale needs a torch LambdaLR scheduler (verl's FSDP engine builds one); got {type(scheduler)!r}."
        )
    if scheduler.optimizer is not optimizer:
        raise ValueError("scheduler schedules another optimizer than optimizer; pass the engine's own pair.")
    groups = optimizer.param_groups
    scheduler.base_lrs = [group["initial_lr"] * float(scale) for group in groups]
    for group, base_lr, lr_lambda in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base_lr * lr_lambda(scheduler.last_epoch)


class GuardedActorRolloutRefWorker(ActorRolloutRefWorker):  # type: ignore[misc]  # verl's class, untyped
    """verl's ``ActorRolloutRefWorker`` that also takes the guard's LR scale from the driver."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, attr-defined]  # verl: untyped
    def rlguard_set_lr_scale(self, scale: float) -> None:
        """The actor's LR is its scheduler's times ``scale`` from the next optimizer step on
        (:func:`set_scheduled_lr_scale`)."""
        engine = getattr(getattr(self, "actor", None), "engine", None)
        optimizer, scheduler = getattr(engine, "optimizer", None), getattr(engine, "lr_scheduler", None)
        if optimizer is None or scheduler is None:
            raise RuntimeError(
                "rlguard_set_lr_scale needs an actor whose engine has an optimizer and an LR scheduler (verl's "
                f"FSDP engine, actor_rollout_ref.actor.strategy=fsdp or fsdp2); this worker's role is "
                f"{getattr(self, 'role', '?')!r} and its engine {type(engine).__name__}."
            )
        set_scheduled_lr_scale(optimizer, scheduler, scale)
