"""Deprecated: the consequence rule moved to :mod:`rlguard.guards.consequence`; a deprecated path
(``DeprecationWarning``)."""

from rlguard._deprecated import moved

__getattr__ = moved(
    __name__,
    ["rlguard.guards.consequence.rule", "rlguard.guards.consequence.offline", "rlguard.guards.consequence.live"],
    {"judge": "judge_log"},
)
