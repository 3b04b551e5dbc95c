"""``rlguard.adapters.verl.driver`` and ``.trainers``: the driver on stand-in trainers.

verl's Ray trainer cannot be built here (no GPU, no rollout engine; verl 0.9.1's ``ray_trainer`` also needs
``cachetools``, absent from this environment). :func:`guarded_trainer_class` is applied to ``FakeTrainer``
(tests/helpers/verl_stand_in.py), whose ``fit``, ``_save_checkpoint`` and ``_load_checkpoint`` follow verl's (same
folder layout, same local import of ``verl.utils.tracking.Tracking`` in ``fit``), with stand-in worker groups that
record the calls. The guarded loss itself: ``test_guarded.py``.
"""

from __future__ import annotations

import inspect
import json
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="the verl adapter needs verl (pip install 'rlguard[verl]')")

from omegaconf import open_dict  # after the skip: verl brings omegaconf

from rlguard.adapters.verl import GuardedPolicyLossConfig, guarded_trainer_class
from rlguard.adapters.verl import driver as verl_guard
from rlguard.adapters.verl import trainers as verl_trainers
from rlguard.adapters.verl.settings import resolve_guard_setting
from rlguard.guards import GuardConfig
from tests.helpers.guards import ScriptedGuard
from tests.helpers.verl_loss import GLOBAL, actor, inputs, run
from tests.helpers.verl_stand_in import FakeTrainer, healthy, poisoned_run, trainer_config

# -- the driver on a stand-in trainer ---------------------------------------------------------------------


Trainer = guarded_trainer_class(FakeTrainer)


def test_poisoned_steps_roll_back_to_the_last_healthy_checkpoint(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    trainer = Trainer(trainer_config(tmp_path, save_freq=1), poisoned_run(5, 4))
    trainer.fit()
    calls = [name for name, _ in trainer.actor_rollout_wg.calls]
    # steps 6-8 skipped (recorded: the update is in), step 9: three skips in a row -> back to step 5's checkpoint
    assert calls == ["sleep_replicas", "load_checkpoint", "update_weights"]
    assert trainer.actor_rollout_wg.calls[1][1] == str(trainer.rlguard.step_folder(5) / "actor")
    assert trainer.actor_rollout_wg.version == 5 and trainer.ran == list(range(1, 10))
    assert trainer.actor_rollout_wg.calls[2][1] == 9  # rollout replicas get the restored weights
    assert trainer.rlguard.discarded == {6, 7, 8}  # never rolled back to
    # step 9's checkpoint holds the restored weights, so that resume_mode=auto starts from them
    assert (trainer.rlguard.step_folder(9) / "actor" / "weights.txt").read_text() == "5"
    by_step = dict(logged)
    assert [by_step[s]["rlguard/guard/action"] for s in (5, 6, 9)] == [0.0, 3.0, 4.0]
    assert by_step[9]["rlguard/guard/rollback_to"] == 5.0 and by_step[6]["rlguard/event/nonfinite"] == 2.0
    assert 0 in by_step and "rlguard/guard/action" not in by_step[0]  # validation is not a training step
    state = json.loads((trainer.rlguard.step_folder(9) / "rlguard_guard.json").read_text())
    assert state["guard"]["last_step"] == 9 and state["discarded"] == [6, 7, 8]
    events = [json.loads(line) for line in (tmp_path / "ckpt" / "events.jsonl").read_text().splitlines()]
    assert {e["detector"] for e in events} >= {"nonfinite", "action:skip_step", "action:rollback"}


def test_halt_ends_fit_after_logging_the_step(tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]) -> None:
    guard = GuardConfig.preset("default", interventions={"rollback": {"max_rollbacks": 0}})
    trainer = Trainer(trainer_config(tmp_path, save_freq=1), poisoned_run(5, 6), guard=guard)
    trainer.fit()  # returns: no exception reaches the caller
    assert trainer.ran == list(range(1, 10)) and trainer.shut_down
    assert logged[-1][0] == 9 and logged[-1][1]["rlguard/guard/halted"] == 1.0
    assert logged[-1][1]["rlguard/guard/action"] == 5.0
    assert "load_checkpoint" not in [name for name, _ in trainer.actor_rollout_wg.calls]


def test_rollback_without_a_checkpoint_halts(tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]) -> None:
    trainer = Trainer(trainer_config(tmp_path, save_freq=-1), poisoned_run(5, 6))
    trainer.rlguard.trainer._save_checkpoint = lambda: None  # snapshots asked for, none written
    trainer.fit()
    assert trainer.ran == list(range(1, 10)) and logged[-1][1]["rlguard/guard/halted"] == 1.0


def test_clip_decision_reaches_the_workers_through_set_loss_fn(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    from verl.workers.utils.losses import ppo_loss

    steps = [healthy(s) for s in range(1, 4)] + [healthy(4, **{"actor/rlguard/kl_old": 0.2})]
    trainer = Trainer(trainer_config(tmp_path), steps)
    trainer.fit()
    assert len(trainer.actor_rollout_wg.loss_fns) == 1  # one call, when the controls changed
    loss_fn = trainer.actor_rollout_wg.loss_fns[0]
    assert isinstance(loss_fn, partial) and loss_fn.func is ppo_loss
    sent = loss_fn.keywords["config"]
    assert isinstance(sent.policy_loss, GuardedPolicyLossConfig)
    assert (
        sent.policy_loss.controls["clip_scale"] == pytest.approx(1 / 1.5) == logged[-1][1]["rlguard/guard/clip_scale"]
    )
    # the config the workers receive gives verl's clip range times the scale
    sent.global_batch_info.update(GLOBAL)
    ours = run("rlguard.gspo", inputs(), sent)
    low, high = sent.clip_ratio_low / 1.5, sent.clip_ratio_high / 1.5
    ref = run("gspo", inputs(), actor(clip_ratio_low=low, clip_ratio_high=high, loss_agg_mode=sent.loss_agg_mode))
    torch.testing.assert_close(ours[:2], ref[:2], rtol=1e-12, atol=0)


def test_resume_restores_the_guard_and_the_workers_controls(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    steps = [healthy(s) for s in range(1, 5)] + [healthy(s, **{"actor/rlguard/kl_old": 0.2}) for s in (5, 6)]
    first = Trainer(trainer_config(tmp_path, save_freq=2), steps)
    first.fit()
    saved = json.loads((first.rlguard.step_folder(6) / "rlguard_guard.json").read_text())
    resumed = Trainer(trainer_config(tmp_path, save_freq=2, resume_mode="auto"), steps)
    resumed._load_checkpoint()
    assert resumed.global_steps == 6
    assert resumed.rlguard.guard.state_dict() == saved["guard"] == first.rlguard.guard.state_dict()
    assert resumed.rlguard.guard.events and resumed.rlguard.controls == first.rlguard.controls
    sent = resumed.actor_rollout_wg.loss_fns[-1].keywords["config"]
    assert sent.policy_loss.controls["clip_scale"] == first.rlguard.controls.clip_scale < 1.0


def test_resume_without_the_guards_state_warns_with_its_cost(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    """As in TRL: a checkpoint without rlguard_guard.json (saved before the guard was added, or copied without it)
    is resumed from, loudly, saying that the baselines start over."""
    steps = [healthy(s) for s in range(1, 5)]
    first = Trainer(trainer_config(tmp_path, save_freq=2), steps)
    first.fit()
    (first.rlguard.step_folder(4) / "rlguard_guard.json").unlink()
    resumed = Trainer(trainer_config(tmp_path, save_freq=2, resume_mode="auto"), steps)
    with pytest.warns(UserWarning, match=r"resuming at step 4 WITHOUT the guard's state: .*global_step_4.*baseline"):
        resumed._load_checkpoint()
    assert resumed.global_steps == 4 and resumed.rlguard.guard.events == []


def test_driver_rejects_an_unguarded_loss(tmp_path: Path) -> None:
    config = trainer_config(tmp_path)
    config.actor_rollout_ref.actor.policy_loss._target_ = "rlguard.adapters.verl.RLGuardPolicyLossConfig"
    with pytest.raises(ValueError, match=r"policy_loss._target_=rlguard\.adapters\.verl\.GuardedPolicyLossConfig"):
        Trainer(config, [])


def test_guarded_ray_trainer_is_built_lazily() -> None:
    assert "GuardedRayPPOTrainer" not in vars(verl_trainers)  # importing verl's Ray trainer is not free
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        verl_trainers.__getattr__("nothing")


def test_driver_reads_the_workers_metrics_under_verls_actor_prefix() -> None:
    stats = verl_guard.driver_stats(
        {"actor/rlguard/nonfinite": 0.5, "actor/rlguard/kl_old": 0.1, "actor/ppo_kl": 0.3, "actor/grad_norm": 2.0}
    )
    # rlguard's k3 kl_old wins over verl's k1 actor/ppo_kl, as in the doctor's table
    assert stats == {"nonfinite": 0.5, "kl_old": 0.1, "grad_norm": 2.0}


class FakeV1Trainer(FakeTrainer):
    """verl 0.9.1's default V1 trainer (trainer/ppo/v1/trainer_base.py): ``fit(agent_loop_manager)`` stores its
    logger as ``self.logger`` from the ``Tracking`` name imported with the module, then calls ``on_train_begin``."""

    def __init__(self, config: Any, steps: list[dict[str, float]]) -> None:
        import verl.utils.tracking as tracking

        super().__init__(config, steps)
        self.tracking = tracking.Tracking  # bound before fit, as trainer_base's module-level import

    def on_train_begin(self) -> None:
        self.began = True

    def fit(self, agent_loop_manager: Any) -> None:  # type: ignore[override]
        self.logger = self.tracking(project_name="p", experiment_name="e", default_backend=[])
        self.global_steps += 1
        self.on_train_begin()
        while self.global_steps <= len(self.steps):
            step = self.global_steps
            self.actor_rollout_wg.version = step
            self.ran.append(step)
            if self.config.trainer.save_freq > 0 and step % self.config.trainer.save_freq == 0:
                self._save_checkpoint()
            self.logger.log(data={**self.steps[step - 1], "training/global_step": step}, step=step)
            self.global_steps += 1


def test_v1_trainer_rolls_back_and_halts_through_its_logger(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    config = trainer_config(tmp_path, save_freq=1)
    with open_dict(config):  # what hydra's +trainer.rlguard_guard=strict does
        config.trainer.rlguard_guard = "strict"
    trainer = guarded_trainer_class(FakeV1Trainer)(config, poisoned_run(5, 20))
    assert trainer.rlguard.guard.config.snapshot_interval == 5  # the strict preset
    trainer.fit(agent_loop_manager=None)
    assert trainer.began and trainer.shut_down  # the parent's hook ran; fit returned on halt
    loads = [arg for name, arg in trainer.actor_rollout_wg.calls if name == "load_checkpoint"]
    assert loads and loads[0] == str(trainer.rlguard.step_folder(5) / "actor")
    assert logged[-1][1]["rlguard/guard/halted"] == 1.0 and logged[-1][0] == trainer.ran[-1] < 25
    assert [step for step, _ in logged] == trainer.ran  # one record, and one observation, per step


def _v1_registry() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl's imports: Ray's deprecated state API, engines that are not installed
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    return TRAINER_REGISTRY


def test_guarded_v1_trainer_runs_as_verls_sync_trainer(tmp_path: Path) -> None:
    """Registered under its own name (how verl's task runner selects it), the guarded trainer gives verl back the
    "sync" mode before verl reads it: verl takes its asynchronous paths for any mode other than "sync"."""
    registry = _v1_registry()
    cls = verl_trainers.register_v1_trainer("rlguard_test_sync")
    try:
        assert registry["rlguard_test_sync"] is cls and cls.__name__ == "GuardedPPOTrainerSync"
        assert verl_trainers.register_v1_trainer("rlguard_test_sync") is cls  # idempotent
        assert verl_guard.v1_mode(cls) == "sync" and verl_guard.v1_mode(registry["sync"]) == "sync"
        config = trainer_config(tmp_path)
        with open_dict(config):
            config.trainer.v1 = {"trainer_mode": "rlguard_test_sync"}
        verl_trainers._keep_v1_mode(cls, config)
        assert config.trainer.v1.trainer_mode == "sync"
    finally:
        registry.pop("rlguard_test_sync", None)
    with pytest.raises(ValueError, match="would replace verl's own 'sync' trainer"):
        verl_trainers.register_v1_trainer("sync")
    assert verl_guard.v1_mode(FakeTrainer) is None  # not a V1 trainer: nothing to restore


def test_the_guard_setting_imports_a_factory() -> None:
    assert resolve_guard_setting("strict") == "strict"
    config = resolve_guard_setting("rlguard.guards:GuardConfig")
    assert isinstance(config, GuardConfig)
    with pytest.raises(ValueError, match=r"'no_such_module:f' names no importable callable.*module:factory"):
        resolve_guard_setting("no_such_module:f")
    with pytest.raises(ValueError, match=r"'os:getcwd' returned '.*'; expected a GuardConfig or a Guard"):
        resolve_guard_setting("os:getcwd")


def test_guard_from_spec_is_a_deprecated_name_of_resolve_guard_setting() -> None:
    with pytest.warns(DeprecationWarning, match=r"driver\.guard_from_spec is deprecated: use .*resolve_guard_setting"):
        from rlguard.adapters.verl.driver import guard_from_spec
    assert guard_from_spec is resolve_guard_setting
    with pytest.raises(AttributeError, match="has no attribute 'guard_from_specs'"):
        verl_guard.guard_from_specs  # noqa: B018  # any other name is still an error


def test_legacy_task_runner_builds_the_class_bound_in_its_own_globals() -> None:
    """verl's legacy ``TaskRunner.run`` looks ``RayPPOTrainer`` up in the globals it was shipped with (a copy when Ray
    pickles the class by value): the binding goes there."""
    import cloudpickle

    from rlguard.adapters.verl.compat import bind_legacy_trainer, task_runner_class

    _v1_registry()  # imports verl's trainers with their import-time warnings silenced
    import verl.trainer.main_ppo_v0 as v0

    runner_cls = task_runner_class(v0.TaskRunner)
    assert issubclass(runner_cls, v0.BaseTaskRunner) and callable(runner_cls.run)
    run = inspect.unwrap(runner_cls.run)  # Ray wraps actor methods
    # a by-value copy of run, as Ray ships a class it cannot import by name: its globals are not the module's
    cloudpickle.register_pickle_by_value(v0)
    try:
        shipped = cloudpickle.loads(cloudpickle.dumps(run))
    finally:
        cloudpickle.unregister_pickle_by_value(v0)
    assert shipped.__globals__ is not vars(v0)

    class Marker:
        pass

    bind_legacy_trainer(shipped, Marker)
    assert shipped.__globals__["RayPPOTrainer"] is Marker
    assert v0.RayPPOTrainer is not Marker  # rebinding the module would have been the no-op of the old code

    def run(self: Any, config: Any) -> None:  # type: ignore[no-redef]
        return None

    with pytest.raises(RuntimeError, match="no longer builds its trainer as the global RayPPOTrainer"):
        bind_legacy_trainer(run, Marker)
    with pytest.raises(RuntimeError, match="cannot find the class behind Ray actor"):
        task_runner_class(object())


# -- the guard's mismatch remedies in verl ------------------------------------------------------------------
def test_the_driver_offers_kept_gradient_where_the_objective_zeroes_gradients(tmp_path: Path) -> None:
    """``kept_gradient`` is a driver capability for ``rlguard.grpo``, not for ``rlguard.cispo``; a rollout
    correction only through verl's ``algorithm.rollout_correction`` (tests/adapters/verl/test_rollout_correction.py)."""
    for mode, expected in (("rlguard.grpo", True), ("rlguard.cispo", False)):
        config = trainer_config(tmp_path)
        config.actor_rollout_ref.actor.policy_loss.loss_mode = mode
        driver = verl_guard.VerlGuardDriver(FakeTrainer(config, []), ScriptedGuard({}))
        assert ("kept_gradient" in driver.capabilities) is expected
