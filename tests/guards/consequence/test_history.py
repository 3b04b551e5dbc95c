"""RewardHistory (the index's rewards, kept as the timeline grows) answers the established-peak test and the reward's
range as PeakHistory and reward_span do on the series so far, at every length, with last steps read and forgotten
as the fold's copy of the guard does; and it reads each reward once, however many judgements ask."""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlguard.guards.consequence.excursions import Excursion, recovered_incidents
from rlguard.guards.consequence.history import RewardHistory
from rlguard.guards.consequence.peak import PeakHistory
from rlguard.guards.consequence.rule import ConsequenceRule, reward_rises, reward_span
from tests.helpers.counted import Counted
from tests.helpers.profiles import examples
from tests.helpers.rewards import reward_series as _series

RULE = ConsequenceRule()


def _check(history: RewardHistory, rewards: Sequence[float], asked: Sequence[int]) -> None:
    peak = PeakHistory(rewards, RULE)
    for before in asked:
        assert history.established(before, RULE) == peak.established(before), before
    assert history.span() == reward_span([r for r in rewards if math.isfinite(r)])


@given(
    kind=st.sampled_from(["quantized", "rise_fall", "noise"]),
    seed=st.integers(0, 2**16),
    chunks=st.lists(st.integers(1, 40), min_size=1, max_size=10),
    scale=st.sampled_from([1.0, 3.0, -2.0]),
)
@examples(quick=25, long=300)
def test_the_history_answers_as_the_series_read_whole_at_every_length(
    kind: str, seed: int, chunks: list[int], scale: float
) -> None:
    """Rewards appended in chunks; after each, a last step read and forgotten (the fold's copy), then the chunk
    kept: the answers at positions asked before (kept) and new ones equal PeakHistory's on the series so far.
    ``scale`` takes the rewards out of ``[0, 1]``, where the range is read from the ranked rewards."""
    rewards = [scale * r for r in _series(kind, seed, n=240)]
    history, at = RewardHistory(), 0
    for size in [*chunks, 240]:
        end = min(at + size, 240)
        history.read(rewards[: end + 1])  # one step more, judged by a copy
        _check(history, rewards[: end + 1], range(0, end + 1, 7))
        history.forget(end)
        history.read(rewards[:end])
        _check(history, rewards[:end], range(0, end, 5))
        at = end


@pytest.mark.parametrize("held", [1, 3, 5, 9])
@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_a_fall_within_the_first_rewards_is_judged_as_read_whole(held: int, noise: float) -> None:
    """A reward held for ``held`` records, then falling within the run's first ``anchor`` rewards: the run's start
    is the median of the rewards up to the EWMA's best (``established_peak``), the fall's own rewards not counted;
    the kept history answers as PeakHistory at every length."""
    rng = np.random.default_rng(held)
    rewards = [(0.0 if i < held else -0.5) + noise * float(rng.normal()) for i in range(120)]
    history = RewardHistory()
    for end in range(1, 121):
        history.read(rewards[:end])
        _check(history, rewards[:end], range(0, end + 1))


def test_each_reward_is_read_once_however_many_judgements_ask() -> None:
    """2,000 rewards, then 50 judgements of 20 more each asking the peak at the last episode's start: the history
    reads the 20 appended rewards (and the copy's one) per judgement, where PeakHistory reads the whole series."""
    rewards = Counted(_series("rise_fall", 3, n=3_000))
    history = RewardHistory()
    history.read(rewards[:2_000])
    history.established(1_500, RULE)
    reads = []
    for end in range(2_020, 3_001, 20):
        view = Counted(rewards[:end])
        Counted.reads = 0
        history.read(view)
        history.established(1_500, RULE)
        history.established(end - 30, RULE)
        reads.append(Counted.reads)
    assert max(reads) <= 21, reads
    Counted.reads = 0
    PeakHistory(Counted(rewards), RULE).established(2_970)
    assert Counted.reads >= 3_000


def _fall(n: int, seed: int, back_at: int | None) -> list[float]:
    """Rewards at 0.8 that fall to 0.3 from position 100 and come back at ``back_at`` (never: None), with noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        level = 0.3 if i >= 100 and (back_at is None or i < back_at) else 0.8
        out.append(level + 0.02 * float(rng.standard_normal()))
    return out


@given(
    seed=st.integers(0, 2**16),
    back_at=st.sampled_from([None, 140, 260]),
    chunks=st.lists(st.integers(1, 60), min_size=1, max_size=8),
)
@examples(quick=20, long=200)
def test_the_recovery_kept_across_judgements_equals_the_recovery_read_whole(
    seed: int, back_at: int | None, chunks: list[int]
) -> None:
    """The incidents after a critical excursion at step 101, judged as the rewards grow (a last step read by a
    copy, then forgotten) with the history kept, equal those of the rewards so far read whole."""
    rewards = _fall(300, seed, back_at)
    steps = list(range(1, 301))
    critical = [_excursion("reward_collapse", 101, 120), _excursion("entropy", 280, 290)]
    history, at = RewardHistory(), 0
    for size in [*chunks, 300]:
        end = min(at + size, 300)
        for cut in (min(end + 1, 300), end):  # the copy's step, then the step kept
            got = recovered_incidents(steps[:cut], rewards[:cut], critical, RULE, history)
            assert got == recovered_incidents(steps[:cut], rewards[:cut], critical, RULE), cut
            history.forget(end)
        at = end


def test_the_recovery_tests_each_window_once_however_many_judgements_ask(monkeypatch: Any) -> None:
    """A fall that never comes back: 50 judgements of 20 more rewards each compute the median of about the 20
    windows appended (and the copy's), not of every window since the fall."""
    import statistics

    medians = [0]
    median = statistics.median

    def counted(data: Any) -> Any:
        medians[0] += 1
        return median(data)

    monkeypatch.setattr(statistics, "median", counted)
    rewards = _fall(3_000, 1, None)
    steps = list(range(1, 3_001))
    critical = [_excursion("reward_collapse", 101, 120)]
    history = RewardHistory()
    recovered_incidents(steps[:2_000], rewards[:2_000], critical, RULE, history)
    calls = []
    for end in range(2_020, 3_001, 20):
        medians[0] = 0
        recovered_incidents(steps[:end], rewards[:end], critical, RULE, history)
        calls.append(medians[0])
    assert max(calls) <= 30, calls


def _excursion(detector: str, onset: int, end: int) -> Excursion:
    return Excursion(detector, onset, end, "critical", onset, "unresolved", end - onset + 1, onset)


@given(
    kind=st.sampled_from(["quantized", "rise_fall", "noise"]),
    seed=st.integers(0, 2**16),
    chunks=st.lists(st.integers(1, 40), min_size=1, max_size=10),
    starts=st.lists(st.integers(0, 200), min_size=1, max_size=3),
    nan_every=st.sampled_from([0, 3, 7]),
)
@examples(quick=25, long=300)
def test_the_rising_reward_kept_across_judgements_equals_reward_rises(
    kind: str, seed: int, chunks: list[int], starts: list[int], nan_every: int
) -> None:
    """Episodes' windows from ``starts`` to the end of the rewards so far (NaN rewards among them), asked as the
    rewards grow (a last step read by a copy, then forgotten), and a window asked shorter than before: the answer,
    its Mann-Kendall sum and its thirds' medians equal ``reward_rises`` and its parts on the window read whole."""
    from rlguard.guards.consequence.history import _median
    from rlguard.guards.robust import _sign_sum

    rewards = _series(kind, seed, n=240)
    if nan_every:
        rewards = [math.nan if i % nan_every == 0 else r for i, r in enumerate(rewards)]
    history, at = RewardHistory(), 0

    def check(upto: int) -> None:
        for lo in starts:
            for hi in (upto - 1, max(lo + (upto - lo) // 2, 0)):
                window = [r for r in rewards[lo : hi + 1] if math.isfinite(r)]
                assert history.rises(lo, hi, RULE.trend_z) == reward_rises(rewards[lo : hi + 1], RULE.trend_z)
                a, b = bisect.bisect_left(history.positions, lo), bisect.bisect_right(history.positions, hi)
                test = next(t for t in history._rises[a] if t.end == b)
                assert test.signs == (_sign_sum(window) if window else 0)
                third = len(window) // 3
                if third:
                    assert _median(test._first) == statistics.median(window[:third])
                    assert _median(test._last) == statistics.median(window[-third:])

    for size in [*chunks, 240]:
        end = min(at + size, 240)
        history.read(rewards[: end + 1])  # one step more, judged by a copy
        check(end + 1)
        history.forget(end)
        history.read(rewards[:end])
        check(end)
        at = end


def test_the_rising_reward_reads_each_reward_of_a_growing_window_once(monkeypatch: Any) -> None:
    """An episode's window from reward 100 to the end, asked at 50 judgements of 20 more rewards each (and the
    copy's one), beside the window of an episode over, from the same reward: the sum of signs counts each reward
    appended against the window once (ranks asked: about 2 per reward appended, and 2 per reward forgotten), where
    ``reward_rises`` reads the whole window at each; the window over is kept as it is, not moved back and forth."""
    from rlguard.guards.robust import SortedBlocks

    ranks = [0]
    rank = SortedBlocks.rank

    def counted(self: SortedBlocks, x: float) -> int:
        ranks[0] += 1
        return rank(self, x)

    monkeypatch.setattr(SortedBlocks, "rank", counted)
    rewards = _series("rise_fall", 3, n=3_000)
    history = RewardHistory()
    history.read(rewards[:2_000])
    history.rises(100, 1_999, RULE.trend_z)
    history.rises(100, 1_500, RULE.trend_z)
    per = []
    for end in range(2_020, 3_001, 20):
        ranks[0] = 0
        history.read(rewards[: end + 1])
        history.rises(100, end, RULE.trend_z)
        history.rises(100, 1_500, RULE.trend_z)
        history.forget(end)
        history.read(rewards[:end])
        history.rises(100, end - 1, RULE.trend_z)
        per.append(ranks[0])
    assert max(per) <= 2 * (20 + 2), per
