"""The noise of a window's successive differences (``rlguard.guards.detectors.noise``): its O(1) lower bound never
exceeds the noise ``differences_noise`` computes, whatever the values (ties, -0.0, magnitudes whose squares cancel or
overflow, a restored window), and ``reward_collapse``, which judges from the bound where it settles a step, judges
every step exactly as from the noise itself."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rlguard.guards.detectors.base import differences_noise
from rlguard.guards.detectors.noise import DifferencesNoise
from rlguard.guards.detectors.rollouts import RewardCollapse
from rlguard.guards.robust import RollingWindow
from tests.helpers.profiles import examples

#: ties, signed zeros, huge values (squares that overflow or cancel in a running sum) and ordinary ones
VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 1e-300, 1e150, -1e150, 1e300]),
    st.floats(-2.0, 2.0),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([math.nan, math.inf]),
)


@examples(quick=200, long=4000)
@given(size=st.integers(2, 12), values=st.lists(VALUES, max_size=80), restore_at=st.integers(0, 80))
def test_the_lower_bound_is_at_most_the_noise(size: int, values: list[float], restore_at: int) -> None:
    """After each push (a read every other step, so that runs of pushes without one are taken too), the bound is
    at most ``differences_noise`` of the window's differences as they stand (NaN, none known, only for a window
    that is not finite or whose differences' squares overflow); after a restore (another window of the same
    values) it is taken up from the values."""
    noise, window = DifferencesNoise(), RollingWindow(size)
    for i, value in enumerate(values):
        if i == restore_at:
            window = RollingWindow(size, window.values)
        noise.push(window, value)
        if len(window) < 2 or i % 2:
            continue
        held = list(window.values)
        exact = differences_noise(RollingWindow(len(held) - 1, [b - a for a, b in pairwise(held)]))
        bound = noise.lower(window)
        squares = sum((b - a) * (b - a) for a, b in pairwise(held))
        if not window.finite:
            assert math.isnan(bound)
        elif math.isfinite(squares):  # a known bound: NaN only where the squares overflow
            assert bound <= exact, (held, bound, exact)
        assert noise.noise(window) == exact or (math.isnan(exact) and math.isnan(noise.noise(window)))


class _Exact(RewardCollapse):
    """``reward_collapse`` judging every armed step from the noise itself."""

    def _settled(self, ewma: float, raw: float, deep: bool) -> bool:
        return False


def _rewards(seed: int, n: int, scale: float, level: float) -> list[float]:
    """A noisy reward around ``level`` with plateaus, rises and drops of a few noise sigmas (findings of each
    severity), and exact repeats (a noise of 0: the 1e-6 floor)."""
    rng = np.random.default_rng(seed)
    steps = rng.choice([0.0, 0.0, 1.0, -1.0, -4.0], size=n) * rng.random(n) * scale
    noise = rng.standard_normal(n) * scale * rng.choice([0.0, 0.3, 1.0], size=n)
    return (level + np.cumsum(steps) * 0.2 + noise).tolist()


@examples(quick=60, long=1000)
@given(
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([1e-9, 0.05, 1.0, 1e6]),
    level=st.sampled_from([0.0, 0.5, -3.0, 1e8]),
    warn_drop=st.sampled_from([0.0, 0.5, 2.0, 5.0]),
    critical_drop=st.sampled_from([0.0, 1.0, 10.0]),
    alpha=st.sampled_from([0.05, 0.2, 1.0]),
    window=st.sampled_from([5, 8, 50]),
    min_drop=st.sampled_from([0.0, 0.1]),
)
def test_reward_collapse_settled_from_the_bound_judges_as_from_the_noise(
    seed: int,
    scale: float,
    level: float,
    warn_drop: float,
    critical_drop: float,
    alpha: float,
    window: int,
    min_drop: float,
) -> None:
    """Every finding (severity, value, bound, message), the change point and the state after every step are those of
    the detector that computes the noise at every armed step; a restore midway changes nothing either."""
    fast, exact = (
        kind(warmup=0, warn_drop=warn_drop, critical_drop=critical_drop, alpha=alpha, window=window, min_drop=min_drop)
        for kind in (RewardCollapse, _Exact)
    )
    for step, reward in enumerate(_rewards(seed, 300, scale, level)):
        if step == 150:
            fast.load_state_dict(fast.state_dict())
            exact.load_state_dict(exact.state_dict())
        got, want = fast.check(step, {"reward_mean": reward}, True), exact.check(step, {"reward_mean": reward}, True)
        assert got == want, step
        assert repr(fast.state_dict()) == repr(exact.state_dict()), step
        if got is not None:
            assert fast.change_point() == exact.change_point()


def test_a_stationary_reward_is_settled_without_the_noise_on_most_steps() -> None:
    """The point of the bound: on 2,000 steps of a stationary reward the noise is computed on few of them (the
    EWMA at a new best, or near a warning), not on every step."""
    judged = 0

    class Counting(RewardCollapse):
        def _judge(self, ewma: float, raw: float, deep: bool) -> tuple[object, bool, float]:  # type: ignore[override]
            nonlocal judged
            judged += 1
            return super()._judge(ewma, raw, deep)

    det = Counting(warmup=0)
    for step, reward in enumerate((0.5 + 0.05 * np.random.default_rng(0).standard_normal(2000)).tolist()):
        det.check(step, {"reward_mean": reward}, True)
    assert judged < 0.1 * 2000, judged
