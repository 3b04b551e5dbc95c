"""Deprecated: moved to :mod:`rlguard.guards.interventions.recovery`; a deprecated path (``DeprecationWarning``)."""

from rlguard._deprecated import moved

__getattr__ = moved(__name__, ["rlguard.guards.interventions.recovery"])
