"""``rlguard.guards``: monitors, collapse detectors, interventions and schedules; no framework import.

>>> from rlguard.guards import Guard, GuardConfig
>>> guard = Guard(GuardConfig.preset("default"))
>>> decision = guard.observe(step, stats)  # doctest: +SKIP
"""

from rlguard.guards.config import PRESETS, GuardConfig
from rlguard.guards.decision import Controls, Decision, Outcome, Proposal
from rlguard.guards.detectors import CusumDetector, Detector, SpikeDetector, ThresholdDetector
from rlguard.guards.events import Event, Finding, Severity
from rlguard.guards.guard import Guard
from rlguard.guards.interventions import Intervention, StepContext
from rlguard.guards.schedules import Constant, Cosine, Linear, Piecewise, Stages
from rlguard.guards.stats import STAT_REDUCTIONS, StepStats, collect_step_stats, repetition_flags

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
    "repetition_flags",
]
