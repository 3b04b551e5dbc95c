"""The statistics of a grid's report: Wilson intervals of collapse rates, exact McNemar p-values and paired
bootstrap intervals of differences between cells on the same seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959963984540054  # standard normal 97.5 % quantile


def wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial rate (Wilson 1927; Brown, Cai, DasGupta 2001)."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs ``b`` (only A collapsed) and ``c`` (only B)."""
    n = b + c
    if n == 0:
        return 1.0
    tail: float = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def paired_bootstrap_ci(diffs: Sequence[float], *, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean of paired differences (resampling seeds)."""
    x = np.asarray(diffs, dtype=np.float64)
    if len(x) == 0:
        return (math.nan, math.nan)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    means = x[idx].mean(axis=1)
    return (float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)))
