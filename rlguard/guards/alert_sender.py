"""Deprecated: moved to :mod:`rlguard.guards.alerts.sender`; a deprecated path (``DeprecationWarning``)."""

from rlguard._deprecated import moved

__getattr__ = moved(__name__, ["rlguard.guards.alerts.sender"])
