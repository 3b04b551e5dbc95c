"""Each excursion of a detector is its own finding (rlguard.guards.consequence.excursions): the onset of a critical
finding is the start of the excursion that became critical, not the first excursion ever (issue 36, class 2)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlguard.doctor import diagnose
from rlguard.guards.consequence.excursions import Excursion, recovered_incidents
from rlguard.guards.detectors.base import level_shift, rise_onset
from tests.helpers.doctor_logs import shaped_stream, write_trainer_state


def _kl(levels: Callable[[int], float | None], seed: int = 0) -> Callable[[int], float]:
    """KL to the reference near 0.02 with noise, or ``levels(i)`` where it gives one."""
    noise = np.random.default_rng(seed).normal(0, 0.2, 1000)
    return lambda i: level if (level := levels(i)) is not None else 0.02 * math.exp(float(noise[i]))


def _kl_finding(tmp_path: Path, levels: Callable[[int], float | None]):
    d = diagnose(write_trainer_state(shaped_stream(220, 0, kl_ref=_kl(levels)), tmp_path / "trainer_state.json"))
    (kl,) = [f for f in d.findings if f.detector == "kl_ref_blowup"]
    return d, kl


def test_a_recovered_excursion_before_a_blow_up_is_not_the_blow_ups_onset(tmp_path: Path) -> None:
    # KL 1.2 nats (above the 1-nat warning bound) at indices 50-53, back to 0.02; a blow-up to 5 nats from 150 on
    d, kl = _kl_finding(tmp_path, lambda i: 1.2 if 50 <= i < 54 else 5.0 if i >= 150 else None)
    assert kl.severity == "critical" and kl.step == 151, kl  # logs count steps from 1: index 150 is step 151
    first, *_, last = kl.excursions
    assert (first.onset, first.severity, first.outcome) == (51, "warn", "recovered"), kl.excursions
    assert (last.onset, last.severity, last.outcome) == (151, "critical", "unresolved"), kl.excursions
    # the JSON gives each excursion
    doc = json.loads(json.dumps(d.to_dict()))
    (kl_doc,) = [f for f in doc["findings"] if f["detector"] == "kl_ref_blowup"]
    assert [x["onset"] for x in kl_doc["excursions"]] == [x.onset for x in kl.excursions]
    assert set(kl_doc["excursions"][0]) == {"onset", "end", "severity", "severity_step", "outcome", "findings", "alarm"}


def test_a_warning_precursor_in_the_same_excursion_is_not_the_critical_onset(tmp_path: Path) -> None:
    # KL 1.2 nats (a warning) from index 120, then 5 nats (critical) from 170: one episode of findings
    _, kl = _kl_finding(tmp_path, lambda i: 5.0 if i >= 170 else 1.2 if i >= 120 else None)
    assert kl.severity == "critical" and kl.step == 171, kl
    assert [(x.alarm, x.onset, x.severity) for x in kl.excursions] == [(121, 171, "critical")], kl.excursions


def test_a_cusum_alarm_dates_its_onset_to_where_the_cumulative_sum_left_zero(tmp_path: Path) -> None:
    # lengths grow 4% a step from index 120 (the rest of the run's noise: 5%), the reward falls with them: the
    # CUSUM of length_explosion accumulates from the rise's first steps and crosses its warning (15) and critical
    # (40) bounds several steps later; the onset is where it started accumulating (Page 1954), the alarm later
    rows = shaped_stream(
        220,
        0,
        length_mean=lambda i: 200 * 1.04 ** max(i - 120, 0),
        reward_mean=lambda i: 0.5 - 0.004 * max(i - 120, 0),
    )
    d = diagnose(write_trainer_state(rows, tmp_path / "trainer_state.json"))
    (length,) = [f for f in d.findings if f.detector == "length_explosion"]
    (ex,) = [x for x in length.excursions if x.severity == "critical"]
    # index 120 is step 121; the first growing value is index 121 (step 122)
    assert 121 <= ex.onset <= 123 < ex.alarm < ex.severity_step, length.excursions
    assert length.step == ex.onset


def _critical(detector: str, onset: int, end: int) -> Excursion:
    return Excursion(detector, onset, end, "critical", onset, "recovered", end - onset + 1, onset)


def test_a_critical_excursion_is_a_recovered_incident_only_where_the_reward_fell_and_came_back() -> None:
    steps = list(range(1, 201))
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.02, 200)

    def rewards(shape: Callable[[int], float]) -> list[float]:
        return [shape(i) + float(noise[i]) for i in range(200)]

    dip = rewards(lambda i: 0.0 if i >= 150 else 0.3 if 60 <= i < 80 else 0.8)
    early, late = _critical("truncation", 55, 90), _critical("entropy_blowup", 148, 200)
    (incident,) = recovered_incidents(steps, dip, [late, early])
    assert incident.excursion == early and abs(incident.level - 0.8) < 0.02, incident
    assert (incident.fell, incident.recovered) == (61, 81), incident  # index 60 is step 61, 80 is 81
    # a second dip and recovery after the second excursion: two incidents, judged one after the other
    two = rewards(lambda i: 0.0 if i >= 170 else 0.3 if 60 <= i < 80 or 120 <= i < 135 else 0.8)
    middle, last = _critical("kl_ref_blowup", 115, 130), _critical("entropy_blowup", 168, 200)
    got = recovered_incidents(steps, two, [early, middle, last])
    assert [(i.excursion.detector, i.recovered) for i in got] == [("truncation", 81), ("kl_ref_blowup", 136)], got
    # the reward fell and did not come back; it came back, but nothing critical began after; it never fell
    assert recovered_incidents(steps, rewards(lambda i: 0.3 if i >= 60 else 0.8), [early, late]) == []
    assert recovered_incidents(steps[:140], dip[:140], [early]) == []
    assert recovered_incidents(steps, rewards(lambda i: 0.8), [early, late]) == []
    # no level before the excursion (fewer than rule.anchor rewards), or no rewards at all
    assert recovered_incidents(steps, dip, [_critical("truncation", 5, 90), late]) == []
    assert recovered_incidents(steps, [math.nan] * 200, [early, late]) == []


def test_a_reward_that_fell_and_stayed_down_rarely_reads_as_recovered() -> None:
    """A reward that falls by about its margin and stays there (Gaussian 0.5 -> 0.2 with sd 0.1; one prompt's 8
    samples at 0.45 -> 0.15) has windows whose median is back within the margin of the old level by chance: the
    return must also be clearly above the rewards since the fall. Measured over seeds 0-199: 2 false recoveries of
    200 each (1%); with the level alone as the bound, 141 and 128."""
    collapses: dict[str, Callable[[np.random.Generator, int], float]] = {
        "gaussian": lambda rng, i: float((0.2 if i >= 60 else 0.5) + rng.normal(0, 0.1)),
        "one prompt": lambda rng, i: float(rng.binomial(8, 0.15 if i >= 60 else 0.45) / 8),
    }
    for name, reward in collapses.items():
        false = 0
        for seed in range(50):
            rng = np.random.default_rng(seed)
            rewards = [reward(rng, i) for i in range(200)]
            false += bool(
                recovered_incidents(list(range(1, 201)), rewards, [_critical("x", 55, 90), _critical("y", 150, 200)])
            )
        assert false <= 2, (name, false)


def test_the_least_squares_change_point_of_a_level() -> None:
    rng = np.random.default_rng(0)
    step = [float(v) for v in np.where(np.arange(60) >= 40, 0.2, 0.7) + rng.normal(0, 0.1, 60)]
    assert 38 <= level_shift(step, -1.0) <= 42  # type: ignore[operator]
    assert level_shift(step, 1.0) != 40  # only a shift in the direction asked
    assert level_shift([1.0], -1.0) is None and level_shift([1.0, 2.0], -1.0) is None
    assert level_shift([2.0, 1.0, 1.0], -1.0) == 1
    # a drift to a plateau, then a larger shift: dated to the shift into the level the values end at (binary
    # segmentation), not to the drift that a single change point of the whole window picks
    staircase = np.concatenate([np.zeros(60), np.full(40, 1.0), np.full(12, 2.0)]) + rng.normal(0, 0.2, 112)
    assert 99 <= level_shift([float(v) for v in staircase], 1.0) <= 101  # type: ignore[operator]


def _reward_finding(tmp_path: Path, reward: Callable[[int], float], detector: str = "reward_collapse"):
    """The critical excursions of ``detector`` on a 220-step run whose reward climbs from 0.2 to its level 0.7 over
    the first 50 steps (a peak to collapse from), then is ``reward(i)``, plus noise (sd 0.1, a few prompts' pass
    rate)."""
    noise = np.random.default_rng(1).normal(0, 0.1, 220)
    rows = shaped_stream(220, 0, reward_mean=lambda i: (0.2 + 0.01 * i if i < 50 else reward(i)) + float(noise[i]))
    d = diagnose(write_trainer_state(rows, tmp_path / "trainer_state.json"))
    (found,) = [f for f in d.findings if f.detector == detector]
    return d, [x for x in found.excursions if x.severity == "critical"]


def test_a_reward_collapse_is_dated_to_where_the_reward_stepped_down(tmp_path: Path) -> None:
    # a noisy reward steps from 0.7 to 0.35 at index 150 (step 151): the smoothed drawdown is critical 6 steps
    # later; the onset is the least-squares change of level of the rewards since the EWMA was last at its best
    d, (ex,) = _reward_finding(tmp_path, lambda i: 0.35 if i >= 150 else 0.7)
    assert 149 <= ex.onset <= 153 < ex.severity_step, ex
    assert d.onset == ex.onset


def test_a_reward_ramp_is_never_dated_before_it_began(tmp_path: Path) -> None:
    # the reward falls 0.015 a step from index 120 (step 121) to 0.1 at index 160, then holds. Binary segmentation
    # splits a steady ramp into significant steps, the last of them late in the ramp: the onset is no earlier than
    # the ramp's start and no later than where it became critical (a limitation: not the ramp's start)
    _, (ex,) = _reward_finding(tmp_path, lambda i: 0.7 - 0.015 * min(max(i - 120, 0), 40))
    assert 121 <= ex.onset <= ex.severity_step <= 161, ex


def test_a_level_that_recovers_between_two_reward_collapses_is_not_the_second_ones_onset(tmp_path: Path) -> None:
    # the reward falls to 0.2 at indices 80-99 and comes back to 0.7; it falls again from index 150 (step 151): the
    # second collapse is dated to its own step down, not into the first one or the recovery between them
    _, critical = _reward_finding(tmp_path, lambda i: 0.2 if i >= 150 or 80 <= i < 100 else 0.7)
    first, second = critical
    assert 79 <= first.onset <= 82 and first.end < 120, critical
    assert 149 <= second.onset <= 152 < second.severity_step, critical


def test_an_entropy_blow_up_after_a_drift_is_dated_to_the_blow_up(tmp_path: Path) -> None:
    # entropy 0.6 nats, 1.2 from index 100 (a drift: 2x, below entropy_blowup's bounds), 4.0 from index 150 (step
    # 151: a warning, 6.7x), critical once its noise reaches 8x (step 186), the reward lost with it: the onset is the
    # jump into the level it ends at, not the drift before it nor where its noise first crossed the critical ratio
    noise = np.random.default_rng(2).normal(0, 0.15, 220)
    rows = shaped_stream(
        220,
        0,
        entropy=lambda i: (0.6 if i < 100 else 1.2 if i < 150 else 4.0) * math.exp(float(noise[i])),
        reward_mean=lambda i: 0.2 + 0.01 * min(i, 50) if i < 150 else 0.1,
    )
    d = diagnose(write_trainer_state(rows, tmp_path / "trainer_state.json"))
    (blowup,) = [f for f in d.findings if f.detector == "entropy_blowup"]
    (ex,) = [x for x in blowup.excursions if x.severity == "critical"]
    assert 150 <= ex.onset <= 152 < ex.severity_step, blowup.excursions


def test_a_small_elevation_before_a_large_rise_does_not_date_the_rise(tmp_path: Path) -> None:
    # the gradient norm (noise 5%) sits 20% up (4 sigmas) from index 120 and jumps 15x at index 132 (step 133): the
    # CUSUM accumulates from the small elevation (Page's estimate: step 121) and is critical after the jump; the
    # maximum-likelihood change from its baseline, a shift of level fitting better than a ramp, is the jump
    noise = np.random.default_rng(3).normal(0, 0.05, 220)

    def grad_norm(i: int) -> float:
        return 0.5 * (15.0 if i >= 132 else 1.2 if i >= 120 else 1.0) * math.exp(float(noise[i]))

    rows = shaped_stream(220, 0, grad_norm=grad_norm)
    d = diagnose(write_trainer_state(rows, tmp_path / "trainer_state.json"))
    (found,) = [f for f in d.findings if f.detector == "grad_norm_explosion"]
    (ex,) = [x for x in found.excursions if x.severity == "critical"]
    assert 132 <= ex.onset <= 134 < ex.severity_step, found.excursions


def test_the_change_point_of_a_rise_from_a_known_base() -> None:
    rng = np.random.default_rng(4)
    noise = [float(v) for v in rng.normal(0, 0.1, 40)]
    step = [(2.0 if i >= 10 else 0.0) + noise[i] for i in range(40)]
    assert rise_onset(step, 0.0) == 10
    assert rise_onset(step[10:], 0.0) == 0  # risen from its first value: the rise began before it
    # a ramp from index 10, 0.1 a step: dated where it leaves the base, not at its middle (a shift of level's)
    ramp = [0.1 * max(i - 9, 0) + noise[i] for i in range(40)]
    assert 9 <= rise_onset(ramp, 0.0) <= 11  # type: ignore[operator]
    assert level_shift(ramp, 1.0) > 15  # type: ignore[operator]
    # a small elevation (0.3) from index 10, a shift to 3 from index 25: dated to the shift
    bump = [(3.0 if i >= 25 else 0.3 if i >= 10 else 0.0) + noise[i] for i in range(40)]
    assert rise_onset(bump, 0.0) == 25
    assert rise_onset([1.0, 2.0], 0.0) is None and rise_onset([-1.0, -2.0, -3.0], 0.0) is None


def test_a_condition_over_an_absolute_bound_from_the_first_record_is_dated_there(tmp_path: Path) -> None:
    # no learning signal from the start: every group without reward variance, the reward near 0. The share of such
    # groups is judged against absolute bounds (zero_variance_groups); its warm-up (5 rewards: the level that tells
    # solved from failed groups) learns no baseline of the share, so the condition's onset is its first record, not
    # the end of the warm-up (step 6 before)
    rows = shaped_stream(60, 0, frac_zero_std_groups=lambda i: 1.0, reward_mean=lambda i: 0.02)
    d = diagnose(write_trainer_state(rows, tmp_path / "trainer_state.json"))
    (zero,) = [f for f in d.findings if f.detector == "zero_variance_groups"]
    (ex,) = zero.excursions
    assert (ex.onset, ex.severity) == (1, "critical"), zero.excursions
    assert d.onset == 1


def test_an_absolute_condition_that_cleared_does_not_date_a_later_one(tmp_path: Path) -> None:
    # 100% of groups without variance over the first 4 records (inside the warm-up), then 10% for 30 records (past
    # the alarm's hysteresis), then 100% again from index 40: the later condition begins at index 40 (step 41)
    rows = shaped_stream(
        80, 0, frac_zero_std_groups=lambda i: 1.0 if i < 4 or i >= 40 else 0.1, reward_mean=lambda i: 0.02
    )
    d = diagnose(write_trainer_state(rows, tmp_path / "trainer_state.json"))
    (zero,) = [f for f in d.findings if f.detector == "zero_variance_groups"]
    assert [(x.onset, x.severity) for x in zero.excursions] == [(41, "critical")], zero.excursions
