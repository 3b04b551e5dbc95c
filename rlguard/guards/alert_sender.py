"""Deprecated: moved to :mod:`rlguard.guards.alerts.sender`; a deprecated path (``DeprecationWarning``)."""

from rlguard._moved import moved

__getattr__ = moved(__name__, ["rlguard.guards.alerts.sender"])
