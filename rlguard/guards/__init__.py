"""``rlguard.guards``: monitors, collapse detectors, interventions and schedules; no framework import.

>>> from rlguard.guards import Guard, GuardConfig
>>> guard = Guard(GuardConfig.preset("default"))
>>> decision = guard.observe(step, stats)  # doctest: +SKIP

The stats collection (``StepStats``, ``collect_step_stats``, ...) needs torch and is loaded on first use (PEP 562),
so the doctor and the command line read detectors and events without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlguard._lazy import lazy
from rlguard.guards.config import PRESETS, GuardConfig
from rlguard.guards.decision import Controls, Decision, Outcome, Proposal
from rlguard.guards.detectors import CusumDetector, Detector, SpikeDetector, ThresholdDetector
from rlguard.guards.events import Event, Finding, Severity
from rlguard.guards.guard import Guard, make_guard
from rlguard.guards.interventions import Intervention, StepContext
from rlguard.guards.schedules import Constant, Cosine, Linear, Piecewise, Stages

if TYPE_CHECKING:
    from rlguard.guards.stats.collect import STAT_REDUCTIONS, StepStats, collect_step_stats, repetition_flags

_TORCH_NAMES = {
    name: "rlguard.guards.stats.collect"
    for name in ("STAT_REDUCTIONS", "StepStats", "collect_step_stats", "repetition_flags")
}

__all__ = [
    "PRESETS",
    "STAT_REDUCTIONS",
    "Constant",
    "Controls",
    "Cosine",
    "CusumDetector",
    "Decision",
    "Detector",
    "Event",
    "Finding",
    "Guard",
    "GuardConfig",
    "Intervention",
    "Linear",
    "Outcome",
    "Piecewise",
    "Proposal",
    "Severity",
    "SpikeDetector",
    "Stages",
    "StepContext",
    "StepStats",
    "ThresholdDetector",
    "collect_step_stats",
    "make_guard",
    "repetition_flags",
]


__getattr__ = lazy(__name__, _TORCH_NAMES)
