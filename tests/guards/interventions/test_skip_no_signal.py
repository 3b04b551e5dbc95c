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


#: the stats whose size is the update's (the gradient norm, the move from the behaviour policy) or the policy's move
#: from the reference: in a phase without signal only the KL or entropy terms move the policy, if anything does
_UPDATE_SIZE = ("grad_norm", "kl_old", "clip_frac", "kl_ref")


def _too_hard_start(seed: int, scale: float, steps: int = 30) -> list[dict[str, float]]:
    """A healthy rising run whose first ``steps`` batches carry no signal (reward 0, every group all-equal), with the
    update's stats ``scale`` x the learning run's there: 0 is what a run with beta = 0 logs (all advantages 0, no
    gradient), 0.01 the KL term's pull alone."""
    stream = healthy_stream(200, seed, "rising")
    for s in stream[:steps]:
        s.update(reward_mean=0.0, reward_std=0.0, frac_zero_std_groups=1.0, frac_zero_std_solved=0.0, loss=0.0)
        s.update({k: s[k] * scale for k in _UPDATE_SIZE}, ratio_max=1.0 + (s["ratio_max"] - 1.0) * scale)
    return stream


@pytest.mark.parametrize("preset", ACTING)
@pytest.mark.parametrize("scale", [0.0, 0.01])
@pytest.mark.parametrize("seed", range(8))
def test_a_too_hard_start_without_gradient_then_learning_is_never_rolled_back_or_halted(
    preset: str, scale: float, seed: int
) -> None:
    """The update-scale detectors neither learn from nor judge a batch without signal: the first learning steps'
    gradient norms are not compared with the KL term's alone (or with 0)."""
    guard = Guard(GuardConfig.preset(preset))
    decisions = [guard.observe(t, s) for t, s in enumerate(_too_hard_start(seed, scale))]
    assert [d.step for d in decisions if d.outcome == "skip"] == list(range(30))
    assert not [(d.step, d.outcome, d.reason) for d in decisions if d.outcome in ("rollback", "halt")]


@pytest.mark.parametrize("preset", ACTING)
@pytest.mark.parametrize("scale", [0.0, 0.01])
def test_a_gradient_spike_after_a_phase_without_signal_is_still_caught(preset: str, scale: float) -> None:
    """Against the learning steps' own baseline, a 100x gradient norm at step 120 is still a critical spike."""
    stream = _too_hard_start(0, scale)
    stream[120]["grad_norm"] *= 100.0
    guard = Guard(GuardConfig.preset(preset))
    for t, s in enumerate(stream[:120]):
        guard.observe(t, s)
    guard.observe(120, stream[120])
    finding = guard.last_findings.get("grad_norm_spike")
    assert finding is not None and finding.severity == "critical"
