"""Deprecated: moved to :mod:`rlguard.guards.interventions.recovery`; a deprecated path (``DeprecationWarning``)."""

from rlguard._moved import moved

__getattr__ = moved(__name__, ["rlguard.guards.interventions.recovery"])
