"""The rolling window's incremental statistics equal the same statistics computed from scratch, and the fast
Mann-Kendall sum equals the sum of signs over all pairs."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rlguard.guards.robust import (
    MAD_TO_SIGMA,
    MEAN_AD_TO_SIGMA,
    EarlySorted,
    RollingWindow,
    SortedBlocks,
    mann_kendall_z,
    median_of,
)
from tests.helpers.profiles import examples

#: few distinct values (ties, MAD = 0, the mean-deviation fallback) and wide ones (overflow of x - median)
FINITE = st.one_of(
    st.sampled_from([0.0, -0.0, 0.125, 0.25, 1.0, -1.0, 2.0]),
    st.integers(-3, 3).map(float),
    st.floats(allow_nan=False, allow_infinity=False),
)
ANY = st.one_of(FINITE, st.sampled_from([math.nan, math.inf, -math.inf]))


def _reference(window: list[float]) -> tuple[float, float]:
    """Median and robust sigma of ``window`` from scratch, in float64, by :func:`statistics.median`."""
    if not window:
        return math.nan, math.nan
    med = statistics.median(window)  # the mean of the two middle values for an even length
    deviations = [abs(v - med) for v in window]
    sigma = MAD_TO_SIGMA * statistics.median(deviations)
    if sigma == 0.0:
        sigma = MEAN_AD_TO_SIGMA * sum(deviations) / len(deviations)
    return med, sigma


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1.0, a) == math.copysign(1.0, b))


@examples(quick=150, long=3000)
@given(size=st.integers(1, 50), stream=st.lists(ANY, max_size=200), read_every=st.integers(1, 7))
def test_rolling_statistics_equal_a_from_scratch_reference(size: int, stream: list[float], read_every: int) -> None:
    window = RollingWindow(size)
    kept: list[float] = []
    for i, value in enumerate(stream):
        window.push(value)
        if math.isfinite(value):
            kept = [*kept, value][-size:]
        if i % read_every == 0:
            med, sigma = _reference(kept)
            assert _same(window.median(), med), (kept, window.median(), med)
            if kept:
                assert _same(window.sigma(), sigma), (kept, window.sigma(), sigma)
                assert window.sigma(floor=1e300) == max(sigma, 1e300)
            else:
                assert window.sigma(floor=0.5) == 0.5
    assert list(window.values) == kept


@examples(quick=100, long=2000)
@given(
    size=st.integers(1, 20),
    restored=st.lists(ANY, min_size=1, max_size=30).filter(lambda r: not all(map(math.isfinite, r))),
    stream=st.lists(FINITE, max_size=60),
)
@example(size=3, restored=[math.nan], stream=[1.0, 2.0, 3.0, 0.5])
def test_a_restored_window_with_non_finite_values_reads_as_the_values_it_holds(
    size: int, restored: list[float], stream: list[float]
) -> None:
    # a window built from state may hold NaN or inf: judged from scratch over the values held, as they are,
    # until they have left it, then incrementally again
    window = RollingWindow(size, restored)
    held = restored[-size:]
    for value in stream:
        window.push(value)
        held = [*held, value][-size:]
        if all(math.isfinite(v) for v in held):
            med, sigma = _reference(held)
            assert _same(window.median(), med) and _same(window.sigma(), sigma), held
        else:
            s = sorted(held)
            n = len(s)
            med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
            assert _same(window.median(), med), held
    assert list(window.values) == held


def _mann_kendall_reference(x: list[float]) -> float:
    n = len(x)
    if n < 3:
        return 0.0
    s = sum((x[j] > x[i]) - (x[j] < x[i]) for i in range(n) for j in range(i + 1, n))
    if s == 0:
        return 0.0
    return (s - math.copysign(1.0, s)) / math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)


@examples(quick=150, long=3000)
@given(values=st.lists(ANY, max_size=60))
def test_mann_kendall_equals_the_sum_of_signs_over_all_pairs(values: list[float]) -> None:
    # ties count 0, and so does every pair with a NaN (it is not ordered)
    assert _same(mann_kendall_z(values), _mann_kendall_reference(values))


def test_mann_kendall_on_a_known_series() -> None:
    # 1, 2, 3, 4: all 6 pairs rise, var = 4 * 3 * 13 / 18 = 26 / 3
    assert mann_kendall_z([1.0, 2.0, 3.0, 4.0]) == (6 - 1) / math.sqrt(26 / 3)
    assert mann_kendall_z([4.0, 3.0, 2.0, 1.0]) == -(6 - 1) / math.sqrt(26 / 3)
    assert mann_kendall_z([1.0, 1.0, 1.0]) == 0.0


@examples(quick=150, long=3000)
@given(
    size=st.integers(1, 40),
    start=st.lists(ANY, max_size=10),
    stream=st.lists(ANY, max_size=120),
    read_every=st.integers(1, 7),
)
def test_the_windows_running_mann_kendall_equals_it_from_scratch(
    size: int, start: list[float], stream: list[float], read_every: int
) -> None:
    """``RollingWindow.mann_kendall_z`` (its sum of signs kept up to date by each push once first read) equals
    :func:`mann_kendall_z` of the values in the window, bit for bit, read at any cadence, from a window restored with
    values that are not all finite too."""
    window = RollingWindow(size, start)
    for i, value in enumerate(stream):
        window.push(value)
        if i % read_every == 0:
            assert _same(window.mann_kendall_z(), mann_kendall_z(list(window.values)))
    assert _same(window.mann_kendall_z(), mann_kendall_z(list(window.values)))


@examples(quick=100, long=2000)
@given(
    window=st.integers(5, 60),
    rewards=st.lists(st.one_of(FINITE, st.sampled_from([math.nan])), min_size=1, max_size=150),
    restore_at=st.integers(0, 150),
)
def test_reward_collapses_kept_differences_equal_the_windows_successive_differences(
    window: int, rewards: list[float], restore_at: int
) -> None:
    """The successive differences ``RewardCollapse`` keeps beside its window (one push a step) are those of the
    window's values in order, after any run of steps and after a restore of its state."""
    from itertools import pairwise

    from rlguard.guards.detectors.rollouts import RewardCollapse

    det = RewardCollapse(window=window, warmup=0)
    for step, reward in enumerate(rewards):
        if step == restore_at:
            det.load_state_dict(det.state_dict())
        det.check(step, {"reward_mean": reward}, armed=True)
        if len(det._s_window) >= 2:
            values = list(det._s_window.values)
            want = RollingWindow(len(values) - 1, [b - a for a, b in pairwise(values)])
            got = det._differences()
            assert list(got.values) == list(want.values) or all(
                _same(a, b) for a, b in zip(got.values, want.values, strict=True)
            )
            assert len(got.values) == len(want.values)
            assert _same(got.sigma(), want.sigma())


#: what a reader does to a window between pushes: nothing (the push is not read), or one of its statistics
OPERATIONS = st.lists(
    st.one_of(FINITE.map(lambda v: ("push", v)), st.sampled_from([("median", 0.0), ("sigma", 0.0), ("trend", 0.0)])),
    max_size=150,
)


@examples(quick=150, long=3000)
@given(size=st.integers(1, 30), start=st.lists(ANY, max_size=8), operations=OPERATIONS)
def test_a_window_read_at_any_cadence_reads_what_it_holds(
    size: int, start: list[float], operations: list[tuple[str, float]]
) -> None:
    """The sorted values are kept up to date by a push only after a read (runs of pushes without one sort again at
    the next read; once the trend is asked for, every push keeps it): whatever the order of pushes and reads, each
    statistic equals the one from scratch of the values held."""
    window = RollingWindow(size, start)
    for name, value in operations:
        if name == "push":
            window.push(value)
            continue
        held = list(window.values)
        finite = [v for v in held if math.isfinite(v)]
        if name == "trend":
            assert _same(window.mann_kendall_z(), mann_kendall_z(held))
        elif name == "median":
            assert _same(window.median(), median_of(held))
        elif held and finite == held:
            assert _same(window.sigma(), _reference(held)[1])
            assert window.location_scale() == (window.median(), window.sigma())


@examples(quick=100, long=2000)
@given(values=st.lists(FINITE, min_size=1, max_size=30), other=st.lists(FINITE, min_size=1, max_size=5))
def test_an_early_baselines_cached_median_follows_its_appends_and_a_restored_list(
    values: list[float], other: list[float]
) -> None:
    early = EarlySorted()
    grown: list[float] = []
    for v in values:
        grown.append(v)
        assert _same(early.median(grown), _reference(grown)[0])
        assert early(grown) == sorted(grown)
    assert _same(early.median(other), _reference(other)[0])  # another list (a restored state): sorted again


def test_sorted_blocks_give_every_order_statistic_and_rank() -> None:
    """Inserted one by one and in bulk, removed at random: the k-th smallest is sorted(values)[k], the rank of x
    the number of values <= x."""
    rng = np.random.default_rng(0)
    values = rng.normal(size=5_000).round(2).tolist()  # ties
    ranked, bulk = SortedBlocks(load=16), SortedBlocks(load=16)
    for x in values:
        ranked.add(x)
    bulk.extend(values)
    kept = sorted(values)
    for x in rng.choice(values, size=1_000, replace=False).tolist():
        ranked.remove(x)
        bulk.remove(x)
        kept.remove(x)
    assert [ranked[k] for k in range(len(kept))] == kept == [bulk[k] for k in range(len(kept))]
    assert len(ranked) == len(bulk) == len(kept)
    for x in rng.normal(size=200).round(2).tolist():
        assert ranked.rank(x) == bulk.rank(x) == sum(1 for v in kept if v <= x)
    with pytest.raises(ValueError, match="not in the multiset"):
        ranked.remove(99.0)
