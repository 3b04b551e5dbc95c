"""Deprecated: moved to :mod:`rlguard.guards.actuation.update_meter`; a deprecated path (``DeprecationWarning``)."""

from rlguard._deprecated import moved

__getattr__ = moved(__name__, ["rlguard.guards.actuation.update_meter"])
