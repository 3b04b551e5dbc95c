"""Guard: detection delay on synthetic failures, silence on healthy runs, the default interventions (skip, rollback,
halt), presets, state round trip, events and bad configuration. Each detector's own behaviour: ``detectors/``; each
intervention's: ``interventions/``; schedules: ``test_schedules.py``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlguard.guards import (
    Guard,
    GuardConfig,
)
from rlguard.guards.decision import decision_action
from tests.helpers.synthetic import FAILURES, SHAPES, failing_stream, healthy_stream

ONSET = 120
STEPS = 220
#: largest delay (steps after onset) allowed before the expected detector raises its first event
MAX_DELAY = 25


@pytest.mark.parametrize("mode", sorted(FAILURES))
def test_each_detector_fires_soon_after_its_onset(mode: str) -> None:
    _, detector = FAILURES[mode]
    for seed in range(3):
        guard = Guard(GuardConfig.preset("monitor"))
        first = None
        for step, stats in enumerate(failing_stream(mode, STEPS, ONSET, seed)):
            decision = guard.observe(step, stats)
            if first is None and any(e.detector == detector for e in decision.events):
                first = step
        assert first is not None, f"{detector} never fired on {mode} (seed {seed})"
        assert ONSET <= first <= ONSET + MAX_DELAY, f"{detector} fired at {first}, onset {ONSET} (seed {seed})"
        # a clear failure ends critical, not just a warning
        assert any(e.detector == detector and e.severity == "critical" for e in guard.events), (mode, seed)


def test_default_preset_raises_no_critical_event_on_healthy_runs() -> None:
    """20 seeds of each healthy shape, 300 steps each: no critical event, never skip/rollback/halt."""
    for shape in SHAPES:
        for seed in range(20):
            guard = Guard(GuardConfig.preset("default"))
            actions = {
                decision_action(guard.observe(step, s))
                for step, s in enumerate(healthy_stream(300, seed, shape))  # type: ignore[arg-type]
            }
            critical = [e for e in guard.events if e.severity == "critical"]
            assert not critical, (shape, seed, critical[:3])
            assert actions <= {"continue", "scale_lr", "set_clip"}, (shape, seed, actions)


def test_nonfinite_step_is_skipped_and_three_in_a_row_roll_back() -> None:
    guard = Guard(GuardConfig.preset("default"))
    stream = healthy_stream(60, seed=2)
    for step, stats in enumerate(stream[:50]):
        assert decision_action(guard.observe(step, stats)) in ("continue", "scale_lr")
    healthy = guard.last_healthy_step
    assert healthy == 49
    bad = dict(stream[50], loss=math.nan, nonfinite=5.0)
    actions = [decision_action(guard.observe(50 + k, bad)) for k in range(4)]
    assert actions == ["skip_step", "skip_step", "skip_step", "rollback"]
    assert guard.events[-1].detector == "action:rollback"


def test_rollbacks_are_limited_then_the_guard_halts() -> None:
    guard = Guard(GuardConfig.preset("default", interventions={"rollback": {"max_rollbacks": 1}}))
    stream = healthy_stream(40, seed=3)
    for step, stats in enumerate(stream[:30]):
        guard.observe(step, stats)
    bad = dict(stream[30], nonfinite=1.0)
    actions = [decision_action(guard.observe(30 + k, bad)) for k in range(8)]
    assert actions[:4] == ["skip_step", "skip_step", "skip_step", "rollback"]
    assert "halt" in actions[4:]
    assert "rollbacks did not help" in guard.report() or any(e.detector == "action:halt" for e in guard.events)


def test_state_round_trip_continues_with_identical_decisions(tmp_path: Path) -> None:
    stream = failing_stream("entropy_collapse", 200, 110, seed=5)
    whole = Guard(GuardConfig.preset("default"))
    expected = [whole.observe(step, s) for step, s in enumerate(stream)]

    first = Guard(GuardConfig.preset("default"))
    for step, s in enumerate(stream[:100]):
        first.observe(step, s)
    saved = json.loads(json.dumps(first.state_dict()))  # must survive JSON, as in a checkpoint
    resumed = Guard(GuardConfig.preset("default"))
    resumed.load_state_dict(saved)
    got = [resumed.observe(step, s) for step, s in enumerate(stream[100:], start=100)]
    assert got == expected[100:]
    assert [e.to_dict() for e in resumed.events] == [e.to_dict() for e in whole.events]
    assert any(decision_action(d) != "continue" for d in got)  # the tail is not trivially quiet


def test_events_are_appended_to_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "run" / "events.jsonl"
    guard = Guard(GuardConfig.preset("default", events_path=str(path)))
    for step, s in enumerate(failing_stream("grad_spike", 60, 40, seed=6)):
        guard.observe(step, s)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [e.to_dict() for e in guard.events]
    # the lone spike at 40 (x200, back at once): a warning by consequence whose step is skipped, both written
    assert any(r["detector"] == "grad_norm_spike" and r["severity"] == "warn" and r["step"] == 40 for r in lines)
    assert any(r["detector"] == "action:skip_step" and r["step"] == 40 for r in lines)


def test_monitor_preset_never_acts() -> None:
    guard = Guard(GuardConfig.preset("monitor"))
    actions = {
        decision_action(guard.observe(step, s)) for step, s in enumerate(failing_stream("nonfinite", 50, 30, seed=0))
    }
    assert actions == {"continue"}
    assert any(e.detector == "nonfinite" for e in guard.events)


def test_a_guard_that_only_observes_keeps_no_snapshot() -> None:
    """It never rolls back, so a snapshot would be host memory (12 bytes a parameter under AdamW) spent for nothing."""
    stream = failing_stream("grad_spike", 30, 100, seed=1)
    acting, observing = Guard(GuardConfig()), Guard(GuardConfig(observe_only=True))
    assert sum(acting.observe(step, s).snapshot for step, s in enumerate(stream)) > 0
    assert not any(observing.observe(step, s).snapshot for step, s in enumerate(stream))


def test_bad_config_names_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="unknown guard preset 'lenient'; presets: monitor, default, strict"):
        GuardConfig.preset("lenient")
    with pytest.raises(ValueError, match=r"unknown detector\(s\) \['entropy'\]; registered: .*entropy_collapse"):
        Guard(GuardConfig(detectors={"entropy": {}}))
    with pytest.raises(
        ValueError, match=r"detectors\['grad_norm_spike'\]: unknown field\(s\) \['warn_factr'\].*warn_factor"
    ):
        Guard(GuardConfig(detectors={"grad_norm_spike": {"warn_factr": 2.0}}))
    with pytest.raises(ValueError, match="need 1 < warn_factor <= critical_factor"):
        Guard(GuardConfig(detectors={"grad_norm_spike": {"warn_factor": 30.0}}))
    guard = Guard(GuardConfig.preset("default"))
    guard.observe(5, {})
    with pytest.raises(ValueError, match="step must increase: got 5 after 5"):
        guard.observe(5, {})


def test_detectors_can_be_switched_off() -> None:
    guard = Guard(GuardConfig(detectors={"nonfinite": None}))
    assert "nonfinite" not in guard.detectors
    for step, s in enumerate(failing_stream("nonfinite", 40, 30, seed=0)):
        guard.observe(step, s)
    assert not any(e.detector == "nonfinite" for e in guard.events)
