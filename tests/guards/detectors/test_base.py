"""What every detector does (``rlguard.guards.detectors.base``): its warm-up and patience count the steps that carry
its stats, so sparse stats are caught alike; absolute bounds act from the first logged step; its one-line summary
states its default thresholds."""

from __future__ import annotations

import pytest

from rlguard.guards import Guard, GuardConfig
from tests.helpers.synthetic import FAILURES, failing_stream, healthy_stream, sparse_stream


@pytest.mark.parametrize("mode", ["too_hard", "reward_collapse", "truncation", "repetition"])
def test_sparse_generation_stats_are_caught_alike_every_1_2_or_4_steps(mode: str) -> None:
    """A detector counts the steps that carry its stats: with them on every 2nd or 4th step the failure is found
    at critical, not lost to 'clean' steps that reset its streak, and at most ``(patience + 1) x every`` steps
    later (the failures ramp in steps, so they take fewer observations when sparser)."""
    _, detector = FAILURES[mode]
    delays = {}
    for every in (1, 2, 4):
        guard = Guard(GuardConfig.preset("monitor"))
        # plateau: a rising reward would give the 50-observation baseline a wider spread when it spans 200 steps
        for step, stats in enumerate(sparse_stream(failing_stream(mode, 400, 240, seed=0, shape="plateau"), every)):
            guard.observe(step, stats)
        hits = [e for e in guard.events if e.detector == detector and e.severity == "critical"]
        assert hits, (mode, every, guard.events[:5])
        delays[every] = hits[0].step - 240
    patience = Guard(GuardConfig.preset("monitor")).detectors[detector].patience
    for every in (2, 4):
        assert delays[every] <= delays[1] + (patience + 1) * every, delays


def test_warmup_counts_observations_not_steps() -> None:
    """zero_variance_groups has a warm-up of 10 observations: with its stat every 4th step, a run that is
    too hard from step 0 is found after 10 + 3 observations (step 48), not at step 12."""
    guard = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(sparse_stream(failing_stream("too_hard", 100, 0, seed=1), 4)):
        guard.observe(step, stats)
    first = next(e for e in guard.events if e.detector == "zero_variance_groups")
    assert first.step == 4 * 12, first
    assert guard.observations()["zero_variance_groups"] == 25


@pytest.mark.parametrize(
    ("stat", "value", "detector"),
    [("kl_ref", 10833.0, "kl_ref_blowup"), ("length_mean", 1.0, "length_collapse")],
)
def test_absolute_bounds_catch_a_broken_run_from_its_first_logged_step(stat: str, value: float, detector: str) -> None:
    guard = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(healthy_stream(10, seed=5)):
        stats[stat] = value
        guard.observe(step, stats)
    hits = [e for e in guard.events if e.detector == detector and e.severity == "critical"]
    patience = guard.detectors[detector].patience
    assert hits and hits[0].step == patience - 1, (hits, guard.events)


def test_detector_summaries_state_their_default_thresholds() -> None:
    """The one-line summaries (README, `rlguard detectors`) must not drift from the defaults."""
    from rlguard.guards.registry import detector_registry

    keys: tuple[str, ...]
    keys = ("warn_factor", "critical_factor", "warn", "critical", "warn_ratio", "critical_ratio", "floor_ratio")
    keys += ("warn_h", "critical_h", "warn_drop", "critical_drop", "warn_above", "critical_above", "margin")
    for name, cls in detector_registry().items():
        for key, value in cls.defaults().items():
            if key in keys and isinstance(value, float | int) and value:
                assert f"{value:g}" in cls.summary, (name, key, value, cls.summary)
