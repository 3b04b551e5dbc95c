"""A stand-in for verl's fully async trainer (``FullyAsyncTrainer``), its rollouter and message queue, in verl's
order (``fully_async_policy/fully_async_trainer.py``, ``fit`` and ``fit_step``): the trainer takes samples from the
queue, updates, advances its parameter version, publishes the weights to the rollouter (``_fit_update_weights``,
which resets the rollouter's staleness), logs the cycle's aggregate (verl's ``MetricsAggregator``, before adding the
step's own metrics, as verl does) and saves checkpoints numbered by version.

The rollouter keeps ``lookahead`` samples queued: each time the trainer takes one it generates another with the
weights it holds, so samples arrive up to ``lookahead`` samples old, as verl's staleness budget allows (one sample per
version: verl's ``staleness_threshold`` is the lookahead, which ``set_max_required_samples`` derives again, as verl
does). Each sample carries the parameter version it was tagged with (``min/max_global_steps``) and the identity of
the weights that generated it (``weights``), so a test can tell a republished version from a trained one. Where pi_old
is recomputed, its gap to the rollout's log-probs grows by ``DRIFT`` per version of age."""

from __future__ import annotations

import pickle
import warnings
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from tests.helpers.verl_stand_in import FakeWorkerGroup

TRAJECTORIES = 4  # per sample (a prompt's responses)
RESPONSE = 3  # tokens per trajectory
ENGINE_GAP, DRIFT = 0.01, 0.1  # |log pi_old - log p_rollout| per token: the engine's, and per version of age


class TrainingStop(Exception):
    """verl's ``TrainingStopException``: the queue's end signal."""


class FakeRollouter:
    """Holds the weights verl's checkpoint manager last published and fills the queue with their samples."""

    def __init__(self, lookahead: int, limit: int) -> None:
        self.limit = limit  # samples it generates in all (verl's rollout.total_rollout_steps), then the end signal
        self.generated = 0
        self.version = 0  # the parameter version it was last given
        self.weights = 0  # the identity of those weights
        self.lookahead = lookahead
        self.staleness_threshold = float(lookahead)
        self.queue: deque[bytes | None] = deque()
        self.reset_calls = 0

    async def set_max_required_samples(self) -> None:
        """verl's derivation of the budget from ``staleness_threshold``: here, the samples queued ahead."""
        self.lookahead = int(self.staleness_threshold)
        self.max_required_samples = self.lookahead + 1

    def generate(self) -> bytes | None:
        if self.generated == self.limit:
            return None
        self.generated += 1
        versions = np.array([self.version] * TRAJECTORIES)
        batch = SimpleNamespace(
            non_tensor_batch={"min_global_steps": versions, "max_global_steps": versions.copy()}, weights=self.weights
        )
        return pickle.dumps(SimpleNamespace(full_batch=batch))

    async def reset_staleness(self) -> dict[str, float]:
        self.reset_calls += 1
        return {}


class FakeQueueClient:
    """verl's ``MessageQueueClient``: ``get_sample`` returns ``(sample, queue length)``."""

    def __init__(self, rollouter: FakeRollouter) -> None:
        self.rollouter = rollouter

    async def get_sample(self) -> tuple[bytes | None, int]:
        rollout = self.rollouter
        while len(rollout.queue) <= rollout.lookahead and (not rollout.queue or rollout.queue[-1] is not None):
            rollout.queue.append(rollout.generate())
        sample = rollout.queue[0] if rollout.queue[0] is None else rollout.queue.popleft()  # the end signal stays
        return sample, len(rollout.queue)

    def get_queue_size_sync(self) -> int:
        return len(self.rollouter.queue)


class FakeCheckpointManager:
    """verl's ``CheckpointEngineManager``: publishes the actor's weights to the rollouter as a version."""

    def __init__(self, actor: FakeWorkerGroup, rollouter: FakeRollouter) -> None:
        self.actor = actor
        self.rollouter = rollouter
        self.published: list[tuple[int, int]] = []  # (version, weights)

    async def update_weights(self, global_steps: int) -> dict[str, Any]:
        self.rollouter.version, self.rollouter.weights = global_steps, self.actor.version
        self.published.append((global_steps, self.actor.version))
        return {}


class FakeFullyAsyncTrainer:
    """``fit``/``fit_step`` and the checkpoint methods of verl's ``FullyAsyncTrainer`` (``sync_every`` steps per sync
    cycle, verl's ``trigger_parameter_sync_step``; one sample per step); ``trained_on[step]`` lists the weights that
    generated the samples step ``step`` trained on and the versions they were tagged with."""

    def __init__(
        self,
        config: Any,
        steps: list[dict[str, float]],
        lookahead: int = 2,
        sync_every: int = 1,
        rollouter_class: type = FakeRollouter,
    ) -> None:
        from verl.utils.tracking import Tracking

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # verl's imports warn about Ray's state API and engines not installed
            from verl.experimental.fully_async_policy.detach_utils import MetricsAggregator

        self.config = config
        self.steps = steps
        self.global_steps = 0
        self.current_param_version = 0
        self.last_ckpt_version = 0
        self.use_critic = False
        self.metrics: dict[str, Any] = {}
        self.metrics_aggregator = MetricsAggregator(total_gpus=1)
        self.logger = Tracking(project_name="p", experiment_name="e", default_backend=[])
        self.actor_rollout_wg = FakeWorkerGroup()
        self.rollouter = rollouter_class(lookahead, limit=3 * len(steps) + lookahead)
        self.checkpoint_manager = FakeCheckpointManager(self.actor_rollout_wg, self.rollouter)
        self.message_queue_client: Any = None
        self.trained_on: dict[int, tuple[list[int], list[int]]] = {}
        self.shut_down = False
        self._weights = 0  # identities of trained weights
        self.trigger_parameter_sync_step = sync_every
        self.local_trigger_step = 1

    def set_message_queue_client(self, message_queue_client: Any) -> None:
        self.message_queue_client = message_queue_client

    async def set_rollouter(self, rollouter: Any) -> None:
        self.rollouter = rollouter

    async def fit(self) -> None:
        self.global_steps += 1
        while True:
            try:
                await self.fit_step()
            except TrainingStop:
                break

    async def fit_step(self, batch_dict: Any = None) -> None:
        self.metrics = {"training/global_step": self.global_steps}
        batch = await self._fit_generate(None)
        batch = self._fit_compute_log_prob(batch)
        self.trained_on[self.global_steps] = (batch.weights, list(batch.non_tensor_batch["max_global_steps"]))
        self._weights += 1
        self.actor_rollout_wg.version = 100 + self._weights  # this step's update (never a version number)
        self.metrics.update(self.steps[self.global_steps - 1])
        self._fit_update_local_step()
        timing = await self._fit_update_weights()
        self._fit_save_checkpoint()
        if timing is not None:
            self._fit_log_aggregated_training_metrics(timing)
        self._fit_postprocess_step()

    def _fit_update_local_step(self) -> None:
        if self.local_trigger_step < self.trigger_parameter_sync_step:
            self.local_trigger_step += 1
        else:
            self.current_param_version += 1
            self.local_trigger_step = 1

    async def _fit_generate(self, batch: Any = None) -> Any:
        if self.global_steps > len(self.steps):
            raise TrainingStop
        data, _ = await self.message_queue_client.get_sample()
        if data is None:
            raise TrainingStop
        sample = pickle.loads(data)
        return SimpleNamespace(
            non_tensor_batch={"max_global_steps": sample.full_batch.non_tensor_batch["max_global_steps"]},
            weights=[sample.full_batch.weights] * TRAJECTORIES,
        )

    def _fit_compute_log_prob(self, batch: Any) -> Any:
        """pi_old recomputed at the trainer's version (verl's default): its gap to the engine grows with age."""
        import torch

        ages = self.current_param_version - torch.tensor([int(v) for v in batch.non_tensor_batch["max_global_steps"]])
        rollout = torch.full((len(ages), RESPONSE), -1.0)
        old = rollout - ENGINE_GAP - DRIFT * ages.to(torch.float32)[:, None]
        batch.batch = {"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": torch.ones_like(rollout)}
        return batch

    async def _fit_update_weights(self) -> dict[str, Any] | None:
        if self.local_trigger_step != 1:
            return None  # weights go to the rollouter once per sync cycle
        await self.checkpoint_manager.update_weights(global_steps=self.current_param_version)
        return await self.rollouter.reset_staleness()

    def _fit_log_aggregated_training_metrics(self, rollout_reset_timing_raw: dict[str, Any]) -> None:
        aggregated = self.metrics_aggregator.get_aggregated_metrics()
        if aggregated:
            self.logger.log(data=aggregated, step=self.current_param_version)
        self.metrics_aggregator.reset()

    def _fit_postprocess_step(self) -> None:
        self.global_steps += 1
        self.metrics_aggregator.add_step_metrics(metrics=self.metrics, sample_count=1)

    def _fit_save_checkpoint(self) -> None:
        save_freq, version = self.config.trainer.save_freq, self.current_param_version
        if version != self.last_ckpt_version and save_freq > 0 and version % save_freq == 0:
            self._save_checkpoint()
            self.last_ckpt_version = version

    def _save_checkpoint(self) -> None:
        root = Path(self.config.trainer.default_local_dir)
        folder = root / f"global_step_{self.current_param_version}"
        self.actor_rollout_wg.save_checkpoint(str(folder / "actor"), None, self.current_param_version)
        (root / "latest_checkpointed_iteration.txt").write_text(str(self.current_param_version))

    def _load_checkpoint(self) -> None:
        raise AssertionError("the fully async trainer loads with load_checkpoint")

    async def load_checkpoint(self) -> int:
        latest = Path(self.config.trainer.default_local_dir) / "latest_checkpointed_iteration.txt"
        if self.config.trainer.resume_mode == "disable" or not latest.exists():
            return 0
        self.current_param_version = int(latest.read_text())
        self.global_steps = self.current_param_version + 1
        self.last_ckpt_version = self.current_param_version
        folder = Path(self.config.trainer.default_local_dir) / f"global_step_{self.current_param_version}"
        self.actor_rollout_wg.load_checkpoint(str(folder / "actor"))
        return self.current_param_version

    def _shutdown_dump_executor(self) -> None:
        self.shut_down = True


async def start(trainer: Any) -> None:
    """What verl's task runner does before ``fit``: the rollouter, the queue, a resume, the first weight push."""
    await trainer.set_rollouter(trainer.rollouter)
    trainer.set_message_queue_client(FakeQueueClient(trainer.rollouter))
    await trainer.load_checkpoint()
    await trainer._fit_update_weights()
    await trainer.fit()
