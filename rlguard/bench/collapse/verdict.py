"""The collapse definition: :func:`collapse_verdict` (fixed before the recorded grid).

See :mod:`rlguard.bench.collapse` for the design, the stressors and the collapse definition.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CollapseVerdict:
    """Outcome of :func:`collapse_verdict`: ``collapsed``, the first step of the final collapsed stretch
    (``None`` if healthy) and the ``reason`` (``nonfinite``, ``halted``, ``reward``, ``entropy`` or ``""``)."""

    collapsed: bool
    step: int | None = None
    reason: str = ""


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """``m_t = mean(values[max(0, t - window + 1) : t + 1])``."""
    out, total = [], 0.0
    for t, v in enumerate(values):
        total += v
        if t >= window:
            total -= values[t - window]
        out.append(total / min(t + 1, window))
    return out


def _final_stretch_start(below: Sequence[bool]) -> int | None:
    """First index of the run of ``True`` that reaches the end, or None if the last value is ``False``."""
    if not below or not below[-1]:
        return None
    t0 = len(below) - 1
    while t0 > 0 and below[t0 - 1]:
        t0 -= 1
    return t0


def collapse_verdict(
    rewards: Sequence[float],
    entropies: Sequence[float],
    *,
    nonfinite: bool = False,
    halted: bool = False,
    window: int = 10,
    warmup: int = 0,
    min_peak: float = 0.3,
    drop: float = 0.5,
    entropy_drop: float = 0.1,
    solved: float = 0.95,
) -> CollapseVerdict:
    """Apply the collapse definition of the module docstring to one run's curves (one value per rollout batch).

    ``rewards`` and ``entropies`` must have equal lengths; for a stopped run (``nonfinite`` or ``halted``) they
    end at the stop, which is the collapse step.
    """
    if len(rewards) != len(entropies):
        raise ValueError(f"rewards and entropies must have equal lengths; got {len(rewards)} and {len(entropies)}.")
    if window < 1 or warmup < 0:
        raise ValueError(f"window must be >= 1 and warmup >= 0; got window={window}, warmup={warmup}.")
    if not (0 < drop < 1 and 0 < entropy_drop < 1):
        raise ValueError(f"drop and entropy_drop must lie in (0, 1); got {drop} and {entropy_drop}.")
    if nonfinite or halted:
        return CollapseVerdict(True, max(len(rewards) - 1, 0), "nonfinite" if nonfinite else "halted")
    bad = [t for t, (r, e) in enumerate(zip(rewards, entropies, strict=True)) if not math.isfinite(r + e)]
    if bad:
        return CollapseVerdict(True, bad[0], "nonfinite")
    m = trailing_mean(rewards, window)
    peak, below = -math.inf, []
    for t, value in enumerate(m):
        if t >= warmup:
            peak = max(peak, value)
        below.append(peak >= min_peak and value < drop * peak)
    t0 = _final_stretch_start(below)
    if t0 is not None and len(m) - t0 >= window:
        return CollapseVerdict(True, t0, "reward")
    e = trailing_mean(entropies, window)
    if e and m[-1] < solved:
        e_start = statistics.fmean(entropies[:window])
        t0 = _final_stretch_start([x < entropy_drop * e_start for x in e])
        if t0 is not None and len(e) - t0 >= window:
            return CollapseVerdict(True, t0, "entropy")
    return CollapseVerdict(False)
