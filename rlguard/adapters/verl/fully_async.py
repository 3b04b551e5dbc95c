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
  restores) is logged as ``rlguard/staleness_mean``/``rlguard/staleness_max``, and in optimizer steps (one per verl
  step; :class:`~rlguard.guards.stats.staleness.PublishedSteps`, each version recorded at the update that made it)
  as ``rlguard/staleness_steps_mean``/``rlguard/staleness_steps_max``; where the trainer recomputes pi_old
  beside the engine's log-probs (not verl's ``bypass_mode``), the gap ``|log pi_old - log p_rollout|`` by age bucket
  (:func:`~rlguard.guards.stats.staleness.add_staleness_stats`): the evidence ``staleness_remedy`` diagnoses; in
  bypass mode each row's age goes to the workers, whose loss measures ``|log pi_theta - log p_rollout|`` by bucket
  (:mod:`~rlguard.adapters.verl.bypass_gap`, sent through verl's ``set_loss_fn``).
- **The staleness remedies** (``staleness_remedy``): the bound in force (``Controls.max_staleness``, capability
  ``staleness_bound``) goes to the rollouter after the step that set it, through rlguard's rollouter
  (:mod:`rlguard.adapters.verl.fully_async_rollouter`, which verl's own budget then applies), and is logged as
  ``rlguard/staleness_bound``; samples older than ``Controls.stale_drop_age`` (``drop_stale``) are dropped as the
  trainer takes them from the queue and counted as ``rlguard/stale_dropped`` (per version).
- **Halt** raises :class:`FullyAsyncHalt` out of the trainer's ``fit`` after logging the step: verl's task runner
  cancels the rollouter and clears the queue, and the guarded task runner
  (:mod:`rlguard.adapters.verl.fully_async_main`) returns normally.
- **Resume** (verl's ``load_checkpoint``) restores the guard's state from the loaded version's folder.

Tested on stand-ins (tests/adapters/verl/test_fully_async.py) and end to end with Ray on CPU
(integration_tests/test_verl_async.py).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import torch

from rlguard.adapters.verl.async_trainers import AGE_KEYS, DROPPED_KEY, STEP_AGE_KEYS
from rlguard.adapters.verl.bypass_gap import AGE_COLUMN, BypassGapDriver, gap_by_age_from_metrics
from rlguard.adapters.verl.compat import STALENESS_BOUND_METHOD, check_fully_async_trainer
from rlguard.adapters.verl.driver import _STEP_FOLDER, _step_of
from rlguard.adapters.verl.fully_async_queue import DroppingQueueClient, PolicyVersions, sample_versions
from rlguard.adapters.verl.fully_async_rollouter import staleness_bound_of
from rlguard.adapters.verl.mapping import engine_log_probs_beside_pi_old
from rlguard.adapters.verl.settings import resolve_guard_setting
from rlguard.guards import Decision, Guard, GuardConfig
from rlguard.guards.actuation import bind_guard
from rlguard.guards.stats.collect import StepStats
from rlguard.guards.stats.staleness import PublishedSteps, add_staleness_stats, add_step_ages
from rlguard.metrics import RLGUARD_PREFIX, STALENESS_BUCKETS

#: the logged bound in force (policy versions) and the samples dropped over the age bound this version: the metric
#: table's ``staleness_bound`` and ``stale_dropped``
BOUND_KEY, STALE_DROPPED_KEY = f"{RLGUARD_PREFIX}staleness_bound", f"{RLGUARD_PREFIX}stale_dropped"
_DISCARDED = "generated by discarded weights"

__all__ = [
    "BOUND_KEY",
    "STALE_DROPPED_KEY",
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


class FullyAsyncGuardDriver(BypassGapDriver):
    """:class:`~rlguard.adapters.verl.bypass_gap.BypassGapDriver` on verl's ``FullyAsyncTrainer``: steps are parameter
    versions (verl's checkpoint numbering); a rollback loads the checkpoint into the trainer's workers and leaves
    :attr:`republish` for the trainer, which publishes the restored weights to the rollouter (a coroutine) before it
    takes the next batch."""

    def __init__(self, trainer: Any, guard: str | GuardConfig | Guard = "default") -> None:
        super().__init__(trainer, guard)
        #: ``(restored version, version rolled back at)`` until the trainer has published the restored weights
        self.republish: tuple[int, int] | None = None

    @property
    def capabilities(self) -> frozenset[str]:
        """The synchronous driver's, ``drop_stale`` (the trainer's queue client drops over-age samples) and
        ``staleness_bound`` where the rollouter is rlguard's (it has
        :data:`~rlguard.adapters.verl.compat.STALENESS_BOUND_METHOD`; known once verl's ``set_rollouter`` ran)."""
        can = set(super().capabilities) | {"drop_stale"}
        if callable(getattr(getattr(self.trainer, "rollouter", None), STALENESS_BOUND_METHOD, None)):
            can.add("staleness_bound")
        return frozenset(can)

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
            #: the optimizer updates made so far (one per verl step) and the update each version was made at
            self.rlguard_updates = 0
            self.rlguard_published = PublishedSteps()
            self.rlguard_published.publish(self.current_param_version, 0)
            #: trajectories dropped so far because a discarded version generated them (logged every version)
            self.rlguard_dropped_samples = 0
            #: trajectories dropped over the age bound since the last logged version
            self.rlguard_stale_dropped = 0
            #: the run's own staleness threshold, and the one in force in the rollouter
            async_training = self.config.get("async_training", None) or {}
            self.rlguard_configured_threshold = float(async_training.get("staleness_threshold", 1))  # verl's default
            self.rlguard_threshold = self.rlguard_configured_threshold
            self._rlguard_bound_sent: int | None = None  # the bound the rollouter was last given (None: its own)
            self._rlguard_in_step = False
            self._rlguard_cycle: dict[str, Any] | None = None  # the rollouter's timing of the cycle to close

        # -- the queue ---------------------------------------------------------------------------------------------
        def set_message_queue_client(self, message_queue_client: Any) -> None:
            """verl's queue client, read through :class:`DroppingQueueClient`."""
            client = DroppingQueueClient(message_queue_client, self._rlguard_why_drop, self._rlguard_dropped)
            super().set_message_queue_client(client)

        async def set_rollouter(self, rollouter: Any) -> None:
            """verl's; then the guard learns whether the rollouter takes the staleness bound (its capabilities)."""
            await super().set_rollouter(rollouter)
            bind_guard(self.rlguard.guard, self.rlguard, where="verl's fully async trainer")
            if self.rlguard.bypass_mode:
                self.rlguard.push_controls()  # the workers' loss measures the gap by age from the first step

        def _rlguard_why_drop(self, first: int, last: int) -> str | None:
            """Why a trajectory generated over versions ``first ... last`` is not trained on now, or None: its
            oldest tokens' age counts (a partial rollout's first version)."""
            if self.rlguard_versions.discarded(first, last):
                return _DISCARDED
            limit = self.rlguard.controls.stale_drop_age
            if limit is not None and self.rlguard_versions.age(self.current_param_version, first) > limit:
                return f"older than {limit} versions"
            return None

        async def _rlguard_dropped(self, trajectories: int, reason: str) -> None:
            if reason == _DISCARDED:
                self.rlguard_dropped_samples += trajectories
            else:
                self.rlguard_stale_dropped += trajectories
            print(f"rlguard: dropped {trajectories} samples {reason}")
            # the rollouter counts queued and in-flight samples against its staleness budget until the next sync;
            # a dropped one no longer is: recount (verl's own call after each sync), or it may pause for good
            await _remote(self.rollouter.reset_staleness)

        async def _fit_generate(self, batch: Any = None) -> Any:
            """verl's batch; its ages in versions and in optimizer steps (the updates made so far minus each
            version's) logged."""
            batch = await super()._fit_generate(batch)
            versions = torch.tensor([int(v) for v in batch.non_tensor_batch["max_global_steps"]])  # (B,)
            st = StepStats()
            add_staleness_stats(st, torch.tensor(self._rlguard_ages(batch), dtype=torch.float64))
            add_step_ages(st, self.rlguard_published.ages(versions, self.rlguard_updates))
            ages = st.reduce()
            self.metrics.update({key: ages[key.removeprefix(RLGUARD_PREFIX)] for key in (*AGE_KEYS, *STEP_AGE_KEYS)})
            return batch

        def _fit_update_local_step(self) -> None:
            """verl's count of the steps of a sync cycle, after the step's update; a version made by this update
            (the cycle's last) is recorded at it."""
            self.rlguard_updates += 1
            super()._fit_update_local_step()
            if self.local_trigger_step == 1:
                self.rlguard_published.publish(self.current_param_version, self.rlguard_updates)

        def _rlguard_ages(self, batch: Any) -> list[int]:
            """Each row's age in policy versions (its trajectory's last version)."""
            versions = batch.non_tensor_batch["max_global_steps"]
            return [self.rlguard_versions.age(self.current_param_version, int(v)) for v in versions]

        def _fit_compute_log_prob(self, batch: Any) -> Any:
            """verl's pi_old; where it is recomputed beside the engine's log-probs, the gap by age bucket; in bypass
            mode each row's age goes to the workers' loss, which measures it there."""
            batch = super()._fit_compute_log_prob(batch)
            tensors = batch.batch
            # a TensorDict refuses `in` itself: its keys() answers
            if engine_log_probs_beside_pi_old(self.config) and "rollout_log_probs" in tensors.keys():  # noqa: SIM118
                self.metrics.update(self._rlguard_gap_by_age(batch))
            elif self.rlguard.bypass_mode:
                tensors[AGE_COLUMN] = torch.tensor(self._rlguard_ages(batch), dtype=torch.float32)  # (B,)
            return batch

        def _rlguard_gap_by_age(self, batch: Any) -> dict[str, float]:
            ages = torch.tensor(self._rlguard_ages(batch))
            st = StepStats()
            tensors = batch.batch
            mask = tensors["response_mask"]
            add_staleness_stats(st, ages, tensors["old_log_probs"], tensors["rollout_log_probs"], mask)
            gaps = st.reduce()
            return {f"{RLGUARD_PREFIX}{name}": gaps[name] for name, _, _ in STALENESS_BUCKETS if name in gaps}

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
            await self._rlguard_apply_bound()
            if self.rlguard.halted is not None:
                raise FullyAsyncHalt(_halt_message(self.rlguard.halted))

        def _fit_log_aggregated_training_metrics(self, rollout_reset_timing_raw: dict[str, Any]) -> None:
            if self._rlguard_in_step:
                self._rlguard_cycle = rollout_reset_timing_raw  # closed once this step's metrics are in
            else:
                self._rlguard_close_cycle(rollout_reset_timing_raw)

        def _fit_postprocess_step(self) -> None:
            self.metrics.update(gap_by_age_from_metrics(self.metrics))  # bypass mode: measured by the workers' loss
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
            record = {
                **aggregated,
                DROPPED_KEY: float(self.rlguard_dropped_samples),
                STALE_DROPPED_KEY: float(self.rlguard_stale_dropped),
                BOUND_KEY: float(staleness_bound_of(self.rlguard_threshold)),
            }
            self.rlguard_stale_dropped = 0
            record.update(self.rlguard.on_log(record, step))
            self.logger.log(data=record, step=step)

        async def _rlguard_republish(self, restored: int, step: int) -> None:
            """Publish the restored weights as version ``step + 1``, recount the rollouter's staleness budget and
            save the restored state as that version's checkpoint (``resume_mode=auto`` resumes from it)."""
            self.rlguard.republish = None
            self.current_param_version = step + 1
            self.rlguard_versions.republish(self.current_param_version, restored)
            published = self.rlguard_published
            published.rollback(to_step=published.step_of(restored), at_step=self.rlguard_updates)
            published.publish(self.current_param_version, self.rlguard_updates)
            await self.checkpoint_manager.update_weights(global_steps=self.current_param_version)
            await _remote(self.rollouter.reset_staleness)
            self._save_checkpoint()
            self.last_ckpt_version = self.current_param_version
            print(
                f"rlguard: rolled back to version {restored}; its weights went to the rollouter as version "
                f"{self.current_param_version}; samples of versions {restored + 1}-{step} are dropped"
            )

        async def _rlguard_apply_bound(self) -> None:
            """Send the rollouter the staleness bound in force (``Controls.max_staleness``; None: as configured)
            when it changed, where the rollouter takes it."""
            bound = self.rlguard.controls.max_staleness
            method = getattr(self.rollouter, STALENESS_BOUND_METHOD, None)
            if method is None or bound == self._rlguard_bound_sent:
                return
            self.rlguard_threshold = float(await _remote(method, bound))
            self._rlguard_bound_sent = bound

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
                self.rlguard_published = PublishedSteps()
                self.rlguard_published.publish(self.current_param_version, self.rlguard_updates)
                await self._rlguard_apply_bound()  # verl's task runner sets the rollouter before loading
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
