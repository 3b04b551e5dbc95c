"""verl's actor worker of its asynchronous trainers with the guard's LR call.

verl's one-step-off and fully async trainers map the actor to ``verl.experimental.separation.engine_workers.
DetachActorWorker`` (``separation/utils.py``: ``create_role_worker_mapping``), a subclass of the stock
``ActorRolloutRefWorker``. :class:`GuardedDetachActorWorker` adds the same driver call as
:class:`~rlguard.adapters.verl.worker.GuardedActorRolloutRefWorker` (the same registered method, one copy), so that
``actor_wg.rlguard_set_lr_scale(scale)`` scales the actor's scheduled LR (:func:`~rlguard.adapters.verl.worker.
set_scheduled_lr_scale`). :func:`guarded_role_worker_mapping` is verl's mapping with it in the actor's place.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.experimental.separation.utils import create_role_worker_mapping

from rlguard.adapters.verl.compat import ray_actor_class
from rlguard.adapters.verl.worker import GuardedActorRolloutRefWorker

__all__ = ["GuardedDetachActorWorker", "guarded_role_worker_mapping"]


class GuardedDetachActorWorker(DetachActorWorker):  # type: ignore[misc]  # verl's class, untyped
    """verl's ``DetachActorWorker`` that also takes the guard's LR scale from the driver."""

    rlguard_set_lr_scale = GuardedActorRolloutRefWorker.rlguard_set_lr_scale


def guarded_role_worker_mapping(config: Any) -> tuple[dict[Any, Any], type]:
    """verl's ``create_role_worker_mapping(config)`` with :class:`GuardedDetachActorWorker` for the training role
    (``Role.Actor``, or ``Role.ActorRollout`` with trainer-side validation) where verl maps its stock
    ``DetachActorWorker``; the reference policy keeps verl's worker (it has no optimizer)."""
    mapping, group_class = create_role_worker_mapping(config)
    for role, worker in list(mapping.items()):
        if getattr(role, "name", None) in ("Actor", "ActorRollout") and ray_actor_class(worker) is DetachActorWorker:
            mapping[role] = ray.remote(GuardedDetachActorWorker)
    return mapping, group_class
