"""The guarded one-step-off runner: verl's ``OneStepTaskRunner.run`` builds its trainer and worker mapping by global
name (verl private names, behind ``compat.rebind_run_global``); the runner rebinds both in ``run``'s own globals."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest

pytest.importorskip("verl", reason="the verl adapter needs verl (pip install 'rlguard[verl]')")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # verl's imports: Ray's deprecated state API, engines that are not installed
    import verl.experimental.one_step_off_policy.main_ppo as verl_one_step

    from rlguard.adapters.verl import async_one_step_off
    from rlguard.adapters.verl.compat import rebind_run_global, task_runner_class


def _run() -> Any:
    runner: Any = task_runner_class(verl_one_step.OneStepTaskRunner)
    return inspect.unwrap(runner.run)


def test_verls_runner_builds_the_trainer_and_worker_mapping_by_the_names_rebound() -> None:
    names = _run().__code__.co_names
    assert {"OneStepOffRayTrainer", "create_role_worker_mapping"} <= set(names)


def test_rebinding_changes_the_globals_run_reads_and_refuses_a_name_run_does_not_read() -> None:
    def run(self: Any, config: Any) -> Any:
        return OneStepOffRayTrainer  # type: ignore[name-defined]  # noqa: F821  # bound below, as verl's global

    scope = run.__globals__
    scope["OneStepOffRayTrainer"] = object
    try:
        rebind_run_global(run, "OneStepOffRayTrainer", int, "moved")
        assert run(None, None) is int
        with pytest.raises(RuntimeError, match=r"^moved$"):
            rebind_run_global(run, "create_role_worker_mapping", len, "moved")
    finally:
        del scope["OneStepOffRayTrainer"]


def test_the_guarded_trainer_is_verls_with_the_guarded_coroutines() -> None:
    from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer

    cls: Any = async_one_step_off.guarded_one_step_off_trainer()
    assert cls is async_one_step_off.guarded_one_step_off_trainer() and issubclass(cls, OneStepOffRayTrainer)
    assert cls.__name__ == "GuardedOneStepOffRayTrainer" and getattr(cls, "rlguard_guarded", False)
    assert inspect.iscoroutinefunction(cls.fit) and inspect.iscoroutinefunction(cls.fit_step)
    runner = task_runner_class(async_one_step_off.GuardedOneStepTaskRunner)
    assert issubclass(runner, task_runner_class(verl_one_step.OneStepTaskRunner))


def test_verls_one_step_off_trainer_has_the_private_step_methods_the_guarded_one_builds_on() -> None:
    from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer

    from rlguard.adapters.verl.compat import check_one_step_off_trainer

    check_one_step_off_trainer(OneStepOffRayTrainer)  # verl 0.9.1's: nothing missing

    class Moved:
        async def fit(self) -> None:
            return None

        async def fit_step(self, batch_data_future: Any) -> None:  # lost its iterator
            return None

    with pytest.raises(RuntimeError, match=r"fit_step\(batch_data_future, continuous_iterator\), _async_gen_next"):
        check_one_step_off_trainer(Moved)
