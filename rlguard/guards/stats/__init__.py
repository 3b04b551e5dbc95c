"""A step's stats: collected per micro-batch on the device (:mod:`.collect`), reduced across micro-batches and
ranks by the metric table's rules (:mod:`.reduction`).

Every module here needs torch; the names load on first use (PEP 562), so ``import rlguard.guards`` does not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlguard.guards.stats.collect import StepStats, add_metric_values, collect_step_stats, repetition_flags
    from rlguard.guards.stats.reduction import STAT_REDUCTIONS, reduce_rows

_NAMES = {
    "StepStats": "collect",
    "add_metric_values": "collect",
    "collect_step_stats": "collect",
    "repetition_flags": "collect",
    "STAT_REDUCTIONS": "reduction",
    "reduce_rows": "reduction",
}

__all__ = [
    "STAT_REDUCTIONS",
    "StepStats",
    "add_metric_values",
    "collect_step_stats",
    "reduce_rows",
    "repetition_flags",
]


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(f"rlguard.guards.stats.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlguard.guards.stats' has no attribute {name!r}")
