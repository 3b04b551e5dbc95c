"""Deprecated: moved to :mod:`rlguard.guards.actuation.snapshot` and :mod:`rlguard.guards.actuation.budget`; a
deprecated path (``DeprecationWarning``)."""

from rlguard._deprecated import moved

__getattr__ = moved(__name__, ["rlguard.guards.actuation.snapshot", "rlguard.guards.actuation.budget"])
