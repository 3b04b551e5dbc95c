"""The rollout detectors (``rlguard.guards.detectors.rollouts``) through a monitoring guard: zero-variance groups
tell too easy from too hard, and a slow length drift is judged against the early baseline and the reward."""

from __future__ import annotations

import math

from rlguard.guards import Guard, GuardConfig
from tests.helpers.synthetic import failing_stream, healthy_stream

ONSET = 120


def test_zero_variance_groups_tells_too_easy_from_too_hard() -> None:
    for mode, word in (("too_easy", "too easy"), ("too_hard", "too hard")):
        guard = Guard(GuardConfig.preset("monitor"))
        for step, stats in enumerate(failing_stream(mode, 160, ONSET, seed=0)):
            guard.observe(step, stats)
        messages = [e.message for e in guard.events if e.detector == "zero_variance_groups"]
        assert messages and all(word in m for m in messages), (mode, messages)


def test_slow_length_drift_is_caught_against_the_early_baseline() -> None:
    """Lengths growing 0.8% a step with a flat reward: a warning first; critical only once the sustained rise
    (CUSUM >= 40) is also 2x the early baseline (ln 2 / ln 1.008 ~ 87 steps), never on the CUSUM alone."""
    guard = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(healthy_stream(300, seed=6, shape="plateau")):
        stats["length_mean"] = 200.0 * 1.008**step * math.exp(0.03 * math.sin(3 * step))
        guard.observe(step, stats)
    hits = [e for e in guard.events if e.detector == "length_explosion"]
    assert hits and hits[0].severity == "warn" and hits[0].step <= 80, hits
    critical = [e for e in hits if e.severity == "critical"]
    # not before 2x (step 87); measured 122, where the CUSUM (its winsorized baseline catching up) is >= 40 again
    assert critical and 87 <= critical[0].step <= 130, hits


def test_length_drift_with_reward_falling_is_critical() -> None:
    guard = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(healthy_stream(200, seed=6, shape="plateau")):
        stats["length_mean"] = 200.0 * 1.02 ** max(step - 60, 0)
        stats["reward_mean"] = 0.5 - 0.004 * max(step - 60, 0)
        guard.observe(step, stats)
    hits = [e for e in guard.events if e.detector == "length_explosion" and e.severity == "critical"]
    # 2x the early baseline after ln 2 / ln 1.02 = 35 steps; a recent reward median below the early one
    assert hits and 90 <= hits[0].step <= 110, hits
