"""The live rule's established reward level (:class:`~rlguard.guards.consequence.level.RewardLevel`) is established
by what the run did before it fell, never by the fall: its floor is the lowest reward seen up to the EWMA's best.

Streams: a reward flat at a level ``c`` (0, slightly above, below 0) past the detector's warm-up, then one record
below it (the healthy ``basile-llama31-8b-grpo`` of ``../shared/doctor_foreign2`` read at every 2nd record: 0 for 13
records, then -0.12): the drawdown detector calls the fall critical (a fall of many of its zero sigmas), and a floor
lowered by that one record made the level "established" by it, so ``default`` rolled the run back. Beside them, real
collapses from a level the run held before it fell, critical at the step the detector itself calls them critical.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.consequence.level import RewardLevel
from rlguard.guards.consequence.rule import ConsequenceRule

RULE = ConsequenceRule()


def _run(rewards: list[float], preset: str, consequence: str = "online", every: int = 1) -> Guard:
    """``rewards`` through a guard of ``preset``, one record every ``every`` optimizer steps."""
    guard = Guard(GuardConfig.preset(preset, consequence=consequence))
    for i, r in enumerate(rewards):
        guard.observe(every * i, {"reward_mean": r})
    return guard


def _reward_events(guard: Guard) -> list[tuple[int, str]]:
    return [(e.step, e.severity) for e in guard.events if e.detector == "reward_collapse"]


def _acted(rewards: list[float], preset: str, every: int = 1) -> list[tuple[int, str]]:
    """The rollbacks and halts of a guard of ``preset`` over ``rewards`` (one record every ``every`` steps)."""
    guard = Guard(GuardConfig.preset(preset))
    decisions = [guard.observe(every * i, {"reward_mean": r}) for i, r in enumerate(rewards)]
    return [(d.step, d.outcome) for d in decisions if d.outcome in ("rollback", "halt")]


@pytest.mark.parametrize(
    ("level", "below", "records"),
    [
        (0.0, 0.12, 25),  # basile-llama31-8b-grpo's first 27 steps, past the detector's warm-up of 20
        (0.0, 0.12, 40),
        (0.0, 0.5, 30),
        (0.05, 0.2, 30),  # a level under 10% of [0, 1], one record below 0
        (-0.5, 0.3, 30),  # a range below 0: the level is the floor
        (-1.0, 0.4, 30),
    ],
)
def test_a_reward_flat_at_a_level_then_one_record_below_it_is_no_collapse_live(
    level: float, below: float, records: int
) -> None:
    """The detector finds the fall critical (the step rule says so); live it is a warning and nothing is rolled
    back: the level was never clearly above the floor of the rewards seen before the fall."""
    rewards = [level] * records + [level - below] + [level] * 30
    assert "critical" in {s for _, s in _reward_events(_run(rewards, "monitor", "step"))}
    for preset in ("monitor", "default", "stable"):
        assert {s for _, s in _reward_events(_run(rewards, preset))} == {"warn"}, preset
        assert _acted(rewards, preset) == [], preset


def _risen_then_fallen(low: float, high: float, seed: int = 0) -> list[float]:
    """A reward that rises from ``low`` to ``high`` over steps 0-39, holds it to step 79, falls back to ``low`` over
    steps 80-89 and stays there (noise sd 0.02)."""
    rng = np.random.default_rng(seed)
    shape = [min(i / 40, 1.0) if i < 80 else max(1 - (i - 80) / 10, 0.0) for i in range(130)]
    return [low + (high - low) * s + float(rng.normal(0, 0.02)) for s in shape]


def _warm_started_fall(seed: int = 0) -> list[float]:
    """A run warm-started at 0.5 (never above its start), falling to 0.1 from step 60."""
    rng = np.random.default_rng(seed)
    return [0.5 - 0.4 * min(max(i - 59, 0) / 10, 1.0) + float(rng.normal(0, 0.03)) for i in range(120)]


@pytest.mark.parametrize(
    "rewards",
    [_risen_then_fallen(0.0, 0.6), _risen_then_fallen(-1.0, -0.2), _warm_started_fall()],
    ids=["risen from 0", "risen from -1", "warm-started at 0.5"],
)
def test_a_collapse_from_a_level_held_before_the_fall_is_critical_when_the_detector_says_so(
    rewards: list[float],
) -> None:
    """The floor comes from before the fall, so a level the run held is established: the live rule's critical
    events are the detector's own (the step rule's), at the same steps, and ``default`` rolls back at the first."""
    step_rule = [e for e in _reward_events(_run(rewards, "monitor", "step")) if e[1] == "critical"]
    assert step_rule
    online = _run(rewards, "monitor")
    assert [e for e in _reward_events(online) if e[1] == "critical"] == step_rule
    assert _acted(rewards, "default")[:1] == [(step_rule[0][0], "rollback")]


def test_the_floor_is_the_lowest_reward_up_to_the_ewmas_best() -> None:
    level = RewardLevel(RULE)
    for r in [0.0] * 13:
        level.push(r)
    level.push(-0.12)  # below the best: the fall's, not the floor's
    assert level.lowest == -0.12 and level.floor() == 0.0 and not level.established()
    for r in [0.0] * 30:  # the EWMA comes back towards 0 from below: never at its best again
        level.push(r)
    assert level.floor() == 0.0 and not level.established()
    # a run that rose from below 0 to a level: the rewards before its best are its range
    risen = RewardLevel(RULE)
    for r in [-0.5] * 10 + [-0.3] * 20:  # EWMA up to -0.3, 0.15 (10% of [-0.5, 1]) above -0.5 from the 7th
        risen.push(r)
    assert risen.floor() == -0.5 and risen.established()
    for r in [-0.9] * 5:  # the fall lowers the lowest seen, not the floor
        risen.push(r)
    assert risen.lowest == -0.9 and risen.floor() == -0.5 and risen.established()
    # a later rise to a new best takes the dip before it into the floor
    for r in [0.2] * 20:
        risen.push(r)
    assert risen.floor() == -0.9
    risen.push(math.nan)  # ignored
    assert risen.floor() == -0.9


def test_a_fall_within_the_first_observations_establishes_no_level() -> None:
    """0 for 3 records, then -0.5 for good, logged every 5 steps (a warm-up of 5 records): the EWMA's best is the
    start, so the fall's own EWMA path (0, -0.1, -0.18, ...) is no level above a floor of -0.5."""
    level = RewardLevel(RULE)
    for r in [0.0] * 3 + [-0.5] * 30:
        level.push(r)
    assert level.floor() == 0.0 and not level.established()
    rewards = [0.0] * 3 + [-0.5] * 30
    assert "critical" not in {s for _, s in _reward_events(_run(rewards, "default", every=5))}
    assert _acted(rewards, "default", every=5) == []


def test_a_resumed_guard_keeps_the_floor() -> None:
    """Saved just after the record below the level (JSON round trip), the resumed guard judges the rest alike; a
    state without the key (written by an earlier version) loads, its floor the lowest reward seen, as it judged."""
    rewards = [0.0] * 30 + [-0.12] + [0.0] * 30
    whole = _run(rewards, "default")
    first = Guard(GuardConfig.preset("default"))
    for step, r in enumerate(rewards[:31]):
        first.observe(step, {"reward_mean": r})
    state = json.loads(json.dumps(first.state_dict()))
    assert state["consequence"]["level"]["lowest_at_best"] == 0.0
    assert state["consequence"]["level"]["lowest"] == -0.12
    resumed = Guard(GuardConfig.preset("default"))
    resumed.load_state_dict(state)
    outcomes = {resumed.observe(step, {"reward_mean": r}).outcome for step, r in enumerate(rewards[31:], start=31)}
    assert resumed.events == whole.events and outcomes == {"step"}
    del state["consequence"]["level"]["lowest_at_best"]
    earlier = Guard(GuardConfig.preset("default"))
    earlier.load_state_dict(state)
    assert earlier.live_rule is not None and earlier.live_rule.level.floor() == -0.12
    state["consequence"]["level"]["lowest_at_best"] = "0"
    with pytest.raises(Exception, match=r"consequence\.level\.lowest_at_best: expected a number"):
        Guard(GuardConfig.preset("default")).load_state_dict(state)
