"""Weight sync for verl's standalone rollouts on CPU: checkpoint engine ``rlguard_cpu``.

verl's asynchronous trainers (``verl.experimental.fully_async_policy``, ``verl.experimental.one_step_off_policy``)
run the rollout in its own resource pool and always sync weights through ``CheckpointEngineManager``, whose
default backend (``nccl``) needs cupy and CUDA buffers and whose ``naive`` backend needs the rollout in the actor's
own process. This backend, registered through verl's public ``CheckpointEngineRegistry`` and loaded with
``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=rlguard.verl_cpu.checkpoint_engine``, moves the
full weights through a named Ray actor (:class:`WeightStore`):

- on the actor side every rank walks verl's weight generator (FSDP's ``full_tensor`` is a collective) and rank 0
  puts a CPU state dict in the store, numbered by a sequence number (a rollback pushes a step's weights twice);
- on the rollout side each ``CheckpointEngineWorker``'s engine waits for a sequence number newer than the last one
  it loaded and yields that state dict to the rollout's server adapter (:class:`~rlguard.verl_cpu.rollout.
  HFServerAdapter`), a plain generator as the adapter reads it synchronously.

``CheckpointEngineManager`` starts both sides at once (``ray.get(actor.update_weights + rollout.update_weights)``),
which is why the receiver waits. The store is created by the first engine that needs it; every engine keeps a handle,
so it lives as long as any of them (Ray ends a named actor whose handles are all gone).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Generator, Iterable
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

__all__ = ["BACKEND", "STORE_NAME", "CPUCheckpointEngine", "WeightStore", "cpu_checkpoint_overrides"]

BACKEND = "rlguard_cpu"
STORE_NAME = "rlguard_cpu_weight_store"
#: seconds a rollout waits for the actor's weights before failing (a lost sender would hang it forever)
RECEIVE_TIMEOUT_S = float(os.environ.get("RLGUARD_CPU_WEIGHT_TIMEOUT_S", "600"))


class WeightStore:
    """The latest full weights the actor sent, with their sequence number and step (a Ray actor)."""

    def __init__(self) -> None:
        self.sequence = 0
        self.state: dict[str, torch.Tensor] = {}
        self.global_steps: int | None = None
        self._changed = asyncio.Condition()

    async def put(self, state: dict[str, torch.Tensor], global_steps: int | None) -> int:
        """Hold ``state`` (name -> CPU tensor) as the newest weights; returns their sequence number."""
        async with self._changed:
            self.sequence += 1
            self.state, self.global_steps = state, global_steps
            self._changed.notify_all()
            return self.sequence

    async def newer_than(self, sequence: int) -> tuple[int, int | None, dict[str, torch.Tensor]]:
        """``(sequence, global_steps, state)`` of the first weights put after ``sequence`` (waits for them)."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: self.sequence > sequence), RECEIVE_TIMEOUT_S)
            return self.sequence, self.global_steps, self.state

    async def latest(self) -> tuple[int, int | None]:
        """``(sequence, global_steps)`` of the newest weights (0, None before the first)."""
        return self.sequence, self.global_steps


def weight_store() -> Any:
    """The run's :class:`WeightStore` actor, created on first use (one per Ray namespace)."""
    actor: Any = ray.remote(WeightStore)
    return actor.options(name=STORE_NAME, get_if_exists=True, num_cpus=0, max_concurrency=16).remote()


@CheckpointEngineRegistry.register(BACKEND)
class CPUCheckpointEngine(CheckpointEngine):  # type: ignore[misc]  # verl's class, untyped
    """verl checkpoint engine moving full CPU state dicts through :class:`WeightStore` (see the module docstring).

    Args:
        bucket_size: verl's bucket size in bytes (unused: the state dict goes whole).
    """

    def __init__(self, bucket_size: int = 0, **kwargs: Any) -> None:
        del bucket_size, kwargs
        self.rank = 0
        self.is_actor = True
        self.loaded = 0  # on the rollout side: the sequence number of the weights last yielded
        self._store: Any = None

    def store(self) -> Any:
        if self._store is None:
            self._store = weight_store()  # kept: the store lives while a handle does
        return self._store

    def prepare(self) -> dict[str, Any]:
        self.store()
        return {}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict[str, Any]]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Ranks per side: actor rank 0 sends, every rollout worker receives."""
        actor: dict[str, list[Any]] = {
            "rank": list(range(actor_wg_world_size)),
            "is_actor": [True] * actor_wg_world_size,
        }
        rollout: dict[str, list[Any]] = {
            "rank": list(range(rollout_world_size)),
            "is_actor": [False] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int = 0, is_actor: bool = True, **kwargs: Any) -> None:
        self.rank, self.is_actor = int(rank), bool(is_actor)

    def finalize(self) -> None:
        return None

    async def send_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None
    ) -> dict[str, Any]:
        """Walk ``weights`` (every rank: FSDP's gather is collective); rank 0 puts them in the store."""
        state = {}
        async for name, tensor in ensure_async_iterator(weights):
            if self.rank == 0:
                state[name] = tensor.detach().to("cpu", copy=True)
        if self.rank == 0:
            await self.store().put.remote(state, global_steps)
        return {}

    def receive_weights(  # type: ignore[override]  # a plain generator: the CPU adapter reads it synchronously
        self, global_steps: int | None = None
    ) -> Generator[tuple[str, torch.Tensor], None, None]:
        """The weights the actor sent after the last ones this engine yielded (waits for them)."""
        sequence, _, state = ray.get(self.store().newer_than.remote(self.loaded))
        self.loaded = sequence
        yield from state.items()


def cpu_checkpoint_overrides() -> list[str]:
    """verl overrides that select this backend for an asynchronous trainer's weight sync."""
    return [
        f"actor_rollout_ref.rollout.checkpoint_engine.backend={BACKEND}",
        f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={__name__}",
    ]
