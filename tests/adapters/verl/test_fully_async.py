"""The guard in verl's fully async trainer, on a stand-in with verl's pipeline (fully_async_stand_in.py): the
driver is the synchronous trainers' (one copy); what differs is one judged record per parameter version, the
rollback's republished version and the dropped samples of discarded versions, the halt raised out of ``fit`` and the
resume through ``load_checkpoint``. End to end with Ray on CPU: integration_tests/test_verl_async.py."""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("verl")

from rlguard.adapters.verl.async_trainers import AGE_KEYS, DROPPED_KEY
from rlguard.adapters.verl.compat import check_fully_async_trainer
from rlguard.adapters.verl.fully_async import (
    DroppingQueueClient,
    FullyAsyncHalt,
    PolicyVersions,
    guarded_fully_async_trainer_class,
    is_halt,
)
from rlguard.guards import GuardConfig
from rlguard.guards.decision import LOGGED_ACTIONS
from rlguard.guards.state import GUARD_STATE_FILE
from tests.adapters.verl.fully_async_stand_in import TRAJECTORIES, FakeFullyAsyncTrainer, start
from tests.helpers.verl_stand_in import poisoned_run, trainer_config

Trainer = guarded_fully_async_trainer_class(FakeFullyAsyncTrainer)
ROLLBACK = LOGGED_ACTIONS.index("rollback")


# -- the pieces --------------------------------------------------------------------------------------------------
def test_policy_versions_after_a_rollback() -> None:
    versions = PolicyVersions()
    assert [versions.policy(v) for v in range(4)] == [0, 1, 2, 3]
    versions.republish(6, restored=2)  # rolled back at 5 to version 2: 3-5 discarded, 6 is 2's weights
    assert [versions.policy(v) for v in (2, 5, 6, 7, 8)] == [2, 5, 2, 3, 4]
    assert [versions.discarded(v, v) for v in range(2, 8)] == [False, True, True, True, False, False]
    assert versions.discarded(1, 3) and not versions.discarded(1, 2)  # a partial rollout that touched version 3
    # a sample's age: updates between the weights that generated it and the weights it updates
    assert versions.age(6, 2) == 0 and versions.age(7, 2) == 1 and versions.age(8, 6) == 2 and versions.age(6, 1) == 1
    with pytest.raises(ValueError, match="version must be after restored"):
        versions.republish(6, restored=6)


def test_policy_versions_start_after_a_resume() -> None:
    versions = PolicyVersions(start=4)
    assert versions.policy(6) == 6 and versions.age(6, 4) == 2 and not versions.discarded(0, 10)


def _sample(first: list[int], last: list[int]) -> bytes:
    batch = SimpleNamespace(non_tensor_batch={"min_global_steps": np.array(first), "max_global_steps": np.array(last)})
    return pickle.dumps(SimpleNamespace(full_batch=batch))


def test_dropping_queue_client_skips_the_samples_of_discarded_versions() -> None:
    versions = PolicyVersions()
    versions.republish(4, restored=1)  # 2 and 3 discarded
    queued = [_sample([2, 2], [2, 2]), _sample([1, 1], [1, 3]), _sample([1, 1], [1, 1]), _sample([4], [4]), None]

    class Inner:
        async def get_sample(self) -> Any:
            item = queued.pop(0)
            return item, len(queued)

        def get_queue_size_sync(self) -> int:
            return len(queued)

    drops: list[int] = []

    async def on_drop(n: int) -> None:
        drops.append(n)

    client = DroppingQueueClient(Inner(), versions.discarded, on_drop, loads=pickle.loads)

    async def read() -> list[Any]:
        return [await client.get_sample() for _ in range(3)]

    kept = asyncio.run(read())
    # the first two were generated (in part: a partial rollout across 1-3) by discarded weights
    assert [pickle.loads(k[0]).full_batch.non_tensor_batch["max_global_steps"].tolist() for k in kept[:2]] == [
        [1, 1],
        [4],
    ]
    assert kept[2] == (None, 0)  # verl's end signal passes through
    assert drops == [2, 2]
    assert client.get_queue_size_sync() == 0  # the rest is verl's client


def test_is_halt_sees_through_rays_task_error() -> None:
    assert is_halt(FullyAsyncHalt("x"))
    assert is_halt(RuntimeError("ray")) is False
    wrapped = RuntimeError("RayTaskError")
    wrapped.cause = FullyAsyncHalt("x")  # type: ignore[attr-defined]  # what Ray's RayTaskError carries
    assert is_halt(wrapped)


def test_a_trainer_without_verls_step_methods_is_refused() -> None:
    class Other(FakeFullyAsyncTrainer):
        def fit_step(self, batch: Any = None) -> None:  # type: ignore[override]  # not a coroutine, another name
            return None

    with pytest.raises(RuntimeError, match=r"a coroutine fit_step.*fit_step\(batch_dict\)"):
        check_fully_async_trainer(Other)


def test_dynamic_resource_scheduling_is_refused(tmp_path: Path) -> None:
    from omegaconf import open_dict

    config = trainer_config(tmp_path)
    with open_dict(config):
        config.async_training = {"use_dynamic_resource_scheduling": True}
    with pytest.raises(ValueError, match="use_dynamic_resource_scheduling=false"):
        Trainer(config, poisoned_run(1, 0))


# -- the guarded pipeline ------------------------------------------------------------------------------------------
def test_stock_pipeline_logs_each_cycle_one_step_late(tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]) -> None:
    """What the guarded trainer changes: verl logs the aggregate of a cycle before adding its last step."""
    trainer = FakeFullyAsyncTrainer(trainer_config(tmp_path, save_freq=1), poisoned_run(3, 0))
    asyncio.run(start(trainer))
    assert [(step, data["training/global_step"]) for step, data in logged] == [(2, 1), (3, 2)]  # step 3 never


def test_one_record_per_version_judged_with_its_own_metrics(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    trainer = Trainer(trainer_config(tmp_path, save_freq=-1), poisoned_run(4, 0))
    asyncio.run(start(trainer))
    assert [(step, data["training/global_step"]) for step, data in logged] == [(s, s) for s in range(1, 5)]
    assert all("rlguard/guard/action" in data and data[DROPPED_KEY] == 0.0 for _, data in logged)
    assert [data["actor/pg_loss"] for _, data in logged] == [s["actor/pg_loss"] for s in poisoned_run(4, 0)]
    # lookahead 2: step 1's sample and the two queued behind it came from the initial weights
    assert [data[AGE_KEYS[0]] for _, data in logged] == [0.0, 1.0, 2.0, 2.0]
    assert [data[AGE_KEYS[1]] for _, data in logged] == [0.0, 1.0, 2.0, 2.0]


def test_a_sync_cycle_of_several_steps_is_one_judged_record(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    """verl's default publishes every ``trigger_parameter_sync_step`` steps: the guard judges each cycle's aggregate
    (verl's own aggregation rules) at the version it produced."""
    steps = poisoned_run(6, 0)
    trainer = Trainer(trainer_config(tmp_path, save_freq=-1), steps, sync_every=2)
    asyncio.run(start(trainer))
    assert [(step, data["training/global_step"]) for step, data in logged] == [(1, 2), (2, 4), (3, 6)]
    for (_, data), first in zip(logged, (0, 2, 4), strict=True):
        mean = (steps[first]["actor/pg_loss"] + steps[first + 1]["actor/pg_loss"]) / 2
        assert data["actor/pg_loss"] == pytest.approx(mean, rel=1e-12)
    assert [s for s, _ in trainer.checkpoint_manager.published] == [0, 1, 2, 3]


def test_a_rollback_republishes_the_restored_weights_and_drops_the_discarded_samples(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    trainer = Trainer(trainer_config(tmp_path, save_freq=1), poisoned_run(5, 4) + poisoned_run(3, 0))
    asyncio.run(start(trainer))
    by_step = dict(logged)
    rolled = [step for step, data in logged if data["rlguard/guard/action"] == ROLLBACK]
    assert rolled == [9] and by_step[9]["rlguard/guard/rollback_to"] == 5.0  # three skips in a row, then back to 5
    # the restored weights went to the rollouter as a new version, 10, before the next batch was taken
    restored = int((tmp_path / "ckpt" / "global_step_5" / "actor" / "weights.txt").read_text())
    assert trainer.checkpoint_manager.published[10] == (10, restored)  # [0]: the push before fit
    assert int((tmp_path / "ckpt" / "global_step_10" / "actor" / "weights.txt").read_text()) == restored
    assert (tmp_path / "ckpt" / "global_step_10" / GUARD_STATE_FILE).is_file()
    assert 10 not in by_step and sorted(by_step)[9:] == [11, 12, 13]  # version 10 is the republished one
    # queued samples of versions 6-9 (generated by the discarded weights) were dropped, none trained on
    trained_after = [trainer.trained_on[step] for step in range(10, 13)]
    assert all(v <= 5 or v >= 10 for _, tags in trained_after for v in tags), trained_after
    assert trainer.rlguard_dropped_samples == 2 * TRAJECTORIES  # the two queued behind step 9's sample
    assert [by_step[s][DROPPED_KEY] for s in (9, 11)] == [0.0, 2.0 * TRAJECTORIES]
    assert trainer.rollouter.reset_calls == 1 + 12 + 1 + 2  # the first push, each step, the republish, each drop
    # the first step after the rollback trains on the restored weights' samples: age 0
    assert trained_after[0] == ([restored] * TRAJECTORIES, [10] * TRAJECTORIES)
    assert by_step[11][AGE_KEYS[1]] == 0.0
    assert 9 in trainer.rlguard.discarded and 10 not in trainer.rlguard.discarded


def test_a_halt_is_raised_out_of_fit_after_logging_the_step(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    guard = GuardConfig.preset("default", interventions={"rollback": {"max_rollbacks": 0}})
    trainer = Trainer(trainer_config(tmp_path, save_freq=1), poisoned_run(5, 6), guard=guard)
    with pytest.raises(FullyAsyncHalt, match="rlguard halted training at step 9"):
        asyncio.run(start(trainer))
    assert trainer.shut_down
    assert logged[-1][0] == 9 and logged[-1][1]["rlguard/guard/halted"] == 1.0
    assert trainer.global_steps == 10  # no step after the halt


def test_resume_keeps_the_guards_state(tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]) -> None:
    config = trainer_config(tmp_path, save_freq=1, resume_mode="auto")
    first = Trainer(config, poisoned_run(5, 4))
    asyncio.run(start(first))
    saved = json.loads((tmp_path / "ckpt" / "global_step_10" / GUARD_STATE_FILE).read_text())
    assert saved["guard"] == json.loads(json.dumps(first.rlguard.guard.state_dict()))  # as the rollback left it
    resumed = Trainer(config, poisoned_run(5, 4))
    asyncio.run(resumed.load_checkpoint())  # what verl's task runner calls before fit
    assert resumed.current_param_version == 10 and resumed.actor_rollout_wg.calls[0][0] == "load_checkpoint"
    assert json.loads(json.dumps(resumed.rlguard.guard.state_dict())) == saved["guard"]
    assert resumed.rlguard.discarded == first.rlguard.discarded and resumed.rlguard.discarded
    assert resumed.rlguard_versions.policy(12) == 12  # ages count from the resumed version
