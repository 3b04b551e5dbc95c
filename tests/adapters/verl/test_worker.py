"""The guard's ``lr_scale`` in verl: ``rlguard.adapters.verl.worker`` on a real torch optimizer and ``LambdaLR`` (what
verl's FSDP engine holds), and the driver on the stand-in trainers of ``tests/helpers/verl_stand_in.py`` with verl's
real worker classes in their worker mapping (``ray.remote`` classes; no Ray cluster is started)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="the verl adapter needs verl (pip install 'rlguard[verl]')")

import ray  # after the skip: verl brings Ray
from verl.trainer.ppo.utils import Role
from verl.utils.torch_functional import get_cosine_schedule_with_warmup

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # verl's imports: Ray's deprecated state API, engines that are not installed
    from verl.workers.engine_workers import ActorRolloutRefWorker

    from rlguard.adapters.verl.worker import GuardedActorRolloutRefWorker, set_scheduled_lr_scale

from rlguard.adapters.verl import guarded_trainer_class
from rlguard.adapters.verl.compat import LR_SCALE_METHOD, use_lr_worker, v1_maps_stock_workers, worker_sets_lr
from rlguard.guards import Controls, Decision, GuardConfig
from rlguard.guards.actuation import apply_decision
from rlguard.guards.schedules import Piecewise
from tests.helpers.verl_stand_in import FakeTrainer, FakeWorkerGroup, healthy, poisoned_run, trainer_config

BASE_LR, WARMUP, TOTAL = 1e-2, 3, 10


# -- the worker side: a real optimizer and scheduler -------------------------------------------------------------


def sgd_with_schedule() -> tuple[torch.nn.Parameter, torch.optim.SGD, Any]:
    """SGD (an update is exactly ``-lr * grad``) under verl's own cosine schedule with warmup (a ``LambdaLR``)."""
    weight = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    optimizer = torch.optim.SGD([weight], lr=BASE_LR)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    return weight, optimizer, scheduler


def schedule_factor(step: int) -> float:
    """verl's cosine-with-warmup multiplier at scheduler step ``step`` (utils/torch_functional.py, min_lr_ratio 0)."""
    if step < WARMUP:
        return step / WARMUP
    progress = (step - WARMUP) / (TOTAL - WARMUP)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def update_size(weight: torch.nn.Parameter, optimizer: torch.optim.SGD, scheduler: Any) -> float:
    """One optimizer step on gradient 1 then the scheduler step, as verl's worker orders them; returns the LR used."""
    before = weight.detach().clone()
    weight.grad = torch.ones_like(weight)
    optimizer.step()
    scheduler.step()
    return float((before - weight.detach())[0])


def test_the_scale_multiplies_the_schedule_at_every_later_step_and_never_compounds() -> None:
    weight, optimizer, scheduler = sgd_with_schedule()
    used = [update_size(weight, optimizer, scheduler)]  # step 0: warmup factor 0
    set_scheduled_lr_scale(optimizer, scheduler, 0.5)
    used += [update_size(weight, optimizer, scheduler) for _ in range(3)]  # scheduler steps 1, 2, 3
    set_scheduled_lr_scale(optimizer, scheduler, 0.5)  # restated, as the guard restates it every step
    set_scheduled_lr_scale(optimizer, scheduler, 0.5)
    used.append(update_size(weight, optimizer, scheduler))  # step 4: still x0.5, not x0.125
    set_scheduled_lr_scale(optimizer, scheduler, 1.0)
    used.append(update_size(weight, optimizer, scheduler))  # step 5: the schedule's own LR again
    scales = [1.0, 0.5, 0.5, 0.5, 0.5, 1.0]
    expected = [BASE_LR * schedule_factor(step) * scale for step, scale in enumerate(scales)]
    assert used == pytest.approx(expected, rel=1e-12, abs=0)
    assert used[3] > 0 and used[4] != used[5]  # the scale changed the update: the comparison can fail
    # verl logs the scheduler's LR after its step: it carries the scale too
    assert scheduler.get_last_lr()[0] == pytest.approx(BASE_LR * schedule_factor(6))


def test_a_checkpoint_load_brings_back_the_saved_scale_until_the_scale_is_sent_again() -> None:
    weight, optimizer, scheduler = sgd_with_schedule()
    for _ in range(4):
        update_size(weight, optimizer, scheduler)
    saved = scheduler.state_dict()  # saved at x1
    set_scheduled_lr_scale(optimizer, scheduler, 0.25)
    scheduler.load_state_dict(saved)
    assert update_size(weight, optimizer, scheduler) == pytest.approx(0.25 * BASE_LR * schedule_factor(4))
    # the loaded base LRs act from the next scheduler step: why the driver sends the scale after every load
    assert update_size(weight, optimizer, scheduler) == pytest.approx(BASE_LR * schedule_factor(5))
    set_scheduled_lr_scale(optimizer, scheduler, 0.25)
    assert update_size(weight, optimizer, scheduler) == pytest.approx(0.25 * BASE_LR * schedule_factor(6))


@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf, True])
def test_a_bad_scale_is_refused(scale: float) -> None:
    _, optimizer, scheduler = sgd_with_schedule()
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0"):
        set_scheduled_lr_scale(optimizer, scheduler, scale)


def test_a_scheduler_that_is_not_a_lambda_lr_is_refused() -> None:
    _, optimizer, _ = sgd_with_schedule()
    with pytest.raises(TypeError, match="needs a torch LambdaLR"):
        set_scheduled_lr_scale(optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2), 0.5)


def test_the_worker_method_is_registered_for_every_rank_and_scales_its_engine() -> None:
    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch

    method = getattr(GuardedActorRolloutRefWorker, LR_SCALE_METHOD)
    assert getattr(method, MAGIC_ATTR)["dispatch_mode"] == Dispatch.ONE_TO_ALL  # type: ignore[attr-defined]  # as verl's set_loss_fn
    weight, optimizer, scheduler = sgd_with_schedule()
    update_size(weight, optimizer, scheduler)
    worker = SimpleNamespace(actor=SimpleNamespace(engine=SimpleNamespace(optimizer=optimizer, lr_scheduler=scheduler)))
    method(worker, 0.5)
    assert update_size(weight, optimizer, scheduler) == pytest.approx(0.5 * BASE_LR * schedule_factor(1))
    with pytest.raises(RuntimeError, match="needs an actor whose engine has an optimizer and an LR scheduler"):
        method(SimpleNamespace(role="ref"), 0.5)


# -- which worker the trainers map -----------------------------------------------------------------------------


def test_only_verls_stock_actor_worker_is_replaced() -> None:
    mapping: dict[Any, Any] = {Role.ActorRollout: ray.remote(ActorRolloutRefWorker), Role.Critic: object}
    assert not worker_sets_lr(mapping)
    assert use_lr_worker(mapping, GuardedActorRolloutRefWorker) and worker_sets_lr(mapping)
    assert mapping[Role.Critic] is object

    class UsersWorker(ActorRolloutRefWorker):  # a user's own worker: left alone
        pass

    theirs: dict[Any, Any] = {Role.ActorRolloutRef: ray.remote(UsersWorker)}
    assert not use_lr_worker(theirs, GuardedActorRolloutRefWorker) and not worker_sets_lr(theirs)


def test_the_guarded_v1_trainer_maps_rlguards_actor_worker(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl's imports: Ray's deprecated state API, engines not installed
        from verl.trainer.ppo.v1 import PPOTrainerSync
        from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

    from rlguard.adapters.verl.trainers import __getattr__ as built

    cls = built("GuardedPPOTrainerSync")
    assert v1_maps_stock_workers(PPOTrainerSync) and cls.rlguard_lr_worker
    # a V1 trainer that maps its own worker (verl's separate-async one) keeps it: lr_scale is recorded only there
    assert not v1_maps_stock_workers(PPOTrainerSeparateAsync)
    assert not guarded_trainer_class(PPOTrainerSeparateAsync).rlguard_lr_worker  # type: ignore[attr-defined]
    trainer = object.__new__(cls)  # verl's _init_resource_pool_mgr reads only the config
    trainer.config = trainer_config(tmp_path)
    trainer._init_resource_pool_mgr()
    assert worker_sets_lr(trainer.role_worker_mapping)


# -- the driver ---------------------------------------------------------------------------------------------------


class LrWorkerGroup(FakeWorkerGroup):
    """The stand-in worker group with rlguard's LR call, recorded as ``(name, scale)`` in ``calls``."""

    def rlguard_set_lr_scale(self, scale: float) -> None:
        self.calls.append((LR_SCALE_METHOD, scale))


def lr_trainer(worker: type) -> type:
    """A guarded stand-in trainer whose worker mapping holds ``worker`` for the actor (as verl's task runner)."""

    class WithWorkers(FakeTrainer):
        def __init__(self, config: Any, steps: list[dict[str, float]]) -> None:
            super().__init__(config, steps)
            self.role_worker_mapping: dict[Any, Any] = {Role.ActorRollout: ray.remote(worker)}
            self.actor_rollout_wg = LrWorkerGroup()
            self.checkpoint_manager.calls = self.actor_rollout_wg.calls

    return guarded_trainer_class(WithWorkers)


def lr_guard(**schedule: Piecewise) -> GuardConfig:
    """The default guard without the LR back-off, so that the scales sent are the schedule's alone."""
    return GuardConfig.preset("default", interventions={"lr_backoff": None}, schedules=dict(schedule))


def sent(trainer: Any) -> list[tuple[str, Any]]:
    return [(name, arg) for name, arg in trainer.actor_rollout_wg.calls if name != "set_loss_fn"]


def test_the_decisions_absolute_scale_reaches_the_actor_workers_once_per_change(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    guard = lr_guard(lr_scale=Piecewise(boundaries=(2, 4), values=(1.0, 0.5, 1.0)))
    steps = [healthy(s) for s in range(1, 6)]
    trainer = lr_trainer(GuardedActorRolloutRefWorker)(trainer_config(tmp_path), steps, guard=guard)
    assert "lr_scale" in trainer.rlguard.capabilities
    trainer.fit()
    # x0.5 decided at step 2 (for steps 3 and 4), back to the schedule's LR decided at step 4; none otherwise
    assert sent(trainer) == [(LR_SCALE_METHOD, 0.5), (LR_SCALE_METHOD, 1.0)]
    assert [record["rlguard/guard/lr_scale"] for step, record in logged if step] == [1.0, 0.5, 0.5, 1.0, 1.0]
    assert not any("record-only" in event.message for event in trainer.rlguard.guard.events)


def test_verls_own_actor_worker_leaves_lr_scale_record_only(tmp_path: Path) -> None:
    trainer = lr_trainer(ActorRolloutRefWorker)(trainer_config(tmp_path), [])
    assert "lr_scale" not in trainer.rlguard.capabilities
    applied = apply_decision(Decision(2, controls=Controls(lr_scale=0.5)), trainer.rlguard)
    assert applied.record_only == ("lr_scale",) and sent(trainer) == []
    with pytest.raises(ValueError, match=r"schedules \['lr_scale'\] cannot be carried out"):
        lr_trainer(ActorRolloutRefWorker)(
            trainer_config(tmp_path), [], guard=lr_guard(lr_scale=Piecewise(boundaries=(2,), values=(1, 0.5)))
        )
    # nor on a Megatron actor, whose engine has no LambdaLR to scale
    config = trainer_config(tmp_path)
    config.actor_rollout_ref.actor.strategy = "megatron"
    assert "lr_scale" not in lr_trainer(GuardedActorRolloutRefWorker)(config, []).rlguard.capabilities


def test_the_scale_in_force_is_sent_again_after_a_rollback(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    guard = lr_guard(lr_scale=Piecewise(boundaries=(3,), values=(1.0, 0.5)))
    trainer = lr_trainer(GuardedActorRolloutRefWorker)(
        trainer_config(tmp_path, save_freq=1), poisoned_run(5, 4), guard=guard
    )
    trainer.fit()
    calls = sent(trainer)
    # steps 6-8 skipped, step 9 rolls back to step 5's checkpoint, whose scheduler was saved at x0.5: the driver
    # cannot know what the loaded scheduler holds, so it sends the scale in force after the load
    assert calls == [
        (LR_SCALE_METHOD, 0.5),
        ("sleep_replicas", None),
        ("load_checkpoint", str(trainer.rlguard.step_folder(5) / "actor")),
        ("update_weights", 9),
        (LR_SCALE_METHOD, 0.5),
    ]
    assert logged[-1][1]["rlguard/guard/rollback_to"] == 5.0


def test_resume_sends_the_saved_scale_to_the_fresh_workers(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    guard = lr_guard(lr_scale=Piecewise(boundaries=(3,), values=(1.0, 0.25)))
    steps = [healthy(s) for s in range(1, 5)]
    first = lr_trainer(GuardedActorRolloutRefWorker)(trainer_config(tmp_path, save_freq=2), steps, guard=guard)
    first.fit()
    assert json.loads((first.rlguard.step_folder(4) / "rlguard_guard.json").read_text())["lr_scale"] == 0.25
    resumed = lr_trainer(GuardedActorRolloutRefWorker)(
        trainer_config(tmp_path, save_freq=2, resume_mode="auto"), steps, guard=guard
    )
    resumed._load_checkpoint()
    assert resumed.global_steps == 4 and resumed.rlguard.lr_scale == 0.25
    assert sent(resumed) == [
        ("load_checkpoint", str(resumed.rlguard.step_folder(4) / "actor")),
        (LR_SCALE_METHOD, 0.25),
    ]
