"""PeakHistory answers established_peak at any position exactly as the rule's definition, computed naively."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from rlguard.guards.consequence.peak import PeakHistory
from rlguard.guards.consequence.rule import ConsequenceRule, established_peak
from rlguard.guards.robust import RollingWindow
from tests.helpers.rewards import reward_series as _series

RULE = ConsequenceRule()


def _reference(rewards: list[float], before: int, rule: ConsequenceRule) -> bool:
    """The rule's definition, one pass per position: the start (up to the EWMA's best), the range, the EWMA and its
    margin from the successive differences (robust sigma by median and MAD, else mean absolute deviation; root mean
    square)."""
    seen = [r for r in rewards[:before] if math.isfinite(r)]
    every = sorted(r for r in rewards if math.isfinite(r))
    if len(seen) < rule.anchor + rule.peak_observations:
        return False
    path, ewma = [], seen[0]
    for r in seen:
        ewma = (1 - rule.alpha) * ewma + rule.alpha * r
        path.append(ewma)
    best = max(i for i, e in enumerate(path) if e == max(path))  # the EWMA's last observation at its best
    start = statistics.median(seen[: min(rule.anchor, best + 1)])
    span = max(every[int(0.95 * (len(every) - 1))], 1.0) - min(every[int(0.05 * (len(every) - 1))], 0.0)
    diffs = [b - a for a, b in itertools.pairwise(seen)]
    med = statistics.median(diffs)
    dev = [abs(d - med) for d in diffs]
    robust = 1.4826 * statistics.median(dev)
    if robust == 0.0:
        robust = math.sqrt(math.pi / 2) * sum(dev) / len(dev)
    total = 0.0
    for d in diffs:
        total += d * d
    noise = max(robust, math.sqrt(total / len(diffs))) / math.sqrt(2)
    margin = max(rule.peak_sigmas * noise * math.sqrt(rule.alpha / (2 - rule.alpha)), rule.peak_share * span)
    ewma, above = seen[0], 0
    for r in seen:
        ewma = (1 - rule.alpha) * ewma + rule.alpha * r
        above += ewma > start + margin
    return above >= rule.peak_observations


@pytest.mark.parametrize("kind", ["quantized", "rise_fall", "noise"])
@pytest.mark.parametrize("seed", range(4))
def test_peak_history_matches_the_definition_at_every_position(kind: str, seed: int) -> None:
    rule = ConsequenceRule()
    rewards = _series(kind, seed)
    history = PeakHistory(rewards, rule)
    got = [history.established(before) for before in range(len(rewards) + 1)]
    want = [_reference(rewards, before, rule) for before in range(len(rewards) + 1)]
    assert got == want
    assert any(want) or kind == "noise"  # the cases exercise both answers
    assert established_peak(rewards, len(rewards), rule) == want[-1]


def test_peak_history_of_a_log_without_rewards() -> None:
    history = PeakHistory([math.nan] * 30, ConsequenceRule())
    assert not history.established(30)


@pytest.mark.parametrize("kind", ["quantized", "noise"])
def test_robust_sigma_of_each_prefix_is_the_rolling_windows(kind: str) -> None:
    """The noise of the prefix's differences, exactly (quantized rewards: MAD 0, the mean deviation instead)."""
    history = PeakHistory(_series(kind, 7), ConsequenceRule())
    diffs = history.diffs.tolist()
    mads = [statistics.median(abs(d - statistics.median(diffs[:c])) for d in diffs[:c]) for c in range(1, len(diffs))]
    assert kind != "quantized" or mads.count(0.0) > len(mads) // 2  # the fallback is exercised
    for count in range(1, len(diffs) + 1):
        assert history._robust_sigma(count) == RollingWindow(count, diffs[:count]).sigma()


@pytest.mark.parametrize("first", [1, 3, 5])
def test_a_fall_within_the_run_start_establishes_no_peak(first: int) -> None:
    """0 for ``first`` records, then -0.5 for good: the median of the first 10 records was the fallen level, so the
    EWMA's own way down from 0 counted as "clearly above the start" (a peak made by the fall it is asked about).
    The start is taken from the records up to the EWMA's best: 0, and nothing is above it."""
    rewards = [0.0] * first + [-0.5] * (60 - first)
    assert not established_peak(rewards, len(rewards), RULE)
    assert not PeakHistory(rewards, RULE).established(len(rewards))


def test_a_peak_the_run_rose_to_before_falling_is_established() -> None:
    """A rise from 0 to 0.6 over 40 records, held 40, then a fall to 0: the peak was established before the fall,
    and a fall inside the first 10 records of a rise (its best after them) leaves the start as it was."""
    shape = [min(i / 40, 1.0) if i < 80 else max(1 - (i - 80) / 10, 0.0) for i in range(130)]
    rewards = [0.6 * s for s in shape]
    assert established_peak(rewards, 90, RULE)
    dipped = [0.0, 0.0, -0.3, -0.3, -0.3, *rewards[5:]]
    assert established_peak(dipped, 90, RULE)
