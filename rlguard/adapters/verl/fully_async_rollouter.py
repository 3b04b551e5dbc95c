"""The staleness bound of verl's fully async pipeline, lowered and restored while it runs.

verl's ``FullyAsyncRollouter`` reads ``async_training.staleness_threshold`` (``s``) once: ``set_max_required_samples``
derives from it the samples it may start per parameter version, ``max_required_samples = required_samples * (s + 1)
* trigger_parameter_sync_step`` (``required_samples``: the samples of one training step), which also caps its
concurrent generations (``max_concurrent_samples``) and the queue it pauses at (``max_queue_size``). Each sync
recounts the queued and in-flight samples against that budget (``reset_staleness``), so at a sync at most ``s``
versions' worth of samples wait: those are consumed, oldest first, within the next ``ceil(s)`` versions, and a
sample is at most ``ceil(s)`` policy versions old when it is trained on (:func:`staleness_bound_of`).

:func:`guarded_fully_async_rollouter_class` adds one call to the rollouter, ``rlguard_set_staleness_bound(bound)``
(:data:`~rlguard.adapters.verl.compat.STALENESS_BOUND_METHOD`): the threshold becomes ``min(s, bound)``
(:func:`threshold_for_bound`; ``None`` restores ``s``), and verl's own ``set_max_required_samples`` derives the
budget, the concurrency cap and the pause bound again. A lower budget pauses generation at the next sample verl
submits (``_should_pause_generation``); a restored one resumes it through verl's monitor loop (every 10 s), or at
the next sync. The ``MessageQueue`` actor keeps the length verl built it with, which the restored bound never
exceeds. Samples already queued over a lowered bound are dropped by the trainer as it takes them
(:class:`~rlguard.adapters.verl.fully_async.DroppingQueueClient`): verl's queue drops only by length.
"""

from __future__ import annotations

import math
from typing import Any

from rlguard.adapters.verl.compat import check_fully_async_rollouter

__all__ = ["guarded_fully_async_rollouter_class", "staleness_bound_of", "threshold_for_bound"]


def staleness_bound_of(threshold: float) -> int:
    """The largest age in policy versions a sample reaches under verl's ``staleness_threshold`` (module docstring)."""
    return math.ceil(threshold)


def threshold_for_bound(configured: float, bound: int | None) -> float:
    """The ``staleness_threshold`` that keeps samples at most ``bound`` policy versions old, never above the
    ``configured`` one; ``bound=None``: the configured threshold."""
    if bound is None:
        return configured
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
        raise ValueError(f"bound must be a whole number of policy versions >= 0 or None; got {bound!r}.")
    return min(configured, float(bound))


def guarded_fully_async_rollouter_class(base: type) -> type:
    """``base`` (verl's ``FullyAsyncRollouter`` class, unwrapped from Ray, or a subclass) with
    ``rlguard_set_staleness_bound`` (module docstring)."""
    check_fully_async_rollouter(base)

    class GuardedRollouter(base):  # type: ignore[valid-type, misc]  # verl's class, untyped
        staleness_threshold: float  # verl's, set in its __init__
        max_required_samples: int  # verl's, set by set_max_required_samples

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if not isinstance(getattr(self, "staleness_threshold", None), (int, float)):
                raise RuntimeError(
                    f"{base.__name__} has no numeric staleness_threshold (verl 0.9.1's FullyAsyncRollouter reads "
                    "async_training.staleness_threshold into it); install 'rlguard[verl]'."
                )
            #: the run's own ``staleness_threshold``, which a restored bound returns to
            self.rlguard_configured_threshold = float(self.staleness_threshold)

        async def rlguard_set_staleness_bound(self, bound: int | None) -> float:
            """Keep samples at most ``bound`` policy versions old (``None``: as configured) through verl's own
            budget; returns the ``staleness_threshold`` in force."""
            threshold = threshold_for_bound(self.rlguard_configured_threshold, bound)
            if threshold != self.staleness_threshold:
                before = self.staleness_threshold
                self.staleness_threshold = threshold
                await self.set_max_required_samples()  # verl's derivation of the budget, concurrency and pause
                print(
                    f"rlguard: staleness_threshold {before} -> {threshold} (samples at most "
                    f"{staleness_bound_of(threshold)} versions old): max_required_samples {self.max_required_samples}"
                )
            return float(self.staleness_threshold)

    GuardedRollouter.__name__ = GuardedRollouter.__qualname__ = f"Guarded{base.__name__}"
    return GuardedRollouter
