"""The guard in verl's asynchronous trainers: :func:`guarded_async_trainer_class` for verl's one-step-off trainer
(``verl.experimental.one_step_off_policy.ray_trainer.OneStepOffRayTrainer``), whose ``fit`` is a coroutine.

It is :func:`~rlguard.adapters.verl.trainers.guarded_trainer_class` (the synchronous trainers' driver, one copy:
:class:`~rlguard.adapters.verl.driver.VerlGuardDriver` on the trainer's ``Tracking`` logger, checkpoints, the
objective's controls through ``set_loss_fn``, the LR scale through the actor worker's ``rlguard_set_lr_scale``) with
two differences that the pipeline needs:

- ``fit`` is awaited within the guarded logger (verl runs it with ``asyncio.run``); a halt returns from it, and
  ``asyncio.run`` cancels the generation in flight, so the task runner returns and verl shuts Ray down;
- after a step that rolled back, the batch the rollout was generating is dropped: the one-step-off trainer starts
  generating step ``N+1``'s batch during step ``N``, from the weights before step ``N``'s update, and the
  rollback's weight push reaches the rollout part-way through it. The trainer waits for that batch, throws it
  away (its prompts are not trained on) and generates the next one from the restored weights, which the rollback
  pushed to the rollout (:meth:`~rlguard.adapters.verl.driver.VerlGuardDriver.rollback`) before that batch starts.

The decision is taken once, on the driver (verl's single controller); every trainer rank receives the same
controls and LR scale through verl's ``ONE_TO_ALL`` worker calls and loads the same checkpoint.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rlguard.adapters.verl.driver import GuardHalt
from rlguard.adapters.verl.trainers import guarded_tracking_for, guarded_trainer_class

__all__ = ["DROPPED_KEY", "guarded_async_trainer_class"]

#: the logged count of samples dropped because the policy that generated them was rolled back (cumulative)
DROPPED_KEY = "rlguard/guard/dropped_samples"


def guarded_async_trainer_class(base: type) -> type:
    """``base`` (verl's ``OneStepOffRayTrainer`` or a subclass: ``fit`` and ``fit_step`` coroutines, ``fit_step(
    batch_data_future, continuous_iterator)`` returning the next batch's task) with the guard on its driver; takes
    ``guard=`` as :func:`~rlguard.adapters.verl.trainers.guarded_trainer_class`."""
    guarded = guarded_trainer_class(base)
    base_fit: Any = base.fit  # type: ignore[attr-defined]  # verl's class, untyped

    class GuardedAsync(guarded):  # type: ignore[valid-type, misc]  # verl's class, untyped
        #: samples dropped so far because the policy that generated them was rolled back (logged every step)
        rlguard_dropped_samples = 0

        async def fit(self) -> None:  # type: ignore[override]  # verl's fit is a coroutine here
            """verl's ``fit`` with the guard watching each step; returns early when the guard halts."""
            with guarded_tracking_for(self.rlguard):
                try:
                    await base_fit(self)  # verl's coroutine (the synchronous trainers' fit does not await it)
                except GuardHalt as halt:
                    print(f"{halt}\n{self.rlguard.guard.report()}")
                    if getattr(self, "_dump_futures", None) is not None:  # verl's one-step-off trainer has none
                        self._shutdown_dump_executor()

        async def fit_step(self, batch_data_future: Any, continuous_iterator: Any) -> Any:
            """verl's step; after a rollback, the batch in flight is replaced by one from the restored weights."""
            future = await super().fit_step(batch_data_future, continuous_iterator)
            if future is None or self.rlguard.restored_step is None:
                return future
            stale = await future  # generated (in part) by the discarded policy
            if stale is not None:
                self.rlguard_dropped_samples += len(stale[3])
                print(
                    f"rlguard: dropped {len(stale[3])} samples generated before the rollback to step "
                    f"{self.rlguard.restored_step}"
                )
            await asyncio.sleep(0)  # let the task start, as verl does after creating one
            return asyncio.create_task(self._async_gen_next_batch(continuous_iterator))

        def _fit_postprocess_step(self) -> None:
            self.metrics[DROPPED_KEY] = float(self.rlguard_dropped_samples)  # logged by verl's step
            super()._fit_postprocess_step()

    GuardedAsync.__name__ = GuardedAsync.__qualname__ = f"Guarded{base.__name__}"
    return GuardedAsync
