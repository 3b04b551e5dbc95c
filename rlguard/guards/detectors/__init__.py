"""Detectors: each reads the reduced stats of a step and returns a :class:`Finding` or None.

A detector is a keyword-only dataclass: thresholds are fields (with defaults), state is private and round-trips
through ``state_dict``. Baselines learn only from steps the detector found healthy, so a failure does not teach
the baseline that failure is normal. Warm-up, patience and hysteresis are applied by the guard
(:class:`rlguard.guards.Guard`) from the ``warmup``, ``patience`` and ``clear_after`` fields.

Three generic shapes cover most failure modes: :class:`SpikeDetector` (a value far above its rolling median, in
log space), :class:`CusumDetector` (a sustained upward shift, Page's CUSUM) and :class:`ThresholdDetector`
(absolute bounds, optionally above the run's own baseline). The rest read several stats together.

Modules: :mod:`~rlguard.guards.detectors.base` (the :class:`Detector` contract and shared helpers),
:mod:`~rlguard.guards.detectors.shapes` (the three generic shapes), and the built-in detectors by what they read:
:mod:`~rlguard.guards.detectors.update` (gradients, ratios, clipping, KL, mismatch),
:mod:`~rlguard.guards.detectors.entropy` and :mod:`~rlguard.guards.detectors.rollouts` (reward, lengths,
truncation, repetition), :mod:`~rlguard.guards.detectors.stalls` (a run that stopped learning: advantage collapse,
frozen values), :mod:`~rlguard.guards.detectors.evaluation` (the eval metric's drop) and
:mod:`~rlguard.guards.detectors.noise` (the reward window's step-to-step noise, read only where a lower bound of it
does not settle the step). Every name is importable from ``rlguard.guards.detectors``.
"""

from __future__ import annotations

from rlguard.guards.detectors.base import Detector
from rlguard.guards.detectors.entropy import EntropyBlowup, EntropyCollapse
from rlguard.guards.detectors.evaluation import EvalDrop
from rlguard.guards.detectors.rollouts import (
    LengthCollapse,
    LengthExplosion,
    RepetitionLoops,
    RewardCollapse,
    Truncation,
    ZeroVarianceGroups,
)
from rlguard.guards.detectors.shapes import CusumDetector, SpikeDetector, ThresholdDetector
from rlguard.guards.detectors.stalls import AdvantageCollapse, FrozenValues
from rlguard.guards.detectors.update import (
    MISMATCH_STATS,
    ClipFracBurst,
    GradNormExplosion,
    GradNormSpike,
    KLOldBlowup,
    KLRefBlowup,
    MismatchGrowth,
    NonFinite,
    RatioExplosion,
)

BUILTIN_DETECTORS: tuple[type[Detector], ...] = (
    NonFinite,
    GradNormSpike,
    GradNormExplosion,
    EntropyCollapse,
    EntropyBlowup,
    KLRefBlowup,
    KLOldBlowup,
    RatioExplosion,
    ClipFracBurst,
    MismatchGrowth,
    LengthExplosion,
    LengthCollapse,
    Truncation,
    RepetitionLoops,
    ZeroVarianceGroups,
    RewardCollapse,
    AdvantageCollapse,
    FrozenValues,
    EvalDrop,
)

__all__ = [
    "BUILTIN_DETECTORS",
    "MISMATCH_STATS",
    "AdvantageCollapse",
    "ClipFracBurst",
    "CusumDetector",
    "Detector",
    "EntropyBlowup",
    "EntropyCollapse",
    "EvalDrop",
    "FrozenValues",
    "GradNormExplosion",
    "GradNormSpike",
    "KLOldBlowup",
    "KLRefBlowup",
    "LengthCollapse",
    "LengthExplosion",
    "MismatchGrowth",
    "NonFinite",
    "RatioExplosion",
    "RepetitionLoops",
    "RewardCollapse",
    "SpikeDetector",
    "ThresholdDetector",
    "Truncation",
    "ZeroVarianceGroups",
]
