"""The trust region in TRL's loop without DeepSpeed: ``StabilityCallback`` measures each update's relative size
when the guard's ``trust_region`` reads it, reports it into the next step's stats, and the LR multiplier applies to
the next optimizer step (the part of ``Trainer``'s loop around one optimizer step: ``tests/helpers/trl_loop.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from rlguard.adapters.trl import StabilityCallback
from rlguard.guards import Decision, Guard, GuardConfig
from tests.helpers.trl_loop import Loop


class RecordingGuard(Guard):
    """A real guard that records the stats it judged."""

    def __init__(self, config: GuardConfig) -> None:
        super().__init__(config)
        self.seen: list[dict[str, float]] = []

    def observe(self, step: int, stats: Mapping[str, float]) -> Decision:
        self.seen.append(dict(stats))
        return super().observe(step, stats)


def test_callback_feeds_update_ratio_to_the_trust_region_and_scales_the_next_step(tmp_path: Path) -> None:
    guard = RecordingGuard(GuardConfig.preset("stable"))
    loop = Loop(StabilityCallback(guard=guard), tmp_path)
    loop.optimizer.param_groups[0]["lr"] = 1.0  # a huge LR
    before = torch.cat([p.detach().reshape(-1).double() for p in loop.model.parameters()])
    loop.step()
    after = torch.cat([p.detach().reshape(-1).double() for p in loop.model.parameters()])
    ratio = float(torch.linalg.vector_norm(after - before) / torch.linalg.vector_norm(before))
    assert "update_ratio" not in guard.seen[0] and loop.lr_used == [1.0]
    loop.step()
    assert guard.seen[1]["update_ratio"] == pytest.approx(ratio, rel=1e-9) and ratio > 0.2
    expected = max(1.0 / min(ratio / 0.02, 10.0), 0.01)  # the cut that lands on the limit, at most /10
    assert loop.lr_used == pytest.approx([expected], rel=1e-9)
    assert [g["lr"] for g in loop.optimizer.param_groups] == [1.0]  # the scheduler's LR, restored
    assert [e.detector for e in guard.events] == ["action:scale_lr"]


def test_callback_does_not_measure_updates_without_a_trust_region(tmp_path: Path) -> None:
    guard = RecordingGuard(GuardConfig.preset("default"))
    loop = Loop(StabilityCallback(guard=guard), tmp_path)
    loop.step()
    loop.step()
    assert all("update_ratio" not in s for s in guard.seen)
