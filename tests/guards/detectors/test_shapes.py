"""The generic shapes (``rlguard.guards.detectors.shapes``) against their definitions computed from scratch: the
CUSUM's statistic is Page's sum of capped robust z-scores over a winsorized rolling window, and the spike's findings
are those of its plain definition, whatever the shortcuts of the detectors' hot paths."""

from __future__ import annotations

import math
from collections.abc import Mapping

from hypothesis import example, given
from hypothesis import strategies as st

from rlguard.guards.detectors.base import _absolute
from rlguard.guards.detectors.shapes import CusumDetector, SpikeDetector
from rlguard.guards.events import Finding
from rlguard.guards.robust import MAD_TO_SIGMA, MEAN_AD_TO_SIGMA, median_of
from tests.helpers.profiles import examples

#: positive values with many ties (a value at the window's median exactly, MAD = 0), close ones (just above the
#: median, within a sigma) and wide ones
POSITIVE = st.one_of(
    st.sampled_from([1.0, 1.01, 2.0, 4.0, 1e-9]),
    st.floats(1.0, 1.1),
    st.floats(1e-6, 1e6),
)


def _page_cusum(values: list[float], window: int, slack: float, min_sigma: float, z_cap: float) -> list[float]:
    """Page's (1954) one-sided CUSUM of the detector's definition, from scratch: robust z of ``log(value)`` against
    the median and sigma (1.4826 MAD, or sqrt(pi/2) mean deviation where the MAD is 0) of the last ``window`` values
    taken, ``S = max(0, S + min(z, z_cap) - slack)`` once 3 are held; each value is taken winsorized at median +
    2 sigma. The statistic after each value."""
    held: list[float] = []
    cusum, out = 0.0, []
    for value in values:
        x = math.log(value)
        if len(held) < 3:
            taken = x
        else:
            med = median_of(held)
            deviations = [abs(v - med) for v in held]
            spread = MAD_TO_SIGMA * median_of(deviations)
            if spread == 0.0:
                spread = MEAN_AD_TO_SIGMA * sum(deviations) / len(deviations)
            sigma = max(spread, min_sigma)
            cusum = max(0.0, cusum + min((x - med) / sigma, z_cap) - slack)
            taken = min(x, med + 2.0 * sigma)
        held = [*held, taken][-window:]
        out.append(cusum)
    return out


@examples(quick=100, long=2000)
@given(
    values=st.lists(POSITIVE, min_size=1, max_size=120),
    window=st.integers(3, 12),
    slack=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    min_sigma=st.sampled_from([1e-12, 0.05, 0.5]),
)
@example(values=[2.0, 2.0, 2.0, 2.0, 1.0, 2.0, 8.0, 2.0, 2.0], window=5, slack=0.0, min_sigma=1e-12)
@example(values=[1.0, 1.1, 1.2, 1.0, 1.12, 1.3, 1.0], window=5, slack=0.0, min_sigma=0.05)
@example(values=[1.0, 1.0, 1.12, 1.13, 1.5], window=5, slack=3.0, min_sigma=0.05)
def test_the_cusum_is_pages_sum_of_robust_z_scores(
    values: list[float], window: int, slack: float, min_sigma: float
) -> None:
    """The statistic after each observation equals the from-scratch one bit for bit, through values at the median
    and just above it (where the detector skips the MAD) and further above, with and without slack, and with a slack
    over 2 (a value within it that the winsorizing bound caps)."""
    det = CusumDetector(metric="m", window=window, slack=slack, min_sigma=min_sigma, floor=1e-300, warmup=0)
    want = _page_cusum(values, window, slack, min_sigma, det.z_cap)
    got = []
    for step, value in enumerate(values):
        det.check(step, {"m": value}, armed=True)
        got.append(det._s_cusum)
    assert got == want
    assert (det._s_cusum_start >= 0) == (want[-1] > 0)


class _PlainSpike(SpikeDetector):
    """The spike detector as defined: :meth:`observes` asked at every step, the absolute bounds judged at every
    step (the detector inlines the first and asks :func:`_absolute` only at a value on or above a bound)."""

    def observes(self, stats: Mapping[str, float]) -> bool:
        return super().observes(stats)

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        value = stats.get(self.metric)
        if value is None or not self.observes(stats):
            return None
        x = math.log(value := float(value))
        finding = _absolute(self.metric, value, self.warn_above, self.critical_above, self.advice)
        window = self._s_window
        if finding is None and armed and len(window) >= 2 and value >= self.min_value:
            median = window.median()
            factor = math.exp(x - median)
            if factor >= self.warn_factor:
                finding = self._spike(value, x, median, factor)
        if finding is None:
            window.push(x)
        return finding


#: values at and around the floor and the bounds below (0.5, 1.0, 2.0), signed zeros, non-finite ones, spikes
SPIKE_VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1e-8, 0.5, 1.0, 2.0, 1.5, 100.0, math.nan, math.inf, -math.inf]),
    st.floats(1e-9, 10.0),
    st.floats(allow_nan=True, allow_infinity=True),
)


@examples(quick=100, long=2000)
@given(
    values=st.lists(SPIKE_VALUES, max_size=80),
    bounds=st.sampled_from([(None, None), (1.0, None), (None, 2.0), (1.0, 2.0), (0.5, 0.5), (math.inf, None)]),
    floor=st.sampled_from([1e-8, 0.5]),
    armed_from=st.integers(0, 10),
)
@example(values=[1.0, 1.0, 1.0, 0.999, 1.0], bounds=(1.0, None), floor=1e-8, armed_from=0)  # at a bound
@example(values=[0.5, 0.5, 2.0, 100.0, 2.0], bounds=(1.0, 2.0), floor=0.5, armed_from=2)  # at the floor and bounds
@example(values=[-0.0, 0.0, 1.0, math.nan, 1.0, math.inf, 50.0], bounds=(None, 2.0), floor=1e-8, armed_from=0)
def test_a_spikes_findings_and_state_are_those_of_its_plain_definition(
    values: list[float], bounds: tuple[float | None, float | None], floor: float, armed_from: int
) -> None:
    warn_above, critical_above = bounds
    kw = {"metric": "m", "window": 5, "floor": floor, "warn_above": warn_above, "critical_above": critical_above}
    fast, plain = SpikeDetector(**kw), _PlainSpike(**kw)  # type: ignore[arg-type]
    assert fast._own_observes and not plain._own_observes
    for step, value in enumerate(values):
        stats = {"m": value}
        assert fast.check(step, stats, step >= armed_from) == plain.check(step, stats, step >= armed_from)
    assert list(fast._s_window.values) == list(plain._s_window.values)
