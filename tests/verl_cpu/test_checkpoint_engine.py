"""The CPU checkpoint engine without Ray: registered in verl's registry under its backend name, loaded by verl's own
``custom_backend_module`` import, and its two sides meeting in the weight store (the store's Ray handle and
``ray.get`` stood in for by the plain class and ``asyncio``). With Ray: integration_tests/test_verl_async.py."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest

pytest.importorskip("verl", reason="needs verl (pip install 'rlguard[verl]')")

import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # verl imports ray.experimental.state, deprecated by Ray
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    import rlguard.verl_cpu.checkpoint_engine as cpu_engine


class _Method:
    def __init__(self, function: Any) -> None:
        self.function = function

    def remote(self, *args: Any) -> Any:
        return self.function(*args)  # a coroutine: what ray.get (below) waits for


class _Handle:
    """A Ray actor handle on a plain :class:`WeightStore`, run on one event loop."""

    def __init__(self, store: cpu_engine.WeightStore) -> None:
        self.put = _Method(store.put)
        self.newer_than = _Method(store.newer_than)


class _Ray:
    """``ray`` as the engine uses it: ``ray.get`` of a store call (here a coroutine) on the test's loop."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop

    def get(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> Any:
    loop = asyncio.new_event_loop()
    monkeypatch.setattr(cpu_engine, "ray", _Ray(loop))
    yield loop
    loop.close()


def _engines(loop: Any, n_actor: int = 2) -> tuple[list[Any], Any]:
    store = loop.run_until_complete(_make_store())
    handle = _Handle(store)
    actor_kwargs, rollout_kwargs = cpu_engine.CPUCheckpointEngine.build_topology(n_actor, 1, [{}] * (n_actor + 1))
    actors = []
    for rank, is_actor in zip(actor_kwargs["rank"], actor_kwargs["is_actor"], strict=True):
        engine = cpu_engine.CPUCheckpointEngine(bucket_size=1 << 20)
        engine._store = handle
        engine.init_process_group(rank=rank, is_actor=is_actor)
        actors.append(engine)
    receiver = cpu_engine.CPUCheckpointEngine(bucket_size=1 << 20)
    receiver._store = handle
    receiver.init_process_group(rank=rollout_kwargs["rank"][0], is_actor=rollout_kwargs["is_actor"][0])
    return actors, receiver


async def _make_store() -> cpu_engine.WeightStore:
    return cpu_engine.WeightStore()  # its Condition belongs to the loop it is made on


def test_registered_under_its_backend_and_loaded_by_verls_module_import() -> None:
    from verl.utils.import_utils import import_external_libs

    import_external_libs(cpu_engine.cpu_checkpoint_overrides()[1].split("=", 1)[1])  # what verl's manager does
    assert CheckpointEngineRegistry.get(cpu_engine.BACKEND) is cpu_engine.CPUCheckpointEngine
    assert cpu_engine.cpu_checkpoint_overrides()[0].endswith(f"backend={cpu_engine.BACKEND}")


def test_topology_has_one_entry_per_worker_of_each_side() -> None:
    actor, rollout = cpu_engine.CPUCheckpointEngine.build_topology(3, 2, [{}] * 5)
    assert actor == {"rank": [0, 1, 2], "is_actor": [True] * 3}
    assert rollout == {"rank": [0, 1], "is_actor": [False, False]}


def test_every_actor_rank_walks_the_weights_and_rank_0_alone_sends(loop: Any) -> None:
    actors, receiver = _engines(loop)
    weights = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([1.5])}
    walked: list[int] = []

    def generator(rank: int) -> Any:
        for name, tensor in weights.items():
            walked.append(rank)  # FSDP's full_tensor is a collective: every rank must take part
            yield name, tensor

    for engine in reversed(actors):  # rank 1 first: it must not publish anything
        loop.run_until_complete(engine.send_weights(generator(engine.rank), global_steps=3))
    assert sorted(walked) == [0, 0, 1, 1]
    received = dict(receiver.receive_weights(global_steps=3))
    assert received.keys() == weights.keys()
    assert all(torch.equal(received[k], weights[k]) for k in weights)
    weights["a"].add_(1.0)
    assert not torch.equal(received["a"], weights["a"])  # a copy: later updates of the actor's tensor stay there


def test_the_rollout_waits_for_weights_newer_than_the_last_it_loaded(loop: Any) -> None:
    (actor, _), receiver = _engines(loop)
    loop.run_until_complete(actor.send_weights(iter([("w", torch.zeros(2))]), global_steps=1))
    assert torch.equal(dict(receiver.receive_weights())["w"], torch.zeros(2))

    async def receive_then_send() -> dict[str, torch.Tensor]:
        # a rollback pushes the same step's weights again: the sequence number, not the step, tells them apart
        waiting = asyncio.ensure_future(receiver._store.newer_than.remote(receiver.loaded))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # nothing newer yet
        await actor.send_weights(iter([("w", torch.ones(2))]), global_steps=1)
        return (await waiting)[2]

    assert torch.equal(loop.run_until_complete(receive_then_send())["w"], torch.ones(2))


def test_a_lost_sender_fails_the_wait_instead_of_hanging(loop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_engine, "RECEIVE_TIMEOUT_S", 0.01)
    _, receiver = _engines(loop)
    with pytest.raises(TimeoutError):
        dict(receiver.receive_weights())
