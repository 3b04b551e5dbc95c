"""verl's one-step-off trainer with the guard on its driver:
``python -m rlguard.adapters.verl.async_one_step_off <verl overrides>``.

It takes verl's own config (``verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml``) and
command line and starts verl's ``run_ppo`` with a task runner beside verl's ``OneStepTaskRunner`` (verl's documented
``task_runner_class`` argument) whose ``run`` is verl's, building
:func:`~rlguard.adapters.verl.async_trainers.guarded_async_trainer_class` of ``OneStepOffRayTrainer`` and verl's
worker mapping with :class:`~rlguard.adapters.verl.async_worker.GuardedDetachActorWorker` (both names rebound in
``run``'s globals: :func:`~rlguard.adapters.verl.compat.rebind_run_global`). The rlguard keys are those of
:mod:`rlguard.adapters.verl.main_ppo`::

    python -m rlguard.adapters.verl.async_one_step_off ... \\
        actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo \\
        actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig \\
        +trainer.rlguard_guard=default

verl's yaml names its defaults' folder as ``file://verl/trainer/config``, which resolves only inside a verl source
checkout; the installed package's ``pkg://verl.trainer.config`` is added to the command line unless it sets
``hydra.searchpath`` itself.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import hydra
import ray
import verl.experimental.one_step_off_policy.main_ppo as verl_one_step
from omegaconf import DictConfig

from rlguard.adapters.verl.compat import rebind_run_global, task_runner_class

__all__ = ["GuardedOneStepTaskRunner", "guarded_one_step_off_trainer", "main"]

CONFIG_DIR = os.path.join(os.path.dirname(verl_one_step.__file__), "config")
SEARCHPATH = "hydra.searchpath=[pkg://verl.trainer.config]"
_MOVED = (
    "verl's OneStepTaskRunner.run no longer builds {} by its global name (verl 0.9.1 does); the guarded "
    "one-step-off trainer cannot be used with this verl. Install 'rlguard[verl]'."
)
_CLASSES: dict[str, type] = {}


def guarded_one_step_off_trainer() -> type:
    """The guarded ``OneStepOffRayTrainer`` (built once per process)."""
    if "trainer" not in _CLASSES:
        from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer

        from rlguard.adapters.verl.async_trainers import guarded_async_trainer_class

        _CLASSES["trainer"] = guarded_async_trainer_class(OneStepOffRayTrainer)
    return _CLASSES["trainer"]


class _GuardedOneStepTaskRunner(task_runner_class(verl_one_step.OneStepTaskRunner)):  # type: ignore[misc]
    """verl's ``OneStepTaskRunner`` training the guarded trainer with rlguard's actor worker."""

    def run(self, config: DictConfig) -> Any:
        from rlguard.adapters.verl.async_worker import guarded_role_worker_mapping

        trainer = guarded_one_step_off_trainer()
        rebind_run_global(super().run, "OneStepOffRayTrainer", trainer, _MOVED.format("its trainer"))
        rebind_run_global(
            super().run, "create_role_worker_mapping", guarded_role_worker_mapping, _MOVED.format("its worker mapping")
        )
        return super().run(config)


# verl's runner asks for 10 logical CPUs so that it is not scheduled on the head node's few
GuardedOneStepTaskRunner = ray.remote(num_cpus=10, max_concurrency=100)(  # type: ignore[call-overload]  # Ray stubs
    _GuardedOneStepTaskRunner
)


@hydra.main(config_path=CONFIG_DIR, config_name="one_step_off_ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """verl's one-step-off ``main`` (device, the rollout's node counts, ``run_ppo``) with the guarded task runner."""
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
    config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    run_ppo(config, task_runner_class=GuardedOneStepTaskRunner)


if __name__ == "__main__":
    if not any(arg.startswith(("hydra.searchpath=", "+hydra.searchpath=")) for arg in sys.argv[1:]):
        sys.argv.append(SEARCHPATH)
    main()
