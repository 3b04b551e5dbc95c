"""verl's fully async trainer with the guard on its trainer:
``python -m rlguard.adapters.verl.fully_async_main <verl overrides>``.

It is verl's own ``fully_async_main`` (its yaml ``fully_async_ppo_trainer``, its command line, the steps of its
``main``) run with a task runner beside verl's ``FullyAsyncTaskRunner``, whose ``run`` is verl's and builds
:class:`GuardedFullyAsyncTrainer` (:func:`~rlguard.adapters.verl.fully_async.guarded_fully_async_trainer_class` of
verl's ``FullyAsyncTrainer``) and verl's worker mapping with
:class:`~rlguard.adapters.verl.async_worker.GuardedDetachActorWorker` (both names rebound in ``run``'s globals:
:func:`~rlguard.adapters.verl.compat.rebind_run_global`), and :class:`GuardedFullyAsyncRollouter` (verl's
``FullyAsyncRollouter`` taking the guard's staleness bound,
:func:`~rlguard.adapters.verl.fully_async_rollouter.guarded_fully_async_rollouter_class`), rebound the same way in
``_create_rollouter``. verl's ``main`` names its task runner directly, so
:func:`main` repeats its steps (as the guarded one-step-off entry point does); Hydra resolves verl's relative
``config_path`` only when verl's module is ``__main__``. A guard's halt ends ``run`` through verl's own
failure path (it cancels the rollouter and clears the message queue); the guarded runner then returns normally, so
the command exits 0. The rlguard keys are those of :mod:`rlguard.adapters.verl.main_ppo`::

    python -m rlguard.adapters.verl.fully_async_main ... \\
        actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo \\
        actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig \\
        +trainer.rlguard_guard=default
"""

from __future__ import annotations

import os
from typing import Any

import hydra
import ray
import verl.experimental.fully_async_policy.fully_async_main as verl_fully_async
from omegaconf import DictConfig
from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncRollouter
from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer

from rlguard.adapters.verl.compat import ray_actor_class, rebind_run_global, task_runner_class
from rlguard.adapters.verl.fully_async import guarded_fully_async_trainer_class, is_halt
from rlguard.adapters.verl.fully_async_rollouter import guarded_fully_async_rollouter_class
from rlguard.adapters.verl.settings import check_guard_setting

__all__ = ["GuardedFullyAsyncRollouter", "GuardedFullyAsyncTaskRunner", "GuardedFullyAsyncTrainer", "main"]

CONFIG_DIR = os.path.join(os.path.dirname(verl_fully_async.__file__), "config")
_MOVED = (
    "verl's FullyAsyncTaskRunner no longer builds {} by its global name (verl 0.9.1 does); the guarded fully async "
    "trainer cannot be used with this verl. Install 'rlguard[verl]'."
)


#: verl's ``FullyAsyncTrainer`` with the guard (:mod:`rlguard.adapters.verl.fully_async`), named as this module's
#: attribute so that Ray ships it by reference: a copy shipped by value would not be the class its methods'
#: zero-argument ``super()`` refers to in the actor's process
_GuardedFullyAsyncTrainer = guarded_fully_async_trainer_class(ray_actor_class(FullyAsyncTrainer))
_GuardedFullyAsyncTrainer.__module__ = __name__
_GuardedFullyAsyncTrainer.__qualname__ = _GuardedFullyAsyncTrainer.__name__ = "_GuardedFullyAsyncTrainer"

# verl's trainer asks for 10 logical CPUs (fully_async_trainer.py)
GuardedFullyAsyncTrainer: Any = ray.remote(num_cpus=10)(_GuardedFullyAsyncTrainer)

#: verl's ``FullyAsyncRollouter`` with the guard's staleness bound, named here for the same reason
_GuardedFullyAsyncRollouter = guarded_fully_async_rollouter_class(ray_actor_class(FullyAsyncRollouter))
_GuardedFullyAsyncRollouter.__module__ = __name__
_GuardedFullyAsyncRollouter.__qualname__ = _GuardedFullyAsyncRollouter.__name__ = "_GuardedFullyAsyncRollouter"

# verl's rollouter: 10 logical CPUs, 100 concurrent calls (fully_async_rollouter.py)
GuardedFullyAsyncRollouter: Any = ray.remote(num_cpus=10, max_concurrency=100)(  # type: ignore[call-overload]
    _GuardedFullyAsyncRollouter  # Ray's stubs omit max_concurrency, which its actors take
)


class _GuardedFullyAsyncTaskRunner(task_runner_class(verl_fully_async.FullyAsyncTaskRunner)):  # type: ignore[misc]
    """verl's ``FullyAsyncTaskRunner`` training :class:`GuardedFullyAsyncTrainer` with rlguard's actor worker and
    generating with :class:`GuardedFullyAsyncRollouter`."""

    def run(self, config: DictConfig) -> Any:
        from rlguard.adapters.verl.async_worker import guarded_role_worker_mapping

        rebind_run_global(
            super()._create_trainer, "FullyAsyncTrainer", GuardedFullyAsyncTrainer, _MOVED.format("its trainer")
        )
        rebind_run_global(
            super()._create_rollouter,
            "FullyAsyncRollouter",
            GuardedFullyAsyncRollouter,
            _MOVED.format("its rollouter"),
        )
        rebind_run_global(
            super()._initialize_components,
            "create_role_worker_mapping",
            guarded_role_worker_mapping,
            _MOVED.format("its worker mapping"),
        )
        try:
            return super().run(config)
        except Exception as err:
            if not is_halt(err):
                raise
            print("rlguard: the guard halted the trainer; verl cancelled the rollouter and cleared the queue")
            return None


GuardedFullyAsyncTaskRunner = ray.remote(num_cpus=1)(_GuardedFullyAsyncTaskRunner)  # type: ignore[call-overload]


@hydra.main(config_path=CONFIG_DIR, config_name="fully_async_ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """verl's fully async ``main`` (the rollout's node counts, the reward config's migration, ``run_ppo``) starting
    :data:`GuardedFullyAsyncTaskRunner`."""
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    if not hasattr(config, "async_training"):
        raise RuntimeError("must set async_training config")  # verl's own check, word for word
    check_guard_setting(config)  # before Ray starts: a bad threshold is refused in seconds, not after the model loads
    auto_set_device(config)
    config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
    config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    config = migrate_legacy_reward_impl(config)
    run_ppo(config, task_runner_class=GuardedFullyAsyncTaskRunner)


if __name__ == "__main__":
    # the classes Ray ships to its actors are then this module's, found by name there (not __main__'s copies)
    from rlguard.adapters.verl.fully_async_main import main as _main

    _main()
