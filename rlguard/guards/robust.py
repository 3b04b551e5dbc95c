"""Robust statistics for detectors: rolling median/MAD, CUSUM and the Mann-Kendall trend test."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

#: MAD * 1.4826 estimates the standard deviation of a normal distribution.
MAD_TO_SIGMA = 1.4826
#: mean absolute deviation * sqrt(pi / 2) estimates the standard deviation of a normal distribution.
MEAN_AD_TO_SIGMA = math.sqrt(math.pi / 2)


def _median(values: Iterable[float]) -> float:
    # pure Python: for the window sizes used here (<= a few hundred) sorted() beats numpy's call overhead
    s = sorted(values)
    n = len(s)
    if n == 0:
        return math.nan
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


class RollingWindow:
    """The last ``size`` values, with robust location and scale (cached until the next push)."""

    def __init__(self, size: int, values: Iterable[float] = ()) -> None:
        if size < 1:
            raise ValueError(f"window size must be >= 1; got {size}.")
        self.values: deque[float] = deque(values, maxlen=size)
        self._cache: tuple[float, float] | None = None

    def __len__(self) -> int:
        return len(self.values)

    def push(self, value: float) -> None:
        """Append ``value`` (finite values only; others are ignored)."""
        if math.isfinite(value):
            self.values.append(value)
            self._cache = None

    def _stats(self) -> tuple[float, float]:
        if self._cache is None:
            med = _median(self.values)
            deviations = [abs(v - med) for v in self.values]
            sigma = MAD_TO_SIGMA * _median(deviations)
            if sigma == 0.0 and deviations:
                # quantized values (rewards of 8 samples: 0, 1/8, ...) often have MAD = 0 although they vary; the
                # mean absolute deviation x sqrt(pi/2) also estimates sigma (normal) and is 0 only for constants
                sigma = MEAN_AD_TO_SIGMA * sum(deviations) / len(deviations)
            self._cache = (med, sigma)
        return self._cache

    def median(self) -> float:
        """Median of the window (NaN when empty)."""
        return self._stats()[0]

    def sigma(self, floor: float = 0.0) -> float:
        """Robust standard deviation ``1.4826 * MAD`` (``sqrt(pi/2) * mean |x - median|`` where the MAD is 0 but
        the values are not all equal), at least ``floor``."""
        if not self.values:
            return floor
        return max(self._stats()[1], floor)

    def robust_z(self, value: float, floor: float) -> float:
        """``(value - median) / max(sigma, floor)``."""
        return (value - self.median()) / self.sigma(floor)


def mann_kendall_z(values: Sequence[float]) -> float:
    """Mann-Kendall trend statistic (normal approximation, no tie correction): > 2 means a rising trend at about
    the 5% level, < -2 a falling one (Mann 1945; Kendall 1975). 0 for fewer than 3 values."""
    # pure Python: exact (a sum of signs), as fast as numpy for the trend windows used (about 30 values), and the
    # doctor and the command line start without numpy
    x = list(values)
    n = len(x)
    if n < 3:
        return 0.0
    s = float(sum((b > a) - (b < a) for i, a in enumerate(x) for b in x[i + 1 :]))
    var = n * (n - 1) * (2 * n + 5) / 18.0
    if s == 0:
        return 0.0
    return (s - math.copysign(1.0, s)) / math.sqrt(var)


def cusum_step(statistic: float, z: float, slack: float) -> float:
    """One step of the one-sided (upward) CUSUM of Page (1954): ``S = max(0, S + z - k)``."""
    return max(0.0, statistic + z - slack)
