"""What the guarded fully async trainer knows of its samples' parameter versions (:class:`PolicyVersions`: the
policy behind each version after rollbacks, and the discarded ones) and how it reads verl's message queue without the
samples it must not train on (:class:`DroppingQueueClient`); used by :mod:`rlguard.adapters.verl.fully_async`."""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["DroppingQueueClient", "PolicyVersions", "sample_versions"]


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
    """verl's ``MessageQueueClient`` as the trainer reads it, without the samples it must not train on.

    ``get_sample`` skips every sample for one of whose trajectories ``why_drop(first, last)`` gives a reason (a
    discarded version generated it, or it is over the age bound) and reports it to ``on_drop`` with its number of
    trajectories and that reason; everything else is delegated unchanged.

    Args:
        inner: verl's client.
        why_drop: ``(first, last) -> reason or None`` of one trajectory's parameter versions.
        on_drop: awaited with the number of trajectories of each dropped sample and the reason.
        loads: how a queued sample is unpickled (verl queues ``ray.cloudpickle.dumps(sample)``).
    """

    def __init__(
        self,
        inner: Any,
        why_drop: Callable[[int, int], str | None],
        on_drop: Callable[[int, str], Awaitable[None]],
        loads: Callable[[bytes], Any] | None = None,
    ) -> None:
        self.inner = inner
        self._why_drop = why_drop
        self._on_drop = on_drop
        self._loads = loads

    async def get_sample(self) -> Any:
        """verl's ``(sample, queue length)`` of the next kept sample; the end signal as verl's client returns it."""
        while True:
            item = await self.inner.get_sample()
            if item is None or item[0] is None:
                return item
            versions = sample_versions(self._unpickle(item[0]))
            reason = next((r for r in (self._why_drop(a, b) for a, b in versions) if r is not None), None)
            if reason is None:
                return item
            await self._on_drop(len(versions), reason)

    def _unpickle(self, data: bytes) -> Any:
        if self._loads is None:
            import ray

            self._loads = ray.cloudpickle.loads
        return self._loads(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
