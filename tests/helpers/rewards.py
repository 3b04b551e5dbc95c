"""Reward series for the consequence rule's peak tests (tests/guards/consequence)."""

from __future__ import annotations

import math

import numpy as np


def reward_series(kind: str, seed: int, n: int = 160) -> list[float]:
    """``n`` rewards of ``kind``: ``quantized`` (8 samples a step: the MAD of the differences is 0), ``rise_fall``
    or ``noise``, a tenth of the steps without one (NaN)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    if kind == "quantized":  # rewards of 8 samples: MAD of the differences 0, the mean deviation decides
        flips = (rng.random(n) < 0.2) * rng.choice([-1, 1], size=n)
        out = np.clip(np.floor(t / 20) + flips, 0, 8) / 8
    elif kind == "rise_fall":
        out = np.where(t < n // 2, 0.1 + 0.01 * t, 0.9 - 0.01 * (t - n // 2)) + 0.05 * rng.standard_normal(n)
    else:
        out = 0.5 + 0.3 * rng.standard_normal(n)
    values = out.tolist()
    for i in rng.choice(n, size=n // 10, replace=False):
        values[int(i)] = math.nan  # steps without a reward
    return values
