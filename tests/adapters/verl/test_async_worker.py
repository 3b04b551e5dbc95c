"""rlguard's actor worker for verl's asynchronous trainers: verl's ``DetachActorWorker`` with the guard's LR call
(the same registered method as the synchronous trainers' worker), mapped where verl maps its own."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

pytest.importorskip("verl", reason="the verl adapter needs verl (pip install 'rlguard[verl]')")

from omegaconf import OmegaConf  # after the skip: verl brings omegaconf

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # verl's imports: Ray's deprecated state API, engines that are not installed
    from verl.experimental.separation.engine_workers import DetachActorWorker
    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch
    from verl.trainer.ppo.utils import Role

    from rlguard.adapters.verl.async_worker import GuardedDetachActorWorker, guarded_role_worker_mapping
    from rlguard.adapters.verl.compat import LR_SCALE_METHOD, ray_actor_class, worker_sets_lr
    from rlguard.adapters.verl.worker import GuardedActorRolloutRefWorker


def test_the_lr_call_is_the_synchronous_workers_registered_for_every_rank() -> None:
    method = getattr(GuardedDetachActorWorker, LR_SCALE_METHOD)
    assert method is getattr(GuardedActorRolloutRefWorker, LR_SCALE_METHOD)  # one copy
    assert getattr(method, MAGIC_ATTR)["dispatch_mode"] == Dispatch.ONE_TO_ALL  # type: ignore[attr-defined]
    assert issubclass(GuardedDetachActorWorker, DetachActorWorker)


@pytest.mark.parametrize(
    ("async_training", "role"),
    [({}, Role.Actor), ({"use_trainer_do_validate": True}, Role.ActorRollout)],
)
def test_verls_mapping_gets_rlguards_worker_for_the_training_role(async_training: dict[str, Any], role: Any) -> None:
    config = OmegaConf.create(
        {
            "async_training": async_training,
            "actor_rollout_ref": {"actor": {"use_kl_loss": True}},  # a reference policy: verl's worker stays
            "algorithm": {"use_kl_in_reward": False},
        }
    )
    mapping, _ = guarded_role_worker_mapping(config)
    assert ray_actor_class(mapping[role]) is GuardedDetachActorWorker and worker_sets_lr(mapping)
    assert ray_actor_class(mapping[Role.RefPolicy]) is DetachActorWorker
