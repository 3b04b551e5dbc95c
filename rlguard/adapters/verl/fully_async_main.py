"""verl's fully async trainer with the guard on its trainer:
``python -m rlguard.adapters.verl.fully_async_main <verl overrides>``.

It is verl's own ``fully_async_main`` (its yaml ``fully_async_ppo_trainer``, its command line, its ``main``) run with a
task runner beside verl's ``FullyAsyncTaskRunner``, whose ``run`` is verl's and builds
:class:`GuardedFullyAsyncTrainer` (:func:`~rlguard.adapters.verl.fully_async.guarded_fully_async_trainer_class` of
verl's ``FullyAsyncTrainer``) and verl's worker mapping with
:class:`~rlguard.adapters.verl.async_worker.GuardedDetachActorWorker` (both names rebound in ``run``'s globals:
:func:`~rlguard.adapters.verl.compat.rebind_run_global`). verl's ``main`` starts the task runner it names
``FullyAsyncTaskRunner``; that name is rebound in this process. A guard's halt ends ``run`` through verl's own
failure path (it cancels the rollouter and clears the message queue); the guarded runner then returns normally, so
the command exits 0. The rlguard keys are those of :mod:`rlguard.adapters.verl.main_ppo`::

    python -m rlguard.adapters.verl.fully_async_main ... \\
        actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo \\
        actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig \\
        +trainer.rlguard_guard=default
"""

from __future__ import annotations

from typing import Any

import ray
import verl.experimental.fully_async_policy.fully_async_main as verl_fully_async
from omegaconf import DictConfig
from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer

from rlguard.adapters.verl.compat import ray_actor_class, rebind_run_global, task_runner_class
from rlguard.adapters.verl.fully_async import guarded_fully_async_trainer_class, is_halt

__all__ = ["GuardedFullyAsyncTaskRunner", "GuardedFullyAsyncTrainer", "main"]

_MOVED = (
    "verl's FullyAsyncTaskRunner no longer builds {} by its global name (verl 0.9.1 does); the guarded fully async "
    "trainer cannot be used with this verl. Install 'rlguard[verl]'."
)


class _GuardedFullyAsyncTrainer(guarded_fully_async_trainer_class(ray_actor_class(FullyAsyncTrainer))):  # type: ignore[misc]
    """verl's ``FullyAsyncTrainer`` with the guard (:mod:`rlguard.adapters.verl.fully_async`)."""


# verl's trainer asks for 10 logical CPUs (fully_async_trainer.py)
GuardedFullyAsyncTrainer = ray.remote(num_cpus=10)(_GuardedFullyAsyncTrainer)  # type: ignore[call-overload]


class _GuardedFullyAsyncTaskRunner(task_runner_class(verl_fully_async.FullyAsyncTaskRunner)):  # type: ignore[misc]
    """verl's ``FullyAsyncTaskRunner`` training :class:`GuardedFullyAsyncTrainer` with rlguard's actor worker."""

    def run(self, config: DictConfig) -> Any:
        from rlguard.adapters.verl.async_worker import guarded_role_worker_mapping

        rebind_run_global(
            super()._create_trainer, "FullyAsyncTrainer", GuardedFullyAsyncTrainer, _MOVED.format("its trainer")
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


def main() -> None:
    """verl's fully async ``main`` (its yaml and command line) starting :data:`GuardedFullyAsyncTaskRunner`."""
    rebind_run_global(
        verl_fully_async.main,
        "FullyAsyncTaskRunner",
        GuardedFullyAsyncTaskRunner,
        _MOVED.format("its task runner").replace("FullyAsyncTaskRunner no longer", "fully_async_main.main no longer"),
    )
    verl_fully_async.main()


if __name__ == "__main__":
    # the classes Ray ships to its actors are then this module's, found by name there (not __main__'s copies)
    from rlguard.adapters.verl.fully_async_main import main as _main

    _main()
