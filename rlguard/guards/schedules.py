"""Schedules by optimizer step, for the clip range, ``beta``, the entropy coefficient and an LR multiplier.

All are frozen dataclasses called with the step: ``Cosine(0.2, 0.1, total_steps=500)(step)``. ``Stages`` chains
schedules into a multi-stage curriculum, each stage seeing the steps since it began.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass

Schedule = Callable[[int], float]
SCHEDULED_KEYS: tuple[str, ...] = ("clip_low", "clip_high", "beta", "entropy_coef", "lr_scale")


@dataclass(frozen=True)
class Constant:
    """``value`` at every step."""

    value: float

    def __call__(self, step: int) -> float:
        return self.value


@dataclass(frozen=True)
class Piecewise:
    """Piecewise constant: ``values[k]`` for ``boundaries[k-1] <= step < boundaries[k]``.

    ``Piecewise(boundaries=(100, 300), values=(0.2, 0.15, 0.1))``: 0.2 before step 100, 0.15 until 300, then 0.1.
    """

    boundaries: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.values) != len(self.boundaries) + 1:
            raise ValueError(
                f"Piecewise needs len(values) == len(boundaries) + 1; got {len(self.values)} values and "
                f"{len(self.boundaries)} boundaries."
            )
        if list(self.boundaries) != sorted(self.boundaries):
            raise ValueError(f"Piecewise boundaries must be increasing; got {self.boundaries}.")

    def __call__(self, step: int) -> float:
        return self.values[bisect.bisect_right(self.boundaries, step)]


@dataclass(frozen=True)
class Linear:
    """Piecewise linear through ``points`` ``((step, value), ...)``; constant before the first and after the last."""

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        steps = [s for s, _ in self.points]
        if not self.points or steps != sorted(steps) or len(set(steps)) != len(steps):
            raise ValueError(f"Linear needs points with strictly increasing steps; got {self.points}.")

    def __call__(self, step: int) -> float:
        steps = [s for s, _ in self.points]
        k = bisect.bisect_right(steps, step)
        if k == 0:
            return self.points[0][1]
        if k == len(steps):
            return self.points[-1][1]
        (s0, v0), (s1, v1) = self.points[k - 1], self.points[k]
        return v0 + (v1 - v0) * (step - s0) / (s1 - s0)


@dataclass(frozen=True)
class Cosine:
    """Linear warm-up from 0 to ``start`` over ``warmup_steps``, then cosine from ``start`` to ``end`` at
    ``total_steps`` (Loshchilov and Hutter, SGDR, arXiv 1608.03983), then ``end``."""

    start: float
    end: float
    total_steps: int
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.total_steps <= self.warmup_steps:
            raise ValueError(f"Cosine needs total_steps > warmup_steps; got {self.total_steps}, {self.warmup_steps}.")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.start * (step + 1) / self.warmup_steps
        progress = min((step - self.warmup_steps) / (self.total_steps - self.warmup_steps), 1.0)
        return self.end + 0.5 * (self.start - self.end) * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class Stages:
    """Multi-stage schedule: ``stages = ((0, s0), (200, s1), ...)``; from step ``b_k`` on, ``s_k(step - b_k)``."""

    stages: tuple[tuple[int, Schedule], ...]

    def __post_init__(self) -> None:
        begins = [b for b, _ in self.stages]
        if not self.stages or begins[0] != 0 or begins != sorted(begins):
            raise ValueError(f"Stages must start at step 0 with increasing begin steps; got {begins}.")

    def __call__(self, step: int) -> float:
        k = bisect.bisect_right([b for b, _ in self.stages], step) - 1
        begin, schedule = self.stages[max(k, 0)]
        return schedule(step - begin)
