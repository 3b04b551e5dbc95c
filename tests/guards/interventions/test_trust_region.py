"""The controllers that keep a run going (issue 15): the trust region on the step size, rollbacks that learn, the
``stable`` preset, and x5 / x10 learning rates on the tiny model (clip-higher: ``test_clip_higher.py``; recovery:
``test_recovery.py``)."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from typer.testing import CliRunner

from rlguard.bench.collapse import RunConfig, Stressor, run_one
from rlguard.cli import app
from rlguard.guards import Controls, Decision, Guard, GuardConfig
from rlguard.guards.actuation import TorchActuator, apply_decision
from rlguard.guards.decision import decision_action, logged_action
from rlguard.guards.interventions.clip_higher import ClipHigher
from rlguard.guards.interventions.recovery import Recovery
from rlguard.guards.interventions.trust_region import TrustRegion, measures_update
from tests.helpers.guards import healthy_steps, poisoned_steps, stable_guard, step_context

LIMIT = 0.02  # TrustRegion's default update_ratio limit


def _plant(gains: list[float], seed: int = 0) -> tuple[list[float], list[float]]:
    """A synthetic training loop: the update of step t has size ``gain_t * scale_(t-1) * noise`` (Adam: the
    update is proportional to the LR), reported into step t's stats. Returns the signals and the scales."""
    rng = random.Random(seed)
    tr = TrustRegion()
    scale, signals, scales = 1.0, [], []
    for t, gain in enumerate(gains):
        signal = gain * scale * math.exp(rng.gauss(0.0, 0.2))
        proposal = tr.propose(step_context(t, {"update_ratio": signal}))
        assert proposal is not None and proposal.controls.get("lr_scale") is not None
        scale = proposal.controls.get("lr_scale")  # type: ignore[assignment]  # checked not None above
        signals.append(signal)
        scales.append(scale)
    return signals, scales


def test_trust_region_keeps_a_five_times_too_large_step_in_its_band() -> None:
    signals, scales = _plant([5 * LIMIT] * 300)
    assert signals[0] > 4 * LIMIT  # the first update is measured after it happened
    settled = signals[3:]
    in_band = [LIMIT / 4 <= s <= LIMIT for s in settled]
    assert sum(in_band) / len(settled) >= 0.9, sorted(settled)[-10:]
    assert max(settled) < 1.5 * LIMIT
    assert 0.05 < scales[-1] < 0.25  # about limit / gain, never at min_scale


def test_trust_region_follows_a_spike_and_recovers_slowly_to_the_configured_lr() -> None:
    gains = [0.25 * LIMIT] * 20 + [10 * LIMIT] * 40 + [0.1 * LIMIT] * 300
    signals, scales = _plant(gains)
    assert scales[19] == 1.0  # healthy: never above the configured LR, untouched
    assert scales[21] <= 0.15  # one step after the spike: cut by about the overshoot
    assert max(signals[23:60]) < 1.5 * LIMIT
    assert scales[62] < 0.2  # recovery is slow: not within 2 steps
    assert scales[-1] == 1.0  # and complete, capped at the configured LR


def test_trust_region_never_acts_on_a_healthy_signal() -> None:
    signals, scales = _plant([0.4 * LIMIT] * 200)
    assert max(signals) < LIMIT
    assert set(scales) == {1.0}
    tr = TrustRegion()
    proposals = [tr.propose(step_context(t, {"update_ratio": 0.4 * LIMIT, "kl_old": 0.0})) for t in range(50)]
    assert all(p is not None and logged_action(p) == "continue" for p in proposals)


def test_trust_region_cut_lands_on_the_limit_by_the_signal_order() -> None:
    tr = TrustRegion(limits=(("kl_old", 0.01, 2.0),))
    p = tr.propose(step_context(0, {"kl_old": 0.04}))  # 4x over a quadratic signal: the step halves
    assert (
        p is not None and logged_action(p) == "scale_lr" and p.controls.get("lr_scale") == pytest.approx(0.5, rel=1e-12)
    )
    p = tr.propose(step_context(1, {"kl_old": 0.0}))  # on-policy zero: no evidence, the scale holds
    assert (
        p is not None and logged_action(p) == "continue" and p.controls.get("lr_scale") == pytest.approx(0.5, rel=1e-12)
    )
    p = tr.propose(step_context(2, {"kl_old": 1e6}))  # at most max_cut per step
    assert p is not None and p.controls.get("lr_scale") == pytest.approx(0.5 / 10, rel=1e-12)


def test_rollback_lowers_the_lr_for_good() -> None:
    tr = TrustRegion()
    tr.on_rollback(5)
    p = tr.propose(step_context(6, {"update_ratio": 1e-4}))
    assert (
        p is not None
        and logged_action(p) == "scale_lr"
        and p.controls.get("lr_scale") == 0.5
        and "rollback at step 5" in p.reason
    )
    for t in range(7, 1000):  # a long healthy stretch recovers to the lowered cap, not beyond
        p = tr.propose(step_context(t, {"update_ratio": 1e-4}))
        assert p is not None and p.controls.get("lr_scale") is not None and p.controls.get("lr_scale") <= 0.5  # type: ignore[operator]  # checked not None before
    p = tr.propose(step_context(1000, {"update_ratio": 0.7 * LIMIT}))  # the limit is 0.7x too: at it, the scale holds
    assert p is not None and logged_action(p) == "continue" and p.controls.get("lr_scale") == 0.5
    p = tr.propose(step_context(1001, {"update_ratio": 1.4 * LIMIT}))  # 2x over the tightened limit: halves
    assert p is not None and p.controls.get("lr_scale") == pytest.approx(0.25, rel=1e-12)


def test_guard_rollback_lowers_the_lr_for_good_and_says_so() -> None:
    guard = stable_guard()
    assert healthy_steps(guard, range(10)) == [1.0] * 10
    assert poisoned_steps(guard, range(10, 14)) == ["skip_step"] * 3 + ["rollback"]
    scales = healthy_steps(guard, range(14, 400))
    assert max(scales) == 0.5 and scales[0] == 0.5
    lr_events = [e for e in guard.events if e.detector == "action:scale_lr"]
    assert [e.step for e in lr_events] == [14] and "rollback at step 13" in lr_events[0].message


def test_a_chronic_mismatch_alarm_leaves_snapshots_healthy_under_stable_only() -> None:
    # a rollout engine that is off from the first step: mismatch_growth critical throughout (mean |log-prob gap|
    # 0.3 >= its 0.16 bound). Under `stable` the steps stay healthy (snapshots, something to roll back to), the
    # mismatch remedy switches a rollout correction on and the LR stays (no consequence followed); under `default`
    # no step is healthy and the alarm itself rolls back.
    def run(preset: str) -> tuple[Guard, list[Decision]]:
        guard = Guard(GuardConfig.preset(preset, snapshot_interval=1))
        stats = {"loss": 0.1, "update_ratio": 1e-4, "nonfinite": 0.0, "mismatch_logp_abs_mean": 0.3}
        return guard, [guard.observe(t, stats) for t in range(12)]

    guard, decisions = run("stable")
    assert guard.alarms().get("mismatch_growth") == "critical"
    assert guard.last_healthy_step == 11 and sum(d.snapshot for d in decisions) == 12
    assert {decision_action(d) for d in decisions} == {"continue", "set_clip"}
    assert decisions[-1].controls.lr_scale == 1.0 and decisions[-1].controls.rollout_is_cap == 2.0
    guard, decisions = run("default")
    assert guard.last_healthy_step is None and not any(d.snapshot for d in decisions)
    assert "rollback" in {decision_action(d) for d in decisions} or "halt" in {decision_action(d) for d in decisions}


def test_stable_does_not_roll_back_a_policy_that_converged_on_what_it_learned() -> None:
    # reward 0.3 -> 0.9 while the entropy falls to 3 % of its start: a task with one right answer, learned.
    # `default` calls the entropy critical below 5 % of its baseline whatever the reward does (and rolls back);
    # `stable` has no such floor: only warn while the reward is above its early level.
    def worst(preset: str, reward_end: float) -> str | None:
        guard = Guard(GuardConfig.preset(preset))
        worst_seen = None
        for t in range(120):
            frac = min(t / 80, 1.0)
            stats = {"entropy": 2.5 * (1 - 0.97 * frac), "reward_mean": 0.3 + (reward_end - 0.3) * frac}
            guard.observe(t, stats)
            level = guard.alarms().get("entropy_collapse")
            if level == "critical" or (level == "warn" and worst_seen is None):
                worst_seen = level
        return worst_seen

    assert worst("default", 0.9) == "critical"
    assert worst("stable", 0.9) in (None, "warn")
    assert worst("stable", 0.1) == "critical"  # the same entropy with the reward falling: a collapse
    recovery = Guard(GuardConfig.preset("stable")).interventions["recovery"]
    assert isinstance(recovery, Recovery) and "entropy_collapse" in recovery.on
    assert "mismatch_growth" not in recovery.on and "mismatch_growth" in recovery.ignore


def test_healthy_despite_names_must_be_detectors() -> None:
    with pytest.raises(ValueError, match=r"healthy_despite names unknown detectors \['mismatch'\]"):
        Guard(GuardConfig(healthy_despite=("mismatch",)))


def test_new_controllers_are_opt_in_and_the_stable_preset_turns_them_on() -> None:
    names = {"trust_region", "entropy_control", "recovery"}
    assert not names & set(Guard(GuardConfig.preset("default")).interventions)
    assert not names & set(Guard(GuardConfig.preset("strict")).interventions)
    stable = Guard(GuardConfig.preset("stable"))
    assert names <= set(stable.interventions) and not {"rollback", "halt"} & set(stable.interventions)
    assert measures_update(stable) and not measures_update(Guard(GuardConfig.preset("default")))
    assert not measures_update(Guard(GuardConfig(interventions={"trust_region": {"limits": (("kl_old", 0.05, 2.0),)}})))


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (TrustRegion, {"limits": (("kl_old", 0.0, 2.0),)}, r"limit > 0 and order > 0; got \('kl_old', 0.0, 2.0\)"),
        (TrustRegion, {"band": 1.0}, "band=1.0"),
        (TrustRegion, {"recover_factor": 0.9}, "recover_factor=0.9"),
        (ClipHigher, {"factor": 1.0}, "factor=1.0"),
        (Recovery, {"probation": 0}, "probation=0"),
    ],
)
def test_bad_parameters_are_refused(cls: type, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize("multiplier", [5.0, 10.0])
def test_tiny_model_at_a_high_lr_finishes_without_collapse_under_the_stable_guard(multiplier: float) -> None:
    stressor = Stressor("high_lr", lr_multiplier=multiplier)
    guarded = run_one(RunConfig(objective="grpo", guard="stable", stressor=stressor, seed=0, iterations=30))
    assert not guarded.verdict.collapsed, guarded.verdict
    assert not guarded.halted and len(guarded.rewards) == 30
    if multiplier == 10.0:  # the same run without the guard collapses: the test can fail
        unguarded = run_one(RunConfig(objective="grpo", guard="off", stressor=stressor, seed=0, iterations=30))
        assert unguarded.verdict.collapsed and unguarded.verdict.reason == "reward"


@pytest.mark.parametrize("owns_step", [True, False])
def test_actuator_measures_the_relative_update_whoever_steps(owns_step: bool) -> None:
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, 0.0, 4.0]]))  # ||theta|| = 5
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    actuator = TorchActuator(model, optimizer, owns_step=owns_step, measure_update=True)
    assert "update_ratio" in actuator.capabilities
    model.weight.grad = torch.tensor([[1.0, 2.0, 2.0]])  # ||g|| = 3; the step at LR x0.5 moves 0.05 * 3 = 0.15
    apply_decision(Decision(step=0, controls=Controls(lr_scale=0.5)), actuator)
    if not owns_step:  # the trainer steps, then the callback finishes the step
        optimizer.step()
        actuator.finish_step()
    assert actuator.take_update_ratio() == pytest.approx(0.15 / 5.0, rel=1e-6)
    assert actuator.take_update_ratio() is None  # taken once
    assert optimizer.param_groups[0]["lr"] == 0.1
    model.weight.grad = torch.ones(1, 3)
    apply_decision(Decision(step=1, outcome="skip"), actuator)  # a dropped update is not measured
    if not owns_step:
        optimizer.step()
        actuator.finish_step()
    assert actuator.take_update_ratio() is None


def test_rlguard_detectors_names_the_presets_of_each_intervention() -> None:
    result = CliRunner().invoke(app, ["detectors", "--json"])
    assert result.exit_code == 0
    presets = {r["name"]: r["presets"] for r in json.loads(result.stdout)["interventions"]}
    assert presets["trust_region"] == presets["entropy_control"] == presets["recovery"] == ["stable"]
    assert presets["rollback"] == presets["halt"] == ["default", "strict"]
    assert presets["skip_step"] == ["default", "strict", "stable"]


def test_controller_state_survives_a_checkpoint_round_trip() -> None:
    guard = stable_guard()
    healthy_steps(guard, range(10))
    poisoned_steps(guard, range(10, 14))  # a rollback: the trust region's cap is now 0.5
    guard.observe(14, {"loss": 0.1, "update_ratio": 0.1, "nonfinite": 0.0})  # and a cut
    resumed = stable_guard()
    resumed.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    tr, tr2 = guard.interventions["trust_region"], resumed.interventions["trust_region"]
    assert isinstance(tr, TrustRegion) and isinstance(tr2, TrustRegion)
    assert (tr2.scale, tr2.cap) == (tr.scale, tr.cap) and tr.cap == 0.5 and tr.scale < 0.5
    assert healthy_steps(resumed, range(15, 60)) == healthy_steps(guard, range(15, 60))


def test_steps_that_only_change_a_control_are_healthy_and_can_be_rolled_back_to() -> None:
    guard = stable_guard()
    for t in range(10):  # the clip controller flips the range every step (off-policy KL high, on-policy ~0)
        decision = guard.observe(t, {"loss": 0.1, "nonfinite": 0.0, "kl_old": 0.1 if t % 2 else 1e-6})
        assert decision_action(decision) == ("set_clip" if t > 0 else "continue")
    assert guard.last_healthy_step == 9 and guard.events
    assert poisoned_steps(guard, range(10, 14))[-1] == "rollback"  # not "halt: no healthy snapshot"
