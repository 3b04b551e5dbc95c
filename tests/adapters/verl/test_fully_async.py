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

from rlguard.adapters.verl.async_trainers import AGE_KEYS, DROPPED_KEY, STEP_AGE_KEYS
from rlguard.adapters.verl.compat import check_fully_async_trainer
from rlguard.adapters.verl.fully_async import (
    BOUND_KEY,
    STALE_DROPPED_KEY,
    DroppingQueueClient,
    FullyAsyncHalt,
    PolicyVersions,
    guarded_fully_async_trainer_class,
    is_halt,
)
from rlguard.adapters.verl.fully_async_rollouter import (
    guarded_fully_async_rollouter_class,
    staleness_bound_of,
    threshold_for_bound,
)
from rlguard.guards import GuardConfig
from rlguard.guards.decision import LOGGED_ACTIONS
from rlguard.guards.state import GUARD_STATE_FILE
from tests.adapters.verl.fully_async_stand_in import (
    DRIFT,
    ENGINE_GAP,
    TRAJECTORIES,
    FakeFullyAsyncTrainer,
    FakeRollouter,
    start,
)
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

    drops: list[tuple[int, str]] = []

    async def on_drop(n: int, reason: str) -> None:
        drops.append((n, reason))

    def why_drop(first: int, last: int) -> str | None:
        return "discarded" if versions.discarded(first, last) else None

    client = DroppingQueueClient(Inner(), why_drop, on_drop, loads=pickle.loads)

    async def read() -> list[Any]:
        return [await client.get_sample() for _ in range(3)]

    kept = asyncio.run(read())
    # the first two were generated (in part: a partial rollout across 1-3) by discarded weights
    assert [pickle.loads(k[0]).full_batch.non_tensor_batch["max_global_steps"].tolist() for k in kept[:2]] == [
        [1, 1],
        [4],
    ]
    assert kept[2] == (None, 0)  # verl's end signal passes through
    assert drops == [(2, "discarded"), (2, "discarded")]
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
    # one sync per step: the ages in optimizer steps are the ages in versions
    assert [data[STEP_AGE_KEYS[0]] for _, data in logged] == [0.0, 1.0, 2.0, 2.0]
    assert [data[STEP_AGE_KEYS[1]] for _, data in logged] == [0.0, 1.0, 2.0, 2.0]


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
    # steps 1-4 trained on version 0's samples (made at update 0), 5-6 on version 1's (made at update 2); step g
    # runs with g - 1 updates: ages in steps 0, 1 | 2, 3 | 2, 3, against 0 | 1 | 1 in versions
    assert [trainer.trained_on[g][1][0] for g in range(1, 7)] == [0, 0, 0, 0, 1, 1]
    assert [data[AGE_KEYS[1]] for _, data in logged] == [0.0, 1.0, 1.0]
    assert [data[STEP_AGE_KEYS[0]] for _, data in logged] == [0.5, 2.5, 2.5]
    assert [data[STEP_AGE_KEYS[1]] for _, data in logged] == [1.0, 3.0, 3.0]
    assert [trainer.rlguard_published.step_of(v) for v in range(4)] == [0, 2, 4, 6]


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
    assert by_step[11][AGE_KEYS[1]] == by_step[11][STEP_AGE_KEYS[1]] == 0.0
    # the restored version 5 counts from the republish on: its samples are as old as the restored weights
    assert trainer.rlguard_published.step_of(5) == trainer.rlguard_published.step_of(10) == 9
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


# -- the staleness remedies ----------------------------------------------------------------------------------------
def _verl_rollouter(threshold: float) -> Any:
    """verl's own ``FullyAsyncRollouter`` with the guard's call, its state set as ``__init__`` and ``init_workers``
    leave it (required_samples 8, 2 replicas of 16 concurrent samples, 1000 rollout steps); verl's ``__init__``
    needs datasets and replicas, so it is not run."""
    import warnings

    from rlguard.adapters.verl.compat import ray_actor_class

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl's imports warn about Ray's state API and engines not installed
        from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncRollouter

    cls = guarded_fully_async_rollouter_class(ray_actor_class(FullyAsyncRollouter))
    rollouter: Any = object.__new__(cls)
    rollouter.config = SimpleNamespace(async_training=SimpleNamespace(trigger_parameter_sync_step=2))
    rollouter.staleness_threshold = rollouter.rlguard_configured_threshold = threshold
    rollouter.required_samples, rollouter.total_rollout_steps, rollouter.concurrent_samples_per_replica = 8, 1000, 16
    rollouter.llm_server_manager = SimpleNamespace(get_active_server_count=lambda: 2)
    rollouter._active_count_history = [(0.0, 0, 0), (1.0, 0, 0)]
    rollouter._init_async_objects()
    asyncio.run(rollouter.set_max_required_samples())
    return rollouter


def _budget(rollouter: Any) -> tuple[float, int, int, int]:
    return (
        rollouter.staleness_threshold,
        rollouter.max_required_samples,
        rollouter.max_queue_size,
        rollouter.max_concurrent_samples,
    )


def test_the_bound_sets_verls_own_budget_and_is_restored() -> None:
    """verl derives max_required_samples = required_samples * (threshold + 1) * trigger_parameter_sync_step (the
    pause bound of its queue too) and caps concurrency at it: 8 * (4 + 1) * 2 = 80 and min(2 * 16, 80) = 32."""
    rollouter = _verl_rollouter(4.0)
    assert _budget(rollouter) == (4.0, 80, 80, 32)

    async def bound(value: int | None) -> float:
        return float(await rollouter.rlguard_set_staleness_bound(value))

    assert asyncio.run(bound(1)) == 1.0 and _budget(rollouter) == (1.0, 32, 32, 32)  # 8 * 2 * 2
    assert asyncio.run(bound(0)) == 0.0 and _budget(rollouter) == (0.0, 16, 16, 16)  # 8 * 1 * 2
    assert asyncio.run(bound(8)) == 4.0 and _budget(rollouter) == (4.0, 80, 80, 32)  # never above the run's own
    asyncio.run(bound(1))
    assert asyncio.run(bound(None)) == 4.0 and _budget(rollouter) == (4.0, 80, 80, 32)
    assert [staleness_bound_of(t) for t in (0.0, 0.5, 1.0, 1.5, 4.0)] == [0, 1, 1, 2, 4]
    with pytest.raises(ValueError, match="bound must be a whole number"):
        threshold_for_bound(4.0, -1)


def test_a_rollouter_without_verls_budget_call_is_refused() -> None:
    class Other:
        def set_max_required_samples(self) -> None:  # not a coroutine
            return None

    with pytest.raises(RuntimeError, match=r"a coroutine set_max_required_samples\(\)"):
        guarded_fully_async_rollouter_class(Other)


def _stale_guard() -> GuardConfig:
    """Only the staleness remedy, its bounds, escalating on the stand-in's non-finite steps at once (one step's
    trial) and restoring the bound after 3 clean steps."""
    remedy = {
        "remedies": ("lower_bound", "drop_stale"),
        "escalate_on": ("nonfinite",),
        "trial_steps": 1,
        "recovery_steps": 3,
    }
    off = dict.fromkeys(("clip_controller", "halt", "lr_backoff", "rollback", "skip_no_signal", "skip_step"))
    return GuardConfig.preset("default", interventions={**off, "staleness_remedy": remedy})


def _recomputed_pi_old(tmp_path: Path, **trainer: Any) -> Any:
    from omegaconf import open_dict

    config = trainer_config(tmp_path, **trainer)
    with open_dict(config):
        config.actor_rollout_ref.rollout.calculate_log_probs = True  # the engine's log-probs beside pi_old
        config.async_training = {"staleness_threshold": 2.0}
    return config


def test_the_staleness_remedy_lowers_the_rollouters_bound_drops_over_age_samples_and_restores_it(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    Rollouter = guarded_fully_async_rollouter_class(FakeRollouter)
    config = _recomputed_pi_old(tmp_path, save_freq=1)
    trainer = Trainer(config, poisoned_run(4, 2) + poisoned_run(8, 0), guard=_stale_guard(), rollouter_class=Rollouter)
    asyncio.run(start(trainer))
    assert {"staleness_bound", "drop_stale"} <= trainer.rlguard.guard.capabilities
    by_step = dict(logged)
    # the gap by age bucket, pi_old recomputed: the engine's 0.01 plus 0.1 per version of age
    assert by_step[1]["rlguard/mismatch_logp_abs_mean_age0"] == pytest.approx(ENGINE_GAP)
    assert by_step[2]["rlguard/mismatch_logp_abs_mean_age1"] == pytest.approx(ENGINE_GAP + DRIFT)
    assert by_step[3]["rlguard/mismatch_logp_abs_mean_age2_3"] == pytest.approx(ENGINE_GAP + 2 * DRIFT)
    bounds = [by_step[s][BOUND_KEY] for s in sorted(by_step)]
    # staleness diagnosed at 2; the non-finite step 5 halves the bound (2 -> 1) after it, 3 clean steps after the
    # last one (6) restore it (at 9, in force from 10)
    assert bounds == [2.0] * 5 + [1.0] * 4 + [2.0] * 5, bounds
    events = [json.loads(line) for line in (tmp_path / "ckpt" / "events.jsonl").read_text().splitlines()]
    said = [(e["step"], e["message"]) for e in events if "staleness bound" in e.get("message", "")]
    assert said == [
        (5, "stale samples (diagnosed at step 2) with nonfinite: staleness bound 2 -> 1"),
        (9, "recovered: staleness bound 1 -> 2"),
    ], said
    # the samples already queued over the lowered bound were dropped as the trainer took them, not trained on
    assert sum(data[STALE_DROPPED_KEY] for _, data in logged) == by_step[6][STALE_DROPPED_KEY] > 0
    assert all(data[AGE_KEYS[1]] <= 1.0 for s, data in logged if 6 <= s <= 9), [d[AGE_KEYS[1]] for _, d in logged]
    assert max(data[AGE_KEYS[1]] for s, data in logged if s >= 11) == 2.0  # the restored lookahead
    assert trainer.rollouter.staleness_threshold == 2.0 and trainer.rollouter.lookahead == 2
    assert by_step[6][DROPPED_KEY] == 0.0  # none discarded: no rollback

    # a resume from version 7, the bound lowered, gives the rollouter the lowered bound again before fit
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("7")
    resumed = Trainer(config, poisoned_run(8, 0), guard=_stale_guard(), rollouter_class=Rollouter)
    asyncio.run(resumed.set_rollouter(resumed.rollouter))
    asyncio.run(resumed.load_checkpoint())
    assert resumed.rollouter.staleness_threshold == 1.0 and resumed.rlguard_threshold == 1.0


def test_a_stock_rollouter_leaves_the_bound_recorded_only(tmp_path: Path) -> None:
    trainer = Trainer(_recomputed_pi_old(tmp_path, save_freq=-1), poisoned_run(2, 0), guard=_stale_guard())
    asyncio.run(start(trainer))
    assert "drop_stale" in trainer.rlguard.guard.capabilities
    assert "staleness_bound" not in trainer.rlguard.guard.capabilities
