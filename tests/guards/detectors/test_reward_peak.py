"""``reward_collapse`` judges the drop from the level the reward held at its best, not from the running maximum of
its noise: a long stationary reward gets no critical and few warnings however long, and a real drop after a long
stationary phase is still caught at about the delay it has after a short one."""

from __future__ import annotations

import numpy as np
import pytest

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.detectors.rollouts import RewardCollapse
from rlguard.guards.robust import expected_maximum
from tests.helpers.synthetic import healthy_stream

WARMUP = 20


def _judge(rewards: np.ndarray) -> list[str | None]:
    """Each observation's severity (None: no finding) from a fresh detector, armed after its warm-up."""
    detector = RewardCollapse()
    out: list[str | None] = []
    for i, r in enumerate(rewards.tolist()):
        finding = detector.check(i, {"reward_mean": r}, i >= WARMUP)
        out.append(None if finding is None else finding.severity)
    return out


def test_expected_maximum_is_blom() -> None:
    """Blom's approximation against the exact expected maxima of 2, 10 and 1000 standard normals (0.5642, 1.5388,
    3.2414: Harter 1961's tables), and 0 for one value."""
    assert expected_maximum(1) == 0.0
    for n, exact in ((2, 0.5642), (10, 1.5388), (1000, 3.2414)):
        assert expected_maximum(n) == pytest.approx(exact, abs=0.03)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_long_stationary_reward_gets_no_critical_and_few_warnings(seed: int) -> None:
    """20,000 steps of a stationary Gaussian reward (0.5 +- 0.05). The running maximum of its EWMA overshoots the
    level by about ``expected_maximum(n)`` EWMA sigmas (3.3 sigmas at 2,000 observations, Blom 1958); judged from the
    running maximum, a third of the steps warned and seeds 0-2 went critical 6, 192 and 15 times. From the level,
    a warning needs the EWMA 5 robust sigmas below it: with the sigma estimated from 49 differences (its MAD's
    relative error about 0.17), ``P(Z >= 5 R)``, ``R ~ N(1, 0.17^2)``, is about 1e-4 a step; the bound here, 1% of
    the steps, also allows for the estimate's heavier tail and the windows' correlation (measured 0.02-0.5%)."""
    rewards = 0.5 + 0.05 * np.random.default_rng(seed).standard_normal(20_000)
    severities = _judge(rewards)
    assert "critical" not in severities
    assert severities.count("warn") <= 0.01 * len(rewards)
    # the rate does not grow with the run: the second half warns at most as the first half's bound allows
    assert severities[10_000:].count("warn") <= 0.01 * 10_000


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_drop_after_a_long_stationary_phase_is_critical_at_about_the_short_delay(seed: int) -> None:
    """A drop of 0.25 (5 reward sigmas) over 15 steps after 300 and after 20,000 stationary steps: no finding in
    the last 1,000 stationary steps, and critical at most 3 steps later after the long phase than after the short
    one (the correction, ``expected_maximum`` of the level's observations, is at most 1.5 EWMA sigmas more at
    20,000 observations than at 300, which the EWMA of a drop of 0.25 / 15 a step falls in under 2 steps)."""
    rng = np.random.default_rng(seed)
    delays = []
    for stationary in (300, 20_000):
        rewards = 0.5 + 0.05 * rng.standard_normal(stationary + 100)
        rewards[stationary:] -= 0.25 * np.minimum(np.arange(100) / 15, 1.0)
        severities = _judge(rewards)
        assert all(s is None for s in severities[max(stationary - 1_000, WARMUP) : stationary]), stationary
        delays.append(severities[stationary:].index("critical"))
    short, long = delays
    assert long <= short + 3, delays


def test_a_long_healthy_live_run_is_not_rolled_back() -> None:
    """7,500 steps of a healthy plateau through the live `default` guard: no rollback or halt, and no critical
    `reward_collapse` event."""
    guard = Guard(GuardConfig.preset("default"))
    outcomes = set()
    for step, stats in enumerate(healthy_stream(7_500, seed=3, shape="noisy")):
        outcomes.add(guard.observe(step, stats).outcome)
    assert not outcomes & {"rollback", "halt"}, outcomes
    assert not [e for e in guard.events if e.detector == "reward_collapse" and e.severity == "critical"]
