"""The overrides of verl's asynchronous trainers on the CPU harness (rlguard.verl_cpu) with the tiny example: the
helper of test_verl_async.py; launches go through verl_main_ppo_run.launch."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # verl imports ray.experimental.state, deprecated by Ray
    from rlguard.verl_cpu.checkpoint_engine import cpu_checkpoint_overrides

__all__ = ["FULLY_ASYNC", "ONE_STEP_OFF"]

#: verl's one-step-off trainer on CPU: the rollout in its own pool (one logical GPU beside the trainer's one), weight
#: sync through the CPU checkpoint engine; verl's own asserts want no hybrid engine and the async rollout mode
ONE_STEP_OFF = [
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.mode=async",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=1",
    "++ray_kwargs.ray_init.num_gpus=2",  # the trainer's pool and the rollout's
    "ray_kwargs.ray_init.num_cpus=64",  # logical: verl's task runner asks for 10
    *cpu_checkpoint_overrides(),
]

#: verl's fully async trainer on CPU: as above, plus what its rollouter asserts (no trainer batch size, one prompt per
#: generation batch) and a short run: 8 rollout steps, a weight sync after every trainer step, half a batch of slack
FULLY_ASYNC = [
    *ONE_STEP_OFF,
    "data.train_batch_size=0",
    "data.gen_batch_size=1",
    "rollout.total_rollout_steps=8",
    "async_training.trigger_parameter_sync_step=1",
    "async_training.staleness_threshold=0.5",
]
