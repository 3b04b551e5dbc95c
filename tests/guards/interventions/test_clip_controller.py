"""``ClipController``: the clip range is steered until the off-policy KL sits in its target band."""

from __future__ import annotations

import math

from rlguard.guards.interventions import ClipController
from tests.helpers.guards import step_context


def test_clip_controller_converges_to_its_target_on_a_synthetic_ratio_process() -> None:
    """kl_old grows with the clip range: kl = 0.8 * eps^2 * noise; eps = 0.3 * scale. The controller must bring
    kl into [target / tol, target * tol] and keep it there."""
    import random

    rng = random.Random(0)
    ctl = ClipController(metric="kl_old", target=0.01, tolerance=1.5, factor=1.2, min_scale=0.05, max_scale=2.0)
    scale, kls = 1.0, []
    for step in range(300):
        eps = 0.3 * scale
        kl = 0.8 * eps**2 * math.exp(rng.gauss(0, 0.1))
        kls.append(kl)
        p = ctl.propose(step_context(step, {"kl_old": kl}))
        assert p is not None and p.controls.get("clip_scale") is not None
        scale = p.controls.get("clip_scale")  # type: ignore[assignment]  # checked not None above
    assert kls[0] > 0.01 * 1.5  # it starts outside the band
    tail = kls[-100:]
    inside = sum(0.01 / 1.5 / 1.3 <= k <= 0.01 * 1.5 * 1.3 for k in tail) / len(tail)
    assert inside >= 0.95, inside
    # the fixed point of 0.8 (0.3 s)^2 = 0.01 is s = 0.373
    assert 0.25 < scale < 0.55
