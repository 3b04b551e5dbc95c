"""``LRBackoff``: the learning rate halves on trouble, not again within its cooldown, and recovers when quiet."""

from __future__ import annotations

from rlguard.guards.events import Finding
from rlguard.guards.interventions import LRBackoff
from tests.helpers.guards import step_context


def test_lr_backoff_halves_then_recovers_after_a_quiet_period() -> None:
    lr = LRBackoff(factor=0.5, cooldown=10, quiet_steps=20, recover_factor=2.0)
    trouble = {"kl_old_blowup": Finding("warn", 1.0, 0.5, "x")}
    scales = []
    for step in range(100):
        p = lr.propose(step_context(step, {}, trouble if step in (5, 8, 16) else None))
        assert p is not None and p.controls.get("lr_scale") is not None
        scales.append(p.controls.get("lr_scale"))
    # backoff at 5 (x0.5), 8 is inside the cooldown, 16 backs off again (x0.25)
    assert scales[5] == 0.5 and scales[8] == 0.5 and scales[16] == 0.25
    # recovery: 20 quiet steps after the last trouble (16) -> 0.5 at 36, then 1.0 at 56, and stays
    assert scales[35] == 0.25 and scales[36] == 0.5 and scales[55] == 0.5 and scales[56] == 1.0
    assert scales[-1] == 1.0
