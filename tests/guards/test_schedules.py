"""Schedules (``rlguard.guards.schedules``): their values step by step, and their place in the guard's decision."""

from __future__ import annotations

import pytest

from rlguard.guards import Constant, Cosine, Guard, GuardConfig, Linear, Piecewise, Stages
from tests.helpers.synthetic import healthy_stream


def test_schedules_values() -> None:
    assert [Piecewise((10, 20), (0.2, 0.1, 0.05))(s) for s in (0, 9, 10, 19, 20, 99)] == [
        0.2,
        0.2,
        0.1,
        0.1,
        0.05,
        0.05,
    ]
    lin = Linear(((0, 0.0), (10, 1.0)))
    assert (lin(-5), lin(5), lin(10), lin(50)) == (0.0, 0.5, 1.0, 1.0)
    cos = Cosine(start=1.0, end=0.0, total_steps=100, warmup_steps=10)
    assert cos(0) == pytest.approx(0.1) and cos(9) == pytest.approx(1.0)
    assert cos(10) == pytest.approx(1.0) and cos(55) == pytest.approx(0.5) and cos(100) == pytest.approx(0.0)
    stages = Stages(((0, Constant(0.2)), (50, Linear(((0, 0.2), (50, 0.1))))))
    assert (stages(49), stages(50), stages(75), stages(200)) == (0.2, 0.2, pytest.approx(0.15), 0.1)
    with pytest.raises(ValueError, match="len\\(values\\) == len\\(boundaries\\) \\+ 1"):
        Piecewise((10,), (1.0,))
    with pytest.raises(ValueError, match="total_steps > warmup_steps"):
        Cosine(1.0, 0.0, total_steps=5, warmup_steps=5)


def test_schedules_reach_the_decision_and_multiply_the_lr_scale() -> None:
    config = GuardConfig.preset(
        "default", schedules={"clip_high": Piecewise((100,), (0.28, 0.2)), "lr_scale": Constant(0.5)}
    )
    guard = Guard(config)
    stream = healthy_stream(120, seed=4)
    decisions = [guard.observe(step, s) for step, s in enumerate(stream)]
    assert decisions[99].controls.clip_high == 0.28 and decisions[100].controls.clip_high == 0.2
    assert decisions[0].controls.clip_low is None and all(d.controls.lr_scale == 0.5 for d in decisions[:10])
    with pytest.raises(ValueError, match="schedules may set"):
        GuardConfig(schedules={"temperature": Constant(1.0)})
