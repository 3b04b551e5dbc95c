"""A stand-in for verl's one-step-off trainer (``OneStepOffRayTrainer``): its ``fit`` and ``fit_step`` are
coroutines in verl's order (``one_step_off_policy/ray_trainer.py``): the batch of step ``N+1`` is generated while
step ``N`` trains, from the weights the rollout held when it started; weights go to the rollout at the start of
each step (``_fit_update_weights``). Each batch records the weights version it was generated from; the step passes
it, as verl's ``DataProto``, through ``_fit_compute_log_prob`` (pi_old; in bypass mode verl's sets it to the engine's
log-probs) to the actor's update, which keeps it (``actor_batches``)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.helpers.verl_stand_in import FakeCheckpointManager, FakeTrainer, FakeWorkerGroup


class FakeRolloutCheckpointManager(FakeCheckpointManager):
    """verl's ``CheckpointEngineManager``: ``update_weights`` gives the rollout the actor's weights version."""

    def __init__(self, actor: FakeWorkerGroup) -> None:
        super().__init__(actor.calls)
        self.actor = actor
        self.rollout_version = 0

    def update_weights(self, global_steps: int) -> None:
        super().update_weights(global_steps)
        self.rollout_version = self.actor.version


class FakeOneStepOffTrainer(FakeTrainer):
    """``fit``/``fit_step`` as verl's one-step-off trainer; ``trained_on[step]`` is the weights version of the
    rollout that generated the batch step ``step`` trained on."""

    def __init__(self, config: Any, steps: list[dict[str, float]]) -> None:
        super().__init__(config, steps)
        self.rollout = FakeRolloutCheckpointManager(self.actor_rollout_wg)
        self.checkpoint_manager = self.rollout
        self.trained_on: dict[int, int] = {}
        self.actor_batches: dict[int, Any] = {}  # step -> the DataProto its actor update was sent
        self.is_last_step = False

    async def _async_gen_next_batch(self, continuous_iterator: Any) -> Any:
        version = self.rollout.rollout_version  # the weights the generation starts with
        await asyncio.sleep(0)
        return {}, {}, 0, [version] * 4, None

    async def fit(self) -> None:  # type: ignore[override]  # verl's one-step-off fit is a coroutine
        from verl.utils.tracking import Tracking

        self.logger = Tracking(project_name="p", experiment_name="e", default_backend=[])
        self._load_checkpoint()
        self.checkpoint_manager.update_weights(self.global_steps)
        self.global_steps += 1
        iterator = iter(range(1000))
        future: Any = asyncio.create_task(self._async_gen_next_batch(iterator))
        while future is not None:
            future = await self.fit_step(future, iterator)
            if self.is_last_step:
                return

    async def fit_step(self, batch_data_future: Any, continuous_iterator: Any) -> Any:
        step = self.global_steps
        self.is_last_step = step >= len(self.steps)
        batch = (await batch_data_future)[3]
        self.checkpoint_manager.update_weights(step)  # _fit_update_weights
        future = None if self.is_last_step else asyncio.create_task(self._async_gen_next_batch(continuous_iterator))
        await asyncio.sleep(0)
        self.trained_on[step] = batch[0]
        self.actor_batches[step] = self._fit_compute_log_prob(_data_proto(batch))
        self.actor_rollout_wg.version = step  # this step's update
        self.ran.append(step)
        if self.config.trainer.save_freq > 0 and step % self.config.trainer.save_freq == 0:
            self._save_checkpoint()
        self.metrics = {**self.steps[step - 1], "training/global_step": step}
        self._fit_postprocess_step()
        return future

    def _fit_compute_log_prob(self, batch: Any) -> Any:
        return batch

    def _fit_postprocess_step(self) -> None:
        self.logger.log(data=self.metrics, step=self.global_steps)
        self.global_steps += 1


def _data_proto(versions: list[int]) -> Any:
    """verl's ``DataProto`` of one row per sample (``versions``: the weights version of each)."""
    import torch
    from verl import DataProto

    return DataProto.from_dict(tensors={"versions": torch.tensor(versions)})
