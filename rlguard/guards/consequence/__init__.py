"""Severity by consequence: the one rule that says when a detector's finding is critical (:mod:`.rule`), applied
over a whole log with hindsight by the doctor (:mod:`.offline`) and as findings are made by the live guard
(:mod:`.live`)."""

from __future__ import annotations

from rlguard.guards.consequence.level import RewardLevel
from rlguard.guards.consequence.live import OnlineConsequence, OnlineVerdict
from rlguard.guards.consequence.offline import Timeline, judge_log, label_findings, relabel
from rlguard.guards.consequence.rule import ConsequenceRule

__all__ = [
    "ConsequenceRule",
    "OnlineConsequence",
    "OnlineVerdict",
    "RewardLevel",
    "Timeline",
    "judge_log",
    "label_findings",
    "relabel",
]
