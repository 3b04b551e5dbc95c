"""Deprecated: moved to :mod:`rlguard.guards.interventions.mismatch_remedy`; the cause table is
:mod:`rlguard.guards.interventions.causes`; a deprecated path (``DeprecationWarning``)."""

from rlguard._deprecated import moved

__getattr__ = moved(__name__, ["rlguard.guards.interventions.mismatch_remedy", "rlguard.guards.interventions.causes"])
