"""The guard in verl's fully async trainer (``verl.experimental.fully_async_policy``): a rollouter and a trainer,
each a Ray actor, joined by a message queue; the trainer publishes its weights to the rollouter as numbered
*parameter versions* (``current_param_version``, which also numbers verl's checkpoints and logged steps).

:func:`guarded_fully_async_trainer_class` adds the synchronous trainers' driver to ``FullyAsyncTrainer`` (one copy
of the decision executor: :class:`~rlguard.adapters.verl.driver.VerlGuardDriver`, here
:class:`FullyAsyncGuardDriver`), judging once per parameter version, on the trainer actor (verl's single controller
of the trainer's workers): every trainer rank receives the same controls and LR scale through verl's ``ONE_TO_ALL``
calls and loads the same checkpoint. What the pipeline needs beyond the synchronous driver:

- **One record per version.** verl aggregates the steps of a sync cycle (``MetricsAggregator``) and logs the
  aggregate before adding the cycle's last step, so each record holds the previous cycle's last step and the
  current cycle's first ones. The guarded trainer logs each cycle after its last step, at the version it produced,
  and judges that record.
- **Rollback** loads the checkpoint into the trainer's workers, publishes the restored weights to the rollouter as
  a *new* version (``v + 1`` after a rollback at ``v``: a sample's version then says which weights generated it),
  recounts the rollouter's staleness budget (verl's ``reset_staleness``) and saves the restored state as checkpoint
  ``v + 1``, all before the next batch is taken from the queue. Samples of the discarded versions (after the
  restored one, up to ``v``) are **dropped** when the trainer takes them from the queue (:class:`DroppingQueueClient`:
  any sample whose generation touched a discarded version, partial rollouts included), and counted
  (``rlguard/guard/dropped_samples``); samples of the restored version and older are kept (stale, not discarded).
- **The samples' age** in policy versions (:class:`PolicyVersions`: a republished version is the policy it
  restores) is logged as ``rlguard/staleness_mean``/``rlguard/staleness_max``.
- **Halt** raises :class:`FullyAsyncHalt` out of the trainer's ``fit`` after logging the step: verl's task runner
  cancels the rollouter and clears the queue, and the guarded task runner
  (:mod:`rlguard.adapters.verl.fully_async_main`) returns normally.
- **Resume** (verl's ``load_checkpoint``) restores the guard's state from the loaded version's folder.

Tested on stand-ins (tests/adapters/verl/test_fully_async.py) and end to end with Ray on CPU
(integration_tests/test_verl_async.py).
"""

from __future__ import annotations

import asyncio
import bisect
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rlguard.adapters.verl.async_trainers import AGE_KEYS, DROPPED_KEY
from rlguard.adapters.verl.compat import check_fully_async_trainer
from rlguard.adapters.verl.driver import _STEP_FOLDER, VerlGuardDriver, _step_of
from rlguard.adapters.verl.settings import resolve_guard_setting
from rlguard.guards import Decision, Guard, GuardConfig

__all__ = [
    "DroppingQueueClient",
    "FullyAsyncGuardDriver",
    "FullyAsyncHalt",
    "PolicyVersions",
    "check_standalone_rollout",
    "guarded_fully_async_trainer_class",
    "is_halt",
    "sample_versions",
]


class FullyAsyncHalt(Exception):
    """Raised out of the guarded trainer's ``fit`` when the guard halts (a plain message: it crosses Ray)."""


def is_halt(error: BaseException) -> bool:
    """Whether ``error`` is :class:`FullyAsyncHalt`, raised here or in a Ray actor (Ray's ``RayTaskError.cause``)."""
    return isinstance(error, FullyAsyncHalt) or isinstance(getattr(error, "cause", None), FullyAsyncHalt)


class PolicyVersions:
    """The policy behind each parameter version the trainer published, and the versions a rollback discarded.

    A training sync publishes version ``v`` one update after ``v - 1``; a rollback at ``v`` to version ``r`` discards
    ``r + 1 ... v`` and republishes ``r``'s weights as ``v + 1`` (the same policy as ``r``). ``start`` is the version
    the trainer starts from (a resume).
    """

    def __init__(self, start: int = 0) -> None:
        # (first version, its policy index): later versions up to the next breakpoint are one update each
        self._breaks: list[tuple[int, int]] = [(start, start)]
        self._discarded: list[tuple[int, int]] = []

    def policy(self, version: int) -> int:
        """The policy index of ``version`` (updates along the kept lineage; a version before ``start`` is itself)."""
        i = bisect.bisect_right(self._breaks, (version, float("inf"))) - 1
        if i < 0:
            return version
        first, index = self._breaks[i]
        return index + version - first

    def republish(self, version: int, restored: int) -> None:
        """``version`` holds ``restored``'s weights; ``restored + 1 ... version - 1`` are discarded."""
        if not restored < version:
            raise ValueError(f"republish(version={version}, restored={restored}): version must be after restored.")
        if restored + 1 <= version - 1:
            self._discarded.append((restored + 1, version - 1))
        self._breaks.append((version, self.policy(restored)))

    def discarded(self, first: int, last: int) -> bool:
        """Whether any version in ``first ... last`` (one sample's generation, a partial rollout's span) is
        discarded."""
        return any(lo <= last and first <= hi for lo, hi in self._discarded)

    def age(self, trainer_version: int, sample_version: int) -> int:
        """Policy updates between the weights that generated a sample and the weights it updates (>= 0)."""
        return max(0, self.policy(trainer_version) - self.policy(sample_version))


def sample_versions(sample: Any) -> list[tuple[int, int]]:
    """``(first, last)`` parameter version of each trajectory of a verl ``RolloutSample`` (its ``full_batch``'s
    ``min_global_steps``/``max_global_steps``, which verl's LLM server client sets from the rollout's weights)."""
    batch = sample.full_batch.non_tensor_batch
    first, last = batch["min_global_steps"], batch["max_global_steps"]
    return [(int(a), int(b)) for a, b in zip(first, last, strict=True)]


class DroppingQueueClient:
    """verl's ``MessageQueueClient`` as the trainer reads it, without the samples of discarded versions.

    ``get_sample`` skips (and reports to ``on_drop`` with its number of trajectories) every sample that
    ``discarded(first, last)`` says a discarded version generated; everything else is delegated unchanged.

    Args:
        inner: verl's client.
        discarded: ``(first, last) -> bool``, :meth:`PolicyVersions.discarded`.
        on_drop: awaited with the number of trajectories of each dropped sample.
        loads: how a queued sample is unpickled (verl queues ``ray.cloudpickle.dumps(sample)``).
    """

    def __init__(
        self,
        inner: Any,
        discarded: Callable[[int, int], bool],
        on_drop: Callable[[int], Awaitable[None]],
        loads: Callable[[bytes], Any] | None = None,
    ) -> None:
        self.inner = inner
        self._discarded = discarded
        self._on_drop = on_drop
        self._loads = loads

    async def get_sample(self) -> Any:
        """verl's ``(sample, queue length)`` of the next kept sample; the end signal as verl's client returns it."""
        while True:
            item = await self.inner.get_sample()
            if item is None or item[0] is None:
                return item
            versions = sample_versions(self._unpickle(item[0]))
            if not any(self._discarded(first, last) for first, last in versions):
                return item
            await self._on_drop(len(versions))

    def _unpickle(self, data: bytes) -> Any:
        if self._loads is None:
            import ray

            self._loads = ray.cloudpickle.loads
        return self._loads(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FullyAsyncGuardDriver(VerlGuardDriver):
    """:class:`~rlguard.adapters.verl.driver.VerlGuardDriver` on verl's ``FullyAsyncTrainer``: steps are parameter
    versions (verl's checkpoint numbering); a rollback loads the checkpoint into the trainer's workers and leaves
    :attr:`republish` for the trainer, which publishes the restored weights to the rollouter (a coroutine) before it
    takes the next batch."""

    def __init__(self, trainer: Any, guard: str | GuardConfig | Guard = "default") -> None:
        super().__init__(trainer, guard)
        #: ``(restored version, version rolled back at)`` until the trainer has published the restored weights
        self.republish: tuple[int, int] | None = None

    def snapshot(self, step: int) -> None:
        super().snapshot(step)
        self.trainer.last_ckpt_version = step  # verl's own save at this version would repeat it

    def rollback(self, folder: Path, step: int) -> None:
        """Load ``folder``'s actor (and critic) checkpoint into the trainer's workers; the checkpoints after it up
        to ``step`` hold discarded weights. The rollouter keeps generating (its replicas are not put to sleep);
        the trainer republishes (:attr:`republish`)."""
        trainer = self.trainer
        restored = _step_of(folder)
        later = [_step_of(p) for p in self.checkpoint_root.iterdir() if _STEP_FOLDER.match(p.name)]
        self.discarded |= {n for n in later if restored < n <= step}
        trainer.actor_rollout_wg.load_checkpoint(str(folder / "actor"), del_local_after_load=False)
        self._workers_lr_scale = None  # the load restored the scheduler as saved: on_log sends the scale again
        if trainer.use_critic:
            trainer.critic_wg.load_checkpoint(str(folder / "critic"), del_local_after_load=False)
        self.republish = (restored, step)


def guarded_fully_async_trainer_class(base: type) -> type:
    """``base`` (verl's ``FullyAsyncTrainer`` class, unwrapped from Ray, or a subclass) with the guard, as the module
    docstring says; takes ``guard=`` as :func:`~rlguard.adapters.verl.trainers.guarded_trainer_class` (default
    ``trainer.rlguard_guard`` of the config, else ``"default"``)."""
    check_fully_async_trainer(base)

    class GuardedFullyAsync(base):  # type: ignore[valid-type, misc]  # verl's class, untyped
        rlguard_guarded = True

        def __init__(self, *args: Any, guard: str | GuardConfig | Guard | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            check_standalone_rollout(self.config)
            if guard is None:
                guard = resolve_guard_setting(self.config.trainer.get("rlguard_guard", None) or "default")
            self.rlguard = FullyAsyncGuardDriver(self, guard)
            self.rlguard_versions = PolicyVersions()
            #: trajectories dropped so far because a discarded version generated them (logged every version)
            self.rlguard_dropped_samples = 0
            self._rlguard_in_step = False
            self._rlguard_cycle: dict[str, Any] | None = None  # the rollouter's timing of the cycle to close

        # -- the queue ---------------------------------------------------------------------------------------------
        def set_message_queue_client(self, message_queue_client: Any) -> None:
            """verl's queue client, read through :class:`DroppingQueueClient`."""
            client = DroppingQueueClient(message_queue_client, self.rlguard_versions.discarded, self._rlguard_dropped)
            super().set_message_queue_client(client)

        async def _rlguard_dropped(self, trajectories: int) -> None:
            self.rlguard_dropped_samples += trajectories
            print(f"rlguard: dropped {trajectories} samples generated by discarded weights")
            # the rollouter counts queued and in-flight samples against its staleness budget until the next sync;
            # a dropped one no longer is: recount (verl's own call after each sync), or it may pause for good
            await _remote(self.rollouter.reset_staleness)

        async def _fit_generate(self, batch: Any = None) -> Any:
            batch = await super()._fit_generate(batch)
            versions = batch.non_tensor_batch["max_global_steps"]
            ages = [self.rlguard_versions.age(self.current_param_version, int(v)) for v in versions]
            self.metrics[AGE_KEYS[0]] = sum(ages) / len(ages)
            self.metrics[AGE_KEYS[1]] = float(max(ages))
            return batch

        # -- one judged record per version -------------------------------------------------------------------------
        async def fit_step(self, batch_dict: Any = None) -> None:
            """verl's step; then, after a rollback, the restored weights go to the rollouter, and a halt ends
            ``fit``."""
            self._rlguard_in_step = True
            try:
                await super().fit_step(batch_dict)
            finally:
                self._rlguard_in_step = False
            if self.rlguard.republish is not None:
                await self._rlguard_republish(*self.rlguard.republish)
            if self.rlguard.halted is not None:
                raise FullyAsyncHalt(_halt_message(self.rlguard.halted))

        def _fit_log_aggregated_training_metrics(self, rollout_reset_timing_raw: dict[str, Any]) -> None:
            if self._rlguard_in_step:
                self._rlguard_cycle = rollout_reset_timing_raw  # closed once this step's metrics are in
            else:
                self._rlguard_close_cycle(rollout_reset_timing_raw)

        def _fit_postprocess_step(self) -> None:
            super()._fit_postprocess_step()  # adds this step's metrics to verl's aggregator
            if self._rlguard_cycle is not None:
                timing, self._rlguard_cycle = self._rlguard_cycle, None
                self._rlguard_close_cycle(timing)

        def _rlguard_close_cycle(self, timing: dict[str, Any]) -> None:
            """Aggregate the cycle's steps as verl does, judge them at the version they produced, log them."""
            aggregated = self.metrics_aggregator.get_aggregated_metrics(
                rollout_resource_utilization=timing.get("dynamic_resource/rollout_resource_utilization")
            )
            self.metrics_aggregator.reset()
            if not aggregated:
                return
            step = self.current_param_version
            record = {**aggregated, DROPPED_KEY: float(self.rlguard_dropped_samples)}
            record.update(self.rlguard.on_log(record, step))
            self.logger.log(data=record, step=step)

        async def _rlguard_republish(self, restored: int, step: int) -> None:
            """Publish the restored weights as version ``step + 1``, recount the rollouter's staleness budget and
            save the restored state as that version's checkpoint (``resume_mode=auto`` resumes from it)."""
            self.rlguard.republish = None
            self.current_param_version = step + 1
            self.rlguard_versions.republish(self.current_param_version, restored)
            await self.checkpoint_manager.update_weights(global_steps=self.current_param_version)
            await _remote(self.rollouter.reset_staleness)
            self._save_checkpoint()
            self.last_ckpt_version = self.current_param_version
            print(
                f"rlguard: rolled back to version {restored}; its weights went to the rollouter as version "
                f"{self.current_param_version}; samples of versions {restored + 1}-{step} are dropped"
            )

        async def fit(self) -> None:
            """verl's ``fit``; a halt is reported and raised as :class:`FullyAsyncHalt`."""
            try:
                await super().fit()
            except FullyAsyncHalt as halt:
                print(f"{halt}\n{self.rlguard.guard.report()}")
                self._shutdown_dump_executor()
                raise

        # -- checkpoints -------------------------------------------------------------------------------------------
        def _save_checkpoint(self) -> None:
            super()._save_checkpoint()
            self.rlguard.save(self.rlguard.step_folder(self.current_param_version))

        async def load_checkpoint(self) -> Any:
            result = await super().load_checkpoint()
            if self.current_param_version > 0:
                trainer = self.config.trainer
                path = trainer.get("resume_from_path") if trainer.resume_mode == "resume_path" else None
                folder = Path(os.path.abspath(path)) if path else self.rlguard.step_folder(self.current_param_version)
                self.rlguard.load(folder)
                self.rlguard_versions = PolicyVersions(start=self.current_param_version)
            return result

    GuardedFullyAsync.__name__ = GuardedFullyAsync.__qualname__ = f"Guarded{base.__name__}"
    return GuardedFullyAsync


def check_standalone_rollout(config: Any) -> None:
    """Refuse verl's dynamic resource scheduling: it also generates on hybrid replicas in the trainer's pool, which
    verl syncs on its own schedule, so a rollback's republished weights would not reach them."""
    if (config.get("async_training", None) or {}).get("use_dynamic_resource_scheduling", False):
        raise ValueError(
            "the guarded fully async trainer publishes a rollback's restored weights to the standalone rollout "
            "replicas only; set async_training.use_dynamic_resource_scheduling=false (got true)."
        )


def _halt_message(decision: Decision) -> str:
    return f"rlguard halted training at step {decision.step}: {decision.reason}"


async def _remote(method: Any, *args: Any) -> Any:
    """Await a Ray actor method's result (a stand-in's coroutine function is awaited as it is)."""
    result = method.remote(*args) if hasattr(method, "remote") else method(*args)
    if asyncio.iscoroutine(result):
        return await result
    return await asyncio.wrap_future(result.future())
