"""LUSPO: GSPO without its length bias, each sequence's clipped term summed over its tokens."""

from __future__ import annotations

from dataclasses import dataclass

from rlguard.core_losses.aggregation import Aggregation
from rlguard.core_losses.objectives.gspo import GSPO


@dataclass(frozen=True, kw_only=True)
class LUSPO(GSPO):
    """LUSPO (Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261): GSPO's term scaled by the length
    of its sequence.

    ``l_i = -min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i)`` with GSPO's ``s_i`` (eq. 7 of arXiv
    2507.18071), summed over the ``|y_i|`` tokens of the sequence and averaged over sequences: the default
    aggregation ``seq-mean-token-sum`` gives ``(1/G) sum_i |y_i| l_i``. GSPO's per-sequence mean gives every
    sequence the same weight, so the gradient per token of a long answer is ``1/|y_i|`` that of a short one and
    lengths collapse; the token sum removes that. TRL's ``loss_type="luspo"``.
    """

    name = "luspo"
    paper = "arXiv 2602.05261"
    summary = "GSPO's clipped sequence ratio, summed over each sequence's tokens"

    aggregation: Aggregation = "seq-mean-token-sum"
