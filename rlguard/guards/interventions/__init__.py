"""Interventions: one module each, named for what it does; :data:`BUILTIN_INTERVENTIONS` runs unless switched off,
:data:`OPT_IN_INTERVENTIONS` only where a :class:`~rlguard.guards.GuardConfig` names them.

The guard acts on the proposal that comes first in ``halt > rollback > skip > a step that changes the LR > a step
that changes the clip range > a step`` (:data:`~rlguard.guards.decision.LOGGED_ACTIONS`); the LR and clip scales of
all interventions are carried in the decision's controls whatever the outcome. Interventions are keyword-only
dataclasses with private state (``_s_*``) saved in ``state_dict``. Which one answers which cause is the cause table
(:mod:`rlguard.guards.interventions.causes`).
"""

from __future__ import annotations

from rlguard.guards.interventions.base import Intervention, Proposal, StepContext, findings_at_least
from rlguard.guards.interventions.causes import CAUSES, Cause, handed_over
from rlguard.guards.interventions.clip_controller import ClipController
from rlguard.guards.interventions.clip_higher import ClipHigher
from rlguard.guards.interventions.entropy_coef import AdaptiveEntropy
from rlguard.guards.interventions.halt import Halt
from rlguard.guards.interventions.lr_backoff import LRBackoff
from rlguard.guards.interventions.mismatch_remedy import REMEDIES, MismatchRemedy
from rlguard.guards.interventions.recovery import Recovery
from rlguard.guards.interventions.rollback import Rollback
from rlguard.guards.interventions.skip_no_signal import SkipNoSignal
from rlguard.guards.interventions.skip_step import SkipStep
from rlguard.guards.interventions.staleness_remedy import STALENESS_REMEDIES, StalenessRemedy
from rlguard.guards.interventions.trust_region import TrustRegion

__all__ = [
    "BUILTIN_INTERVENTIONS",
    "CAUSES",
    "OPT_IN_INTERVENTIONS",
    "REMEDIES",
    "STALENESS_REMEDIES",
    "AdaptiveEntropy",
    "Cause",
    "ClipController",
    "ClipHigher",
    "Halt",
    "Intervention",
    "LRBackoff",
    "MismatchRemedy",
    "Proposal",
    "Recovery",
    "Rollback",
    "SkipNoSignal",
    "SkipStep",
    "StalenessRemedy",
    "StepContext",
    "TrustRegion",
    "findings_at_least",
    "handed_over",
]

#: the interventions a guard runs unless its config switches them off
BUILTIN_INTERVENTIONS: tuple[type[Intervention], ...] = (
    SkipStep,
    SkipNoSignal,
    LRBackoff,
    ClipController,
    Rollback,
    Halt,
)
#: the built-in interventions that run only where a config names them (``enabled_by_default = False``)
OPT_IN_INTERVENTIONS: tuple[type[Intervention], ...] = (
    TrustRegion,
    ClipHigher,
    AdaptiveEntropy,
    Recovery,
    MismatchRemedy,
    StalenessRemedy,
)
