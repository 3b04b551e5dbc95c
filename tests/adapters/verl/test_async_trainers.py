"""The guard in verl's one-step-off trainer, on a stand-in with verl's pipeline (tests/helpers/verl_async_stand_in.py):
the driver is the synchronous trainers' (one copy); what differs is the coroutine ``fit`` and the batch generated
while a step trains, dropped after a rollback. End to end with Ray on CPU: integration_tests/test_verl_async.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")

from rlguard.adapters.verl.async_trainers import DROPPED_KEY, guarded_async_trainer_class
from rlguard.guards import GuardConfig
from tests.helpers.verl_async_stand_in import FakeOneStepOffTrainer
from tests.helpers.verl_stand_in import poisoned_run, trainer_config

Trainer = guarded_async_trainer_class(FakeOneStepOffTrainer)


def test_stock_pipeline_trains_each_step_on_samples_one_update_old(tmp_path: Path) -> None:
    trainer = FakeOneStepOffTrainer(trainer_config(tmp_path, save_freq=1), poisoned_run(4, 0))
    asyncio.run(trainer.fit())
    assert trainer.trained_on == {1: 0, 2: 0, 3: 1, 4: 2}  # what the guarded pipeline must keep, and change


def test_after_a_rollback_the_next_step_trains_on_samples_of_the_restored_weights(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    trainer = Trainer(trainer_config(tmp_path, save_freq=1), poisoned_run(5, 4) + poisoned_run(3, 0))
    asyncio.run(trainer.fit())
    by_step = dict(logged)
    assert by_step[9]["rlguard/guard/rollback_to"] == 5.0  # three skips in a row, then back to step 5
    # the batch in flight at step 9 came from step 8's discarded weights: dropped, and step 10 trained on samples
    # of the restored weights (pushed to the rollout by the rollback before the replacement batch started)
    assert trainer.trained_on[9] == 7 and trainer.trained_on[10] == 5
    assert trainer.rlguard_dropped_samples == 4
    assert [by_step[s][DROPPED_KEY] for s in (8, 9, 10)] == [0.0, 0.0, 4.0]  # logged from the next step on
    # then one update old again: step 11 on the weights step 10 started from (the restored ones), 12 on step 10's
    assert (trainer.trained_on[11], trainer.trained_on[12]) == (5, 10)
    assert trainer.ran == list(range(1, 13))


def test_without_a_rollback_no_batch_is_dropped(tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]) -> None:
    trainer = Trainer(trainer_config(tmp_path, save_freq=1), poisoned_run(5, 0))
    asyncio.run(trainer.fit())
    assert trainer.trained_on == {1: 0, 2: 0, 3: 1, 4: 2, 5: 3}
    assert trainer.rlguard_dropped_samples == 0
    assert [step for step, _ in logged if step > 0] == [1, 2, 3, 4, 5]


def test_a_halt_returns_from_the_coroutine_fit(tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]) -> None:
    guard = GuardConfig.preset("default", interventions={"rollback": {"max_rollbacks": 0}})
    trainer = Trainer(trainer_config(tmp_path, save_freq=1), poisoned_run(5, 6), guard=guard)
    asyncio.run(trainer.fit())  # returns: no exception, and the generation in flight is cancelled by asyncio.run
    assert trainer.ran == list(range(1, 10))
    assert not trainer.shut_down  # verl's one-step-off trainer has no dump executor (no _dump_futures) to shut down
    trainer = Trainer(trainer_config(tmp_path / "dumps", save_freq=1), poisoned_run(5, 6), guard=guard)
    trainer._dump_futures = []  # type: ignore[attr-defined]  # a trainer that has one
    asyncio.run(trainer.fit())
    assert trainer.shut_down
    assert logged[-1][0] == 9 and logged[-1][1]["rlguard/guard/halted"] == 1.0


def test_verls_bypass_mode_rewriting_the_drivers_loss_mode_keeps_the_workers_objective(tmp_path: Path) -> None:
    """verl's asynchronous trainers default to ``algorithm.rollout_correction.bypass_mode``, which sets the driver's
    ``policy_loss.loss_mode`` to ``"bypass_mode"`` at the first batch: the controls the driver sends must still
    name the objective the workers were built with."""
    from omegaconf import open_dict

    trainer = Trainer(trainer_config(tmp_path, save_freq=1), poisoned_run(1, 0))
    with open_dict(trainer.config):  # what verl.trainer.ppo.rollout_corr_helper.apply_bypass_mode does
        trainer.config.actor_rollout_ref.actor.policy_loss.loss_mode = "bypass_mode"
    assert trainer.rlguard.actor_config().policy_loss.loss_mode == "rlguard.gspo"
    assert "clip" in trainer.rlguard.capabilities  # read from the objective, not verl's rewritten name
