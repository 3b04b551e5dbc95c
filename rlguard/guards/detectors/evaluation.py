"""The evaluation beside the reward: an eval metric's fall from its established level, judged by the reward's own
drawdown rule (:class:`~rlguard.guards.detectors.rollouts.RewardCollapse`: one copy of the math)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from rlguard.guards.detectors.base import _metric
from rlguard.guards.detectors.rollouts import RewardCollapse
from rlguard.guards.events import Finding

__all__ = ["EvalDrop"]


@dataclass(kw_only=True)
class EvalDrop(RewardCollapse):
    """An evaluation metric falls from its best level: ``eval_score`` (higher is better: accuracy, pass rate, score)
    or, where a run logs only a loss-like metric, ``eval_loss`` (lower is better: loss, error, perplexity) negated, so
    that a fall is a rise of the loss. The doctor says which key it read and in which direction
    (:mod:`rlguard.doctor.keys`); ``--map KEY=eval_score`` or ``--map KEY=eval_loss`` declares one.

    The rule is ``reward_collapse``'s (an EWMA drawdown in robust sigmas and a share of the range), with two
    differences that come from what an evaluation is. It is measured on a fixed set, so its first values are a
    level (a warm start's) rather than the noisy start of a reward: a warm-up of 5 observations (the fewest a robust
    median and MAD are built from). And every finding needs a drop of at least ``min_drop`` (10%) of the best level,
    as ``reward_collapse``'s level rule (a 3% dip of a saturated 0.96 is no collapse): an evaluation that held one
    value has no spread to scale a drop by.
    """

    name = "eval_drop"
    finding_class = "control"
    source = "reward_collapse's EWMA drawdown (Roberts 1959; Hampel 1974) on the evaluation metric"
    summary = (
        "eval metric (eval_score up, eval_loss down) drops >= 5 (warn) / 10 (critical) EWMA sigmas and >= 30% of its "
        "range below its best (reward_collapse's rule), and >= 10% of its best level"
    )

    warmup: int = 5
    metric: str = "eval_score"
    min_drop: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        self._s_lower = False  # judging eval_loss, negated

    def reads(self) -> tuple[str, ...]:
        return ("eval_score", "eval_loss")

    def _what(self) -> str:
        return "eval_loss (lower is better, negated)" if self._s_lower else "eval_score (higher is better)"

    def _advice(self) -> str:
        return (
            "The policy is losing what it could do (a warm start destroyed, reward hacking): roll back to the best "
            "evaluation and lower the LR or raise the KL penalty."
        )

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        score, loss = _metric(stats, "eval_score"), _metric(stats, "eval_loss")
        if score is not None and math.isfinite(score):
            value = score
        elif loss is not None and math.isfinite(loss):
            value, self._s_lower = -loss, True
        else:
            return None
        return super().check(step, {self.metric: value}, armed)
