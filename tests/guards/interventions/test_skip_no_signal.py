"""``skip_no_signal``: a batch whose every group has all-equal rewards carries no policy gradient (every
group-relative advantage is 0) and is skipped; such a skip is no poisoned batch, so it never counts toward the
skipped steps in a row that roll back."""

from __future__ import annotations

import math

import pytest

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.decision import decision_action
from rlguard.guards.interventions import SkipNoSignal
from rlguard.guards.interventions.skip_no_signal import NO_SIGNAL
from tests.helpers.guards import step_context
from tests.helpers.synthetic import healthy_stream

ACTING = ("default", "strict", "stable")


def test_a_batch_whose_every_group_has_equal_rewards_is_skipped_and_not_poisoned() -> None:
    p = SkipNoSignal().propose(step_context(7, {"frac_zero_std_groups": 1.0}))
    assert p is not None and p.outcome == "skip" and not p.poisoned and p.reason.startswith(NO_SIGNAL)
    # one group in a hundred with different rewards still carries a policy gradient
    assert SkipNoSignal().propose(step_context(7, {"frac_zero_std_groups": 0.99})) is None
    # a non-finite share is the nonfinite detector's to answer (skip_step); no share is no evidence
    assert SkipNoSignal().propose(step_context(7, {"frac_zero_std_groups": math.nan})) is None
    assert SkipNoSignal().propose(step_context(7, {"loss": 0.1})) is None


@pytest.mark.parametrize("preset", ACTING)
def test_it_acts_in_every_acting_preset_and_not_in_monitor(preset: str) -> None:
    assert "skip_no_signal" in Guard(GuardConfig.preset(preset)).interventions
    assert Guard(GuardConfig.preset("monitor")).interventions == {}


def _poisoned(frac: float = 0.5) -> dict[str, float]:
    return {"loss": math.nan, "nonfinite": 3.0, "frac_zero_std_groups": frac}


def _no_signal() -> dict[str, float]:
    return {"loss": 0.0, "nonfinite": 0.0, "frac_zero_std_groups": 1.0}


def _healthy() -> dict[str, float]:
    return {"loss": 0.1, "nonfinite": 0.0, "frac_zero_std_groups": 0.2}


@pytest.mark.parametrize("preset", ACTING)
def test_skips_without_signal_break_the_row_of_poisoned_skips_that_rolls_back(preset: str) -> None:
    """Rollback and recovery roll back after 3 poisoned batches skipped in a row; batches without signal between
    them break the row (as applied steps did), and many of them in a row never roll back."""
    guard = Guard(GuardConfig.preset(preset, snapshot_interval=1))
    for t in range(10):
        guard.observe(t, _healthy())
    actions = [decision_action(guard.observe(t, _no_signal())) for t in range(10, 40)]
    assert actions == ["skip_step"] * 30
    stream = [_poisoned(), _no_signal(), _poisoned(), _no_signal(), _poisoned(), _no_signal()]
    actions = [decision_action(guard.observe(t, s)) for t, s in enumerate(stream, start=40)]
    assert actions == ["skip_step"] * 6
    # three poisoned in a row roll back, a poisoned batch without signal included (it is poisoned all the same)
    stream = [_poisoned(), _poisoned(1.0), _poisoned(), _poisoned()]
    actions = [decision_action(guard.observe(t, s)) for t, s in enumerate(stream, start=46)]
    assert actions == ["skip_step", "skip_step", "skip_step", "rollback"]


@pytest.mark.parametrize("preset", ACTING)
@pytest.mark.parametrize("seed", range(5))
def test_a_too_hard_start_then_learning_gets_skips_never_a_rollback_or_halt(preset: str, seed: int) -> None:
    """Reward 0 with every group without reward variance for 30 steps, then a run that learns (the healthy stream's
    rising reward): the 30 batches without signal are skipped, and nothing else is done."""
    stream = healthy_stream(200, seed, "rising")
    for s in stream[:30]:
        s.update(reward_mean=0.0, reward_std=0.0, frac_zero_std_groups=1.0, frac_zero_std_solved=0.0, loss=0.0)
    guard = Guard(GuardConfig.preset(preset))
    decisions = [guard.observe(t, s) for t, s in enumerate(stream)]
    assert [d.step for d in decisions if d.outcome == "skip"] == list(range(30))
    assert all(d.reason.startswith(NO_SIGNAL) for d in decisions if d.outcome == "skip")
    assert not [d for d in decisions if d.outcome in ("rollback", "halt")]
