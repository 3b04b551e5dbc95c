"""The entropy detectors (``rlguard.guards.detectors.entropy``) through a monitoring guard: sharpening while the
reward rises is no collapse, a collapse inside the warm-up is caught, a blow-up towards uniform is critical."""

from __future__ import annotations

from rlguard.guards import Guard, GuardConfig
from tests.helpers.synthetic import healthy_stream


def test_entropy_falling_while_reward_rises_is_not_collapse() -> None:
    """Sharpening: entropy to 30% of its baseline while reward climbs steadily -> no entropy alarm."""
    guard = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(healthy_stream(200, seed=1, shape="rising")):
        stats["entropy"] = 1.0 * (1 - 0.7 * min(step / 150, 1.0))
        stats["reward_mean"] = 0.1 + 0.004 * step
        guard.observe(step, stats)
    assert not [e for e in guard.events if e.detector == "entropy_collapse"]


def test_entropy_collapse_inside_the_warmup_is_still_caught() -> None:
    """Entropy falls to 2% of its start at step 8, inside the 20-step warm-up: the baseline is the warm-up's
    upper quartile, so the collapse is found once the detector is armed."""
    guard = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(healthy_stream(60, seed=7, shape="plateau")):
        if step >= 8:
            stats["entropy"] *= 0.02
        guard.observe(step, stats)
    hits = [e for e in guard.events if e.detector == "entropy_collapse" and e.severity == "critical"]
    assert hits and hits[0].step <= 25, hits


def test_entropy_blowup_towards_uniform_is_critical() -> None:
    """The rasbt ch. 7 runs: entropy 0.3 -> 5+ nats (ln V = 11.9) with the reward falling to 0."""
    guard = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(healthy_stream(120, seed=3, shape="plateau")):
        stats["entropy"] = 0.3 if step < 80 else 0.3 + 0.4 * (step - 79)
        guard.observe(step, stats)
    hits = [e for e in guard.events if e.detector == "entropy_blowup"]
    # >= 2 nats (and 4x) from step 84 (2.3), >= 3 nats (and 8x) at step 86 (3.1): the third finding in a row
    # (patience 3) is critical
    assert [(e.step, e.severity) for e in hits] == [(86, "critical")], hits
