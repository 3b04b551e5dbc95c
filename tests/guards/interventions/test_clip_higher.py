"""Clip-higher on entropy collapse (``ClipHigher``): the upper clip bound widens on a critical collapse, never
on warnings, and narrows back once the collapse is over."""

from __future__ import annotations

import pytest

from rlguard.guards import Finding
from rlguard.guards.decision import logged_action
from rlguard.guards.interventions.clip_higher import ClipHigher
from tests.helpers.guards import step_context


def test_entropy_control_widens_clip_high_on_critical_collapse_and_narrows_back() -> None:
    ec = ClipHigher()
    critical = {"entropy_collapse": Finding("critical", 0.1, 0.2, "entropy 0.1 is 10% of the run's baseline")}
    warn = {"entropy_collapse": Finding("warn", 0.4, 0.5, "entropy 0.4 is 40%")}
    scales: list[float] = []
    for t in range(40):
        p = ec.propose(step_context(t, {}, warn if t < 10 else critical if t < 30 else {}))
        assert p is not None and p.controls.get("clip_high_scale") is not None
        scales.append(p.controls.get("clip_high_scale"))  # type: ignore[arg-type]  # checked not None above
    assert scales[:10] == [1.0] * 10  # warn findings: healthy runs reach them
    assert scales[10] == pytest.approx(1.2) and scales[15] == pytest.approx(1.44) and max(scales) == scales[15]
    tail = [ec.propose(step_context(t, {})) for t in range(40, 100)]
    assert [p.controls.get("clip_high_scale") for p in tail if p is not None][-1] == 1.0
    assert sum(p is not None and logged_action(p) == "set_clip" for p in tail) == 2
