"""Stand-ins for verl's Ray trainer and its worker groups (verl's trainer cannot be built here: no GPU, no rollout
engine), whose ``fit``, ``_save_checkpoint`` and ``_load_checkpoint`` follow verl's (same folder layout, same local
import of ``verl.utils.tracking.Tracking`` in ``fit``); the composed ``ppo_trainer.yaml`` with the guarded loss; and
the per-step metrics verl's workers log. Nothing here imports verl until it is called."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

GUARDED_TARGET = "rlguard.adapters.verl.GuardedPolicyLossConfig"


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
