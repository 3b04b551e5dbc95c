"""A step's stats: collected per micro-batch on the device (:mod:`.collect`), reduced across micro-batches and
ranks by the metric table's rules (:mod:`.reduction`).

Every module here needs torch; the names load on first use (PEP 562), so ``import rlguard.guards`` does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlguard._lazy import lazy

if TYPE_CHECKING:
    from rlguard.guards.stats.collect import StepStats, add_metric_values, collect_step_stats, repetition_flags
    from rlguard.guards.stats.reduction import STAT_REDUCTIONS, reduce_rows

_NAMES = {
    **dict.fromkeys(
        ("StepStats", "add_metric_values", "collect_step_stats", "repetition_flags"), f"{__name__}.collect"
    ),
    **dict.fromkeys(("STAT_REDUCTIONS", "reduce_rows"), "rlguard.guards.stats.reduction"),
}

__all__ = [
    "STAT_REDUCTIONS",
    "StepStats",
    "add_metric_values",
    "collect_step_stats",
    "reduce_rows",
    "repetition_flags",
]


__getattr__ = lazy(__name__, _NAMES)
