"""The packed loss tokens unpacked into rows, and the rollout queue that drops a discarded policy's samples."""

from __future__ import annotations

import queue
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from rlguard.adapters.trl.async_queue import DROPPED_DISCARDED_KEY, DiscardingQueue, unpack_completions


def test_unpack_completions_places_each_token_in_its_row() -> None:
    segment = torch.tensor([0, 0, 0, 1, 2, 2])
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], requires_grad=True)
    out = unpack_completions({"x": values}, segment)
    expected = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 6.0, 0.0]])
    torch.testing.assert_close(out["x"], expected, rtol=0, atol=0)
    torch.testing.assert_close(out["mask"], torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 1, 0]]), rtol=0, atol=0)
    (out["x"] * torch.arange(9.0).view(3, 3)).sum().backward()  # each flat value gets its own cell's weight
    torch.testing.assert_close(values.grad, torch.tensor([0.0, 1.0, 2.0, 3.0, 6.0, 7.0]), rtol=0, atol=0)


def test_unpack_completions_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        unpack_completions({"x": torch.zeros(3)}, torch.tensor([1, 0, 0]))
    with pytest.raises(ValueError, match="shape"):
        unpack_completions({"x": torch.zeros(2)}, torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="non-empty"):
        unpack_completions({}, torch.zeros(0, dtype=torch.long))


def test_discarding_queue_drops_and_counts_discarded_versions() -> None:
    inner: queue.Queue[SimpleNamespace] = queue.Queue()
    for version in (1, 2, 3, 4, 2, 5):
        inner.put(SimpleNamespace(model_version=version))
    metrics: defaultdict[str, list[float]] = defaultdict(list)
    wrapped = DiscardingQueue(inner, metrics)
    assert wrapped.get(timeout=1).model_version == 1  # nothing discarded yet
    wrapped.discard(2, 3)
    assert [wrapped.get(timeout=1).model_version for _ in range(2)] == [4, 5]
    assert wrapped.dropped == 3 and metrics[DROPPED_DISCARDED_KEY] == [1.0, 1.0, 1.0]
    with pytest.raises(queue.Empty):
        wrapped.get(timeout=0.01)
    assert wrapped.qsize() == 0 and wrapped.empty()  # the rest is the wrapped queue's
    with pytest.raises(ValueError, match="first <= last"):
        wrapped.discard(3, 2)
