"""verl's ``main_ppo`` with the guard on the driver: ``python -m rlguard.adapters.verl.main_ppo <verl overrides>``.

It takes verl's own config (``verl/trainer/config/ppo_trainer.yaml``) and command line, validates it as verl's
``main_ppo`` does and starts verl's ``run_ppo`` with a task runner (verl's documented ``task_runner_class``
argument) that trains the guarded trainer:

- V1 (``trainer.use_v1=true``, verl's default): :func:`~rlguard.adapters.verl.trainers.register_v1_trainer`
  registers the guarded version of ``trainer.v1.trainer_mode`` (``sync``) in the task-runner process, which selects
  it; it then runs as verl's ``sync`` trainer (same code paths, same checkpoints);
- legacy (``trainer.use_v1=false``): verl's ``TaskRunner.run`` builds ``GuardedRayPPOTrainer``
  (:func:`~rlguard.adapters.verl.compat.bind_legacy_trainer`).

Either way the actor's worker is :class:`~rlguard.adapters.verl.worker.GuardedActorRolloutRefWorker` (verl's, with
a call that sets the LR scale), so the guard's ``lr_scale`` acts on the actor's optimizer.

Select the guarded loss in the workers as for any guarded run::

    python -m rlguard.adapters.verl.main_ppo ... \\
        actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo \\
        actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig \\
        +trainer.rlguard_guard=default trainer.save_freq=10

``+trainer.rlguard_guard`` is a preset (``monitor``, ``default``, ``strict``, ``stable``), a mapping of
``GuardConfig`` fields, or ``module:factory`` returning a ``GuardConfig`` (imported and called, as Hydra's
``_target_``: trusted configs only). Rollback needs verl checkpoints: the guard saves one when it asks for a snapshot.
"""

from __future__ import annotations

import os
from typing import Any

import hydra
import ray
import verl.trainer.main_ppo as verl_main_ppo
import verl.trainer.main_ppo_v0 as verl_main_ppo_v0
from omegaconf import DictConfig, open_dict

from rlguard.adapters.verl import trainers
from rlguard.adapters.verl.compat import bind_legacy_trainer, task_runner_class, use_lr_worker
from rlguard.adapters.verl.settings import check_guard_setting
from rlguard.adapters.verl.trainers import register_v1_trainer

__all__ = ["GUARDED_V1_MODE", "GuardedTaskRunner", "GuardedTaskRunnerV1", "main"]

#: the name the guarded V1 trainer is registered under (verl's ``trainer.v1.trainer_mode`` selects by name)
GUARDED_V1_MODE = "rlguard_{}"
CONFIG_DIR = os.path.join(os.path.dirname(verl_main_ppo.__file__), "config")


class _GuardedTaskRunnerV1(task_runner_class(verl_main_ppo.TaskRunnerV1)):  # type: ignore[misc]  # verl's class
    """verl's ``TaskRunnerV1`` training the guarded version of the configured V1 trainer."""

    def run(self, config: DictConfig) -> Any:
        mode = config.trainer.v1.trainer_mode
        name = GUARDED_V1_MODE.format(mode)
        register_v1_trainer(name, base_mode=mode)
        with open_dict(config):
            config.trainer.v1.trainer_mode = name  # selects the guarded class; it restores `mode` for verl
        return super().run(config)


class _GuardedTaskRunner(task_runner_class(verl_main_ppo_v0.TaskRunner)):  # type: ignore[misc]  # verl's class
    """verl's legacy ``TaskRunner`` training ``GuardedRayPPOTrainer``."""

    def run(self, config: DictConfig) -> Any:
        bind_legacy_trainer(super().run, trainers.__getattr__("GuardedRayPPOTrainer"))
        return super().run(config)

    def add_actor_rollout_worker(self, config: DictConfig) -> Any:
        """verl's actor worker mapping with rlguard's actor worker, which takes the guard's LR scale."""
        from rlguard.adapters.verl.worker import GuardedActorRolloutRefWorker

        actor_class, group_class = super().add_actor_rollout_worker(config)
        if use_lr_worker(self.role_worker_mapping, GuardedActorRolloutRefWorker):
            actor_class = GuardedActorRolloutRefWorker
        return actor_class, group_class


GuardedTaskRunnerV1 = ray.remote(_GuardedTaskRunnerV1)
GuardedTaskRunner = ray.remote(_GuardedTaskRunner)


@hydra.main(config_path=CONFIG_DIR, config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """verl's ``main_ppo.main`` (device, validation, ``run_ppo``) with the guarded task runners."""
    check_guard_setting(config)  # before Ray starts: a bad threshold is refused in seconds, not after the model loads
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    runner = GuardedTaskRunnerV1 if config.trainer.use_v1 else GuardedTaskRunner
    verl_main_ppo.run_ppo(config, task_runner_class=runner)


if __name__ == "__main__":
    main()
