"""``rlguard.adapters.verl.guarded`` and ``.driver``: the guarded policy loss against verl's own, and the driver on
a stand-in trainer.

Loss: float64 inputs through verl's registry (``rlguard.gspo`` under ``GuardedPolicyLossConfig``); references are
verl's own ``gspo`` (equal to ``rlguard.gspo`` for per-sequence advantages, tests/test_adapters_verl.py) on the
data with the poisoned rows masked, or with the clip ratios changed.

Driver: verl's Ray trainer cannot be built here (no GPU, no rollout engine; verl 0.9.1's ``ray_trainer`` also
needs ``cachetools``, absent from this environment). :func:`guarded_trainer_class` is applied to ``FakeTrainer``,
whose ``fit``, ``_save_checkpoint`` and ``_load_checkpoint`` follow verl's (same folder layout, same local import
of ``verl.utils.tracking.Tracking`` in ``fit``), with stand-in worker groups that record the calls.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import math
import os
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="the verl adapter needs verl (pip install 'rlguard[verl]')")

from omegaconf import open_dict  # after the skip: verl brings omegaconf
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

from rlguard.adapters.verl import GuardedPolicyLossConfig, RLGuardPolicyLossConfig, guarded_trainer_class
from rlguard.adapters.verl import driver as verl_guard
from rlguard.adapters.verl import trainers as verl_trainers
from rlguard.guards import GuardConfig

B, T = 4, 6
GLOBAL = {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": 8, "loss_scale_factor": None}
GUARDED_TARGET = "rlguard.adapters.verl.GuardedPolicyLossConfig"


def actor(policy_loss: Any = None, **overrides: Any) -> ActorConfig:
    values: dict[str, Any] = {
        "strategy": "fsdp",
        "rollout_n": 1,
        "ppo_micro_batch_size_per_gpu": 1,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "loss_agg_mode": "seq-mean-token-mean",
        **overrides,
    }
    if policy_loss is not None:
        values["policy_loss"] = policy_loss
    config = ActorConfig(**values)
    config.global_batch_info.update(GLOBAL)
    return config


def guarded(**kwargs: Any) -> ActorConfig:
    return actor(GuardedPolicyLossConfig(loss_mode="rlguard.gspo", **kwargs))


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    """Per-sequence advantages; sequence log-ratios 0.18, -0.15, 0.25, -0.2 (plus noise) put rows 0 and 3
    inside verl's clip range [0.8, 1.28] and outside the halved one [0.9, 1.14]."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    offset = torch.tensor([0.18, -0.15, 0.25, -0.2], dtype=torch.float64).unsqueeze(1)
    log_prob = (old + offset + 0.01 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    lengths = torch.tensor([6, 4, 5, 3])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    adv = torch.tensor([1.0, -0.5, 0.8, -1.2], dtype=torch.float64).unsqueeze(1).expand(B, T) * mask
    return {"old_log_prob": old, "log_prob": log_prob, "advantages": adv.clone(), "response_mask": mask}


def run(
    mode: str, data: dict[str, torch.Tensor], config: ActorConfig
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    log_prob = data["log_prob"].detach().clone().requires_grad_()
    fn = core_algos.get_policy_loss_fn(mode)
    loss, metrics = fn(
        **{**data, "log_prob": log_prob}, loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=None
    )
    loss.backward()
    assert log_prob.grad is not None
    return loss.detach(), log_prob.grad, metrics


def poison(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Row 1: NaN advantages (a NaN score); row 2: one Inf old log-prob."""
    bad = {key: value.detach().clone() for key, value in data.items()}
    bad["advantages"][1] = float("nan")
    bad["old_log_prob"][2, 1] = float("inf")
    return bad


# -- the guarded loss -------------------------------------------------------------------------------------


def test_poisoned_sequences_are_masked_as_verl_would_without_them() -> None:
    clean = inputs()
    rows = torch.tensor([True, False, False, True])
    without = {**clean, "response_mask": clean["response_mask"] & rows.unsqueeze(1)}
    loss, grad, metrics = run("rlguard.gspo", poison(clean), guarded(max_poisoned_frac=1.0))
    ref_loss, ref_grad, _ = run("gspo", without, actor())  # verl's own GSPO on the rows left
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=0)
    assert torch.isfinite(grad).all() and not grad[1:3].any()
    assert ref_grad[0].abs().sum() > 0 and math.isfinite(loss.item())
    # 4 NaN advantages in row 1 (its length) + 1 Inf old log-prob; 2 of 4 sequences; their 9 of 18 tokens
    assert metrics["rlguard/nonfinite"] == 5.0
    assert metrics["rlguard/guard/poisoned_seqs"] == 2.0
    assert metrics["rlguard/guard/skipped"] == 0.0
    assert metrics["rlguard/masked_frac"] == pytest.approx(9 / 18)


def test_poisoned_fraction_over_threshold_gives_zero_loss_and_gradient() -> None:
    loss, grad, metrics = run("rlguard.gspo", poison(inputs()), guarded(max_poisoned_frac=0.25))
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    assert metrics["rlguard/guard/skipped"] == 1.0 and metrics["rlguard/guard/poisoned_seqs"] == 2.0


def test_skip_from_the_driver_zeroes_a_clean_micro_batch() -> None:
    _, clean_grad, _ = run("rlguard.gspo", inputs(), guarded())
    loss, grad, metrics = run("rlguard.gspo", inputs(), guarded(skip=True))
    assert clean_grad.abs().sum() > 0
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad)) and metrics["rlguard/guard/skipped"] == 1.0


def test_zero_loss_of_a_skip_stays_finite_with_nan_current_log_probs() -> None:
    data = inputs()
    data["log_prob"] = data["log_prob"].detach().clone()
    data["log_prob"][0, 0] = float("nan")
    loss, grad, _ = run("rlguard.gspo", data, guarded(skip=True))
    assert loss.item() == 0.0 and torch.isfinite(grad).all()


@pytest.mark.parametrize(
    ("controls", "low", "high"),
    [
        ({"clip_scale": 0.5}, 0.1, 0.14),
        ({"clip_low": 0.1, "clip_high": 0.2}, 0.1, 0.2),
        ({"clip_low": 0.1, "clip_high": 0.2, "clip_scale": 0.5}, 0.05, 0.1),
    ],
)
def test_clip_controls_set_verls_clip_range(controls: dict[str, float], low: float, high: float) -> None:
    loss, grad, metrics = run("rlguard.gspo", inputs(), guarded(controls=controls))
    ref_loss, ref_grad, ref_metrics = run("gspo", inputs(), actor(clip_ratio_low=low, clip_ratio_high=high))
    _, wide_grad, _ = run("gspo", inputs(), actor())
    torch.testing.assert_close((loss, grad), (ref_loss, ref_grad), rtol=1e-12, atol=0)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(ref_metrics["actor/pg_clipfrac"])
    assert not torch.allclose(grad, wide_grad)  # the range matters on these data
    assert metrics["rlguard/guard/clip_scale"] == controls.get("clip_scale", 1.0)
    assert (metrics["rlguard/guard/clip_low"], metrics["rlguard/guard/clip_high"]) == pytest.approx((low, high))


def test_clip_scale_also_scales_clip_values_in_objective_kwargs() -> None:
    scaled = guarded(objective_kwargs={"clip_low": 0.2, "clip_high": 0.3}, controls={"clip_scale": 0.5})
    direct = actor(
        RLGuardPolicyLossConfig(loss_mode="rlguard.gspo", objective_kwargs={"clip_low": 0.1, "clip_high": 0.15})
    )
    torch.testing.assert_close(run("rlguard.gspo", inputs(), scaled)[:2], run("rlguard.gspo", inputs(), direct)[:2])


def test_the_plain_config_stays_unguarded() -> None:
    plain = actor(RLGuardPolicyLossConfig(loss_mode="rlguard.gspo"))
    with pytest.raises(ValueError, match="advantages contains 4 NaN values"):
        run("rlguard.gspo", poison(inputs()), plain)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_poisoned_frac": 1.5}, r"max_poisoned_frac must be in \[0, 1\].*1\.5"),
        ({"controls": {"clip_scale": 0.0}}, r"clip_scale must be a finite number > 0; got 0\.0"),
        ({"controls": {"clip_low": -0.1}}, r"clip_low must be None or a finite number >= 0; got -0\.1"),
        ({"controls": {"temperature": 1.0}}, r"controls: unknown \['temperature'\]"),
    ],
)
def test_guarded_config_rejects(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GuardedPolicyLossConfig(loss_mode="rlguard.gspo", **kwargs)


# -- the driver on a stand-in trainer ---------------------------------------------------------------------


@functools.cache
def _composed() -> Any:
    """verl's ppo_trainer.yaml with the guarded loss, as a user's command line would set it (composed once)."""
    import verl
    from hydra import compose, initialize_config_dir

    overrides = [
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo",
        f"actor_rollout_ref.actor.policy_loss._target_={GUARDED_TARGET}",
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def trainer_config(tmp_path: Path, **trainer: Any) -> Any:
    """A copy of the composed config with ``trainer.<key>=<value>`` and checkpoints under ``tmp_path``."""
    config = copy.deepcopy(_composed())
    config.trainer.default_local_dir = str(tmp_path / "ckpt")
    for key, value in trainer.items():
        config.trainer[key] = value
    return config


class FakeWorkerGroup:
    """Records the calls the driver makes; a checkpoint holds the "weights version" current when saved."""

    def __init__(self) -> None:
        self.version = 0
        self.calls: list[tuple[str, Any]] = []
        self.loss_fns: list[Any] = []

    def save_checkpoint(self, local_path: str, hdfs_path: Any = None, global_step: int = 0, **kwargs: Any) -> None:
        Path(local_path).mkdir(parents=True, exist_ok=True)
        (Path(local_path) / "weights.txt").write_text(str(self.version))

    def load_checkpoint(self, local_path: str, hdfs_path: Any = None, del_local_after_load: bool = False) -> None:
        self.calls.append(("load_checkpoint", local_path))
        self.version = int((Path(local_path) / "weights.txt").read_text())

    def set_loss_fn(self, loss_fn: Any) -> None:
        self.calls.append(("set_loss_fn", loss_fn))
        self.loss_fns.append(loss_fn)


class FakeCheckpointManager:
    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls

    def sleep_replicas(self) -> None:
        self.calls.append(("sleep_replicas", None))

    def update_weights(self, global_steps: int) -> None:
        self.calls.append(("update_weights", global_steps))


class FakeTrainer:
    """The parts of verl's RayPPOTrainer the guard touches, in verl's order (ray_trainer.py, ``fit``)."""

    def __init__(self, config: Any, steps: list[dict[str, float]]) -> None:
        self.config = config
        self.steps = steps
        self.global_steps = 0
        self.use_critic = False
        self.actor_rollout_wg = FakeWorkerGroup()
        self.checkpoint_manager = FakeCheckpointManager(self.actor_rollout_wg.calls)
        self.ran: list[int] = []
        self.shut_down = False

    def fit(self) -> None:
        from verl.utils.tracking import Tracking  # as verl's fit: the name is looked up when fit starts

        logger = Tracking(project_name="p", experiment_name="e", default_backend=[])
        self._load_checkpoint()
        logger.log(data={"val-core/acc": 0.0}, step=self.global_steps)  # val_before_train
        self.global_steps += 1
        while self.global_steps <= len(self.steps):
            step = self.global_steps
            self.actor_rollout_wg.version = step  # the update of this step
            self.ran.append(step)
            if self.config.trainer.save_freq > 0 and step % self.config.trainer.save_freq == 0:
                self._save_checkpoint()
            logger.log(data={**self.steps[step - 1], "training/global_step": step}, step=step)
            self.global_steps += 1

    def _save_checkpoint(self) -> None:
        folder = Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}"
        self.actor_rollout_wg.save_checkpoint(str(folder / "actor"), None, self.global_steps)
        (Path(self.config.trainer.default_local_dir) / "latest_checkpointed_iteration.txt").write_text(
            str(self.global_steps)
        )

    def _load_checkpoint(self) -> int:
        latest = Path(self.config.trainer.default_local_dir) / "latest_checkpointed_iteration.txt"
        if self.config.trainer.resume_mode == "disable" or not latest.exists():
            return 0
        self.global_steps = int(latest.read_text())
        folder = Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}"
        self.actor_rollout_wg.load_checkpoint(str(folder / "actor"))
        return 0

    def _shutdown_dump_executor(self) -> None:
        self.shut_down = True


Trainer = guarded_trainer_class(FakeTrainer)


def healthy(step: int, **changes: float) -> dict[str, float]:
    wiggle = 0.01 * ((step * 7) % 5)
    return {
        "actor/pg_loss": -0.1 + wiggle,
        "actor/grad_norm": 1.0 + wiggle,
        "actor/entropy": 2.0 + wiggle,
        "critic/score/mean": 0.5 + wiggle,
        "response_length/mean": 100.0 + step % 3,
        "actor/rlguard/kl_old": 0.01,  # the workers' rlguard/kl_old after verl's rename_dict(..., "actor/")
        "actor/rlguard/nonfinite": 0.0,
        **changes,
    }


def poisoned_run(n_healthy: int, n_poisoned: int) -> list[dict[str, float]]:
    return [healthy(s) for s in range(1, n_healthy + 1)] + [
        healthy(s, **{"actor/rlguard/nonfinite": 1.0}) for s in range(n_healthy + 1, n_healthy + n_poisoned + 1)
    ]


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, dict[str, Any]]]:
    """What verl's loggers receive (the guard's subclass wraps whatever Tracking is when fit starts)."""
    import verl.utils.tracking as tracking

    records: list[tuple[int, dict[str, Any]]] = []

    class Recording(tracking.Tracking):
        def log(self, data: dict[str, Any], step: int, backend: Any = None) -> None:
            records.append((step, dict(data)))

    monkeypatch.setattr(tracking, "Tracking", Recording)
    return records


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


def test_guard_from_spec_imports_a_factory() -> None:
    assert verl_guard.guard_from_spec("strict") == "strict"
    config = verl_guard.guard_from_spec("rlguard.guards:GuardConfig")
    assert isinstance(config, GuardConfig)
    with pytest.raises(ValueError, match=r"'no_such_module:f' names no importable callable.*module:factory"):
        verl_guard.guard_from_spec("no_such_module:f")
    with pytest.raises(ValueError, match=r"'os:getcwd' returned '.*'; expected a GuardConfig or a Guard"):
        verl_guard.guard_from_spec("os:getcwd")


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

    def run(self: Any, config: Any) -> None:
        return None

    with pytest.raises(RuntimeError, match="no longer builds its trainer as the global RayPPOTrainer"):
        bind_legacy_trainer(run, Marker)
    with pytest.raises(RuntimeError, match="cannot find the class behind Ray actor"):
        task_runner_class(object())


# -- the guard's mismatch remedies in verl ------------------------------------------------------------------
def test_kept_gradient_remedy_is_verls_own_cispo_at_the_same_upper_bound() -> None:
    """The driver's kept_gradient control on ``rlguard.grpo`` (verl's clip 0.2 / 0.28) gives verl's own ``cispo``
    loss with no lower bound (``clip_ratio_low=1``) and the same upper one: loss and gradient."""
    data = inputs(1)
    grpo = lambda **kw: actor(GuardedPolicyLossConfig(loss_mode="rlguard.grpo", **kw))  # noqa: E731
    plain, _, _ = run("rlguard.grpo", data, grpo())
    loss, grad, _ = run("rlguard.grpo", data, grpo(controls={"kept_gradient": True}))
    ref_loss, ref_grad, _ = run("cispo", data, actor(clip_ratio_low=1.0))
    assert not torch.allclose(plain, ref_loss), "degenerate case: the hard clip must bind somewhere"
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=0)


def test_the_driver_offers_kept_gradient_where_the_objective_zeroes_gradients(tmp_path: Path) -> None:
    """``kept_gradient`` is a driver capability for ``rlguard.grpo``, not for ``rlguard.cispo``; a rollout
    correction only through verl's ``algorithm.rollout_correction`` (tests/test_verl_rollout_correction.py)."""
    from test_actuators import ScriptedGuard

    for mode, expected in (("rlguard.grpo", True), ("rlguard.cispo", False)):
        config = trainer_config(tmp_path)
        config.actor_rollout_ref.actor.policy_loss.loss_mode = mode
        driver = verl_guard.VerlGuardDriver(FakeTrainer(config, []), ScriptedGuard({}))
        assert ("kept_gradient" in driver.capabilities) is expected
