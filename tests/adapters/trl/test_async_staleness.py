"""GuardedAsyncGRPOTrainer's staleness remedies: ``staleness_bound`` and ``drop_stale`` carried out by TRL's own
``RolloutQueueDataset``, which reads ``max_staleness`` for every sample it takes from the rollout queue and drops
(and counts) the older ones. The trainer is built without TRL's ``__init__`` (no model, no server): the class's own
methods on the attributes they read, and TRL's real dataset over a plain queue."""

from __future__ import annotations

import itertools
import queue
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("trl")

from rlguard.adapters.trl.actuators import trainer_capabilities
from rlguard.adapters.trl.async_compat import check_rollout_dataset_slot, trainer_module
from rlguard.adapters.trl.async_trainer import (
    STALENESS_BOUND_KEY,
    GuardedAsyncGRPOConfig,
    GuardedAsyncGRPOTrainer,
    staleness_bound_in_force,
)
from rlguard.core_losses import Controls
from rlguard.guards import Guard, GuardConfig, StepStats
from rlguard.guards.actuation import apply_decision
from rlguard.guards.decision import Decision

VERSION = 5  # the trainer's policy version while the samples are taken (not a multiple of TRL's trace interval)
CONFIGURED = 3


class _Unhealthy(Exception):
    pass


def _no_more_samples(stale_after_s: float) -> None:
    raise _Unhealthy  # TRL calls the health check when the queue stays empty: the test took too many


def _trainer(guard: Guard | None = None, configured: int = CONFIGURED) -> Any:
    """A GuardedAsyncGRPOTrainer with what the staleness remedies read, and TRL's rollout dataset over a queue."""
    trainer: Any = object.__new__(GuardedAsyncGRPOTrainer)
    args = GuardedAsyncGRPOConfig(output_dir="unused", use_cpu=True, max_staleness=configured)
    trainer.rlguard_configured_objective = args.rlguard_mapping.build()
    trainer.rlguard_objective = trainer.rlguard_configured_objective
    trainer.rlguard_guard = guard
    trainer.rlguard_configured_staleness = args.max_staleness
    trainer.rlguard_staleness_bound = args.max_staleness
    trainer._rlguard_step_bound = args.max_staleness
    trainer._rlguard_step_stats = StepStats()
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.model_version = VERSION
    trainer._rollout_dataset = trainer_module.RolloutQueueDataset(
        rollout_queue=queue.Queue(),
        model_version_fn=lambda: trainer.model_version,
        check_health_fn=_no_more_samples,
        stale_after_s=1.0,
        metrics=trainer._metrics["train"],
        max_staleness=args.max_staleness,
        poll_interval_s=0.01,
    )
    return trainer


def _take(trainer: Any, ages: list[int]) -> list[int]:
    """Put samples of these ages in the queue and take all TRL's dataset yields; their ages."""
    dataset = trainer._rollout_dataset
    for age in ages:
        dataset.queue.put(
            SimpleNamespace(
                model_version=VERSION - age, enqueued_at=None, input_ids=[age], completion_mask=[1],
                old_log_probs=[0.0], advantage=0.0, group_id=0, metrics={},
            )
        )  # fmt: skip
    taken = []
    iterator = iter(dataset)
    with pytest.raises(_Unhealthy):
        for sample in itertools.islice(iterator, len(ages) + 1):
            taken.append(sample["input_ids"][0])
    return taken


def test_the_trainer_declares_the_staleness_capabilities() -> None:
    can = trainer_capabilities(_trainer())
    assert {"staleness_bound", "drop_stale"} <= can
    check_rollout_dataset_slot(_trainer())  # TRL 1.16 has the slot and the dataset's max_staleness


def test_the_bound_in_force_is_the_lowest_never_above_the_configured() -> None:
    assert staleness_bound_in_force(3, Controls()) == 3
    assert staleness_bound_in_force(3, Controls(max_staleness=1)) == 1
    assert staleness_bound_in_force(3, Controls(stale_drop_age=2)) == 2
    assert staleness_bound_in_force(3, Controls(max_staleness=2, stale_drop_age=1)) == 1
    assert staleness_bound_in_force(3, Controls(max_staleness=8)) == 3


def test_a_lowered_bound_drops_over_age_samples_through_trls_dataset_and_is_restored() -> None:
    trainer = _trainer()
    ages = [0, 1, 2, 3, 4]
    assert _take(trainer, ages) == [0, 1, 2, 3]  # TRL's own bound, as configured: age 4 dropped
    dropped = trainer._metrics["train"]["sample/dropped_stale_total"]
    assert dropped == [1.0]
    trainer.rlguard_set_controls(Controls(max_staleness=1))
    assert trainer._rollout_dataset.max_staleness == 1 and trainer.rlguard_staleness_bound == 1
    assert _take(trainer, ages) == [0, 1]  # ages 2-4 dropped by TRL's check, counted by TRL
    assert dropped == [1.0] * 4
    trainer.rlguard_set_controls(Controls(stale_drop_age=2))  # drop_stale alone: the same lever
    assert _take(trainer, ages) == [0, 1, 2]
    trainer.rlguard_set_controls(Controls())  # recovered: back to the configured bound
    assert trainer._rollout_dataset.max_staleness == CONFIGURED
    assert _take(trainer, ages) == [0, 1, 2, 3]
    assert dropped == [1.0] * 7  # 1 + 3 + 2 + 1


def test_the_guards_decision_reaches_the_dataset_through_the_actuator() -> None:
    """apply_decision sends the controls to the trainer (TrainerActuator -> rlguard_set_controls)."""
    from torch import nn
    from torch.optim import SGD

    from rlguard.adapters.trl.async_trainer import RolloutSyncActuator

    trainer = _trainer()
    model = nn.Linear(2, 1)
    actuator = RolloutSyncActuator(model, SGD(model.parameters(), lr=0.1), owns_step=False, trainer=trainer)
    applied = apply_decision(Decision(step=3, controls=Controls(max_staleness=2, stale_drop_age=2)), actuator)
    assert applied.record_only == () and trainer._rollout_dataset.max_staleness == 2
    apply_decision(Decision(step=4), actuator)
    assert trainer._rollout_dataset.max_staleness == CONFIGURED


def test_the_step_stats_and_the_log_carry_the_bound_the_steps_samples_were_taken_under(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer = _trainer()
    monkeypatch.setattr(trainer_module.AsyncGRPOTrainer, "_log_step_metrics", lambda self: None)  # TRL's perf/*
    assert trainer.rlguard_take_step_stats().reduce()["staleness_bound"] == CONFIGURED
    trainer.rlguard_set_controls(Controls(max_staleness=1))  # the step's decision: from the next sample on
    trainer._log_step_metrics()
    assert trainer.rlguard_take_step_stats().reduce()["staleness_bound"] == 1
    trainer._log_step_metrics()
    assert trainer._metrics["train"][STALENESS_BOUND_KEY] == [float(CONFIGURED), 1.0]


def _guard_holding_bound(bound: int | None) -> Guard:
    """A resumed guard: the state of one whose staleness remedy had lowered the bound to ``bound``."""
    config = GuardConfig(interventions={"staleness_remedy": {}})
    before = Guard(config)
    remedy = before.interventions["staleness_remedy"]
    remedy._s_stale_step, remedy._s_configured_bound, remedy._s_bound = 2, CONFIGURED, bound  # type: ignore[attr-defined]
    after = Guard(config)
    after.load_state_dict(before.state_dict())
    return after


def test_a_resumed_guards_bound_is_in_force_before_the_first_sample() -> None:
    trainer = _trainer(_guard_holding_bound(1))
    trainer.rlguard_restore_staleness_bound()
    assert trainer._rollout_dataset.max_staleness == 1
    assert _take(trainer, [0, 1, 2]) == [0, 1]
    assert trainer.rlguard_take_step_stats().reduce()["staleness_bound"] == 1
    fresh = _trainer(_guard_holding_bound(None))
    fresh.rlguard_restore_staleness_bound()
    assert fresh._rollout_dataset.max_staleness == CONFIGURED


def test_a_dataset_without_max_staleness_is_refused_clearly() -> None:
    trainer = _trainer()
    trainer._rollout_dataset = SimpleNamespace()
    with pytest.raises(RuntimeError, match=r"max_staleness.*Install trl 1\.16"):
        trainer.rlguard_set_controls(Controls(max_staleness=1))
    bare = SimpleNamespace()
    with pytest.raises(RuntimeError, match="_rollout_dataset"):
        check_rollout_dataset_slot(bare)


def test_off_the_main_process_nothing_is_set() -> None:
    trainer = _trainer()
    trainer._rollout_dataset = None  # TRL builds its rollout dataset on the main process only
    trainer.rlguard_set_controls(Controls(max_staleness=1))
    assert trainer.rlguard_staleness_bound == 1  # kept: the logged and judged bound is the same on every rank
