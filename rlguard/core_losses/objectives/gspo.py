"""GSPO and GSPO-token: the importance ratio and its clipping at the sequence level."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlguard.core_losses.aggregation import Aggregation
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objectives.grpo import GRPO
from rlguard.core_losses.ratios import Surrogate, clipped_surrogate, seq_log_ratio
from rlguard.core_losses.translation import Translation


@dataclass(frozen=True, kw_only=True)
class GSPO(GRPO):
    """GSPO (Group Sequence Policy Optimization, arXiv 2507.18071, eqs. 5-7).

    ``s_i = exp((1/|y_i|) sum_t log r_it)``; ``l_i = -min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i)``,
    averaged over sequences (the default aggregation ``seq-mean-token-mean`` of a term that is constant along
    each sequence). The paper's clip range is ``(3e-4, 4e-4)``. Token-level advantages are accepted (verl does)
    and enter per token; for the paper's objective give one advantage per sequence, or use ``gspo_token``.
    With ``token-mean`` or ``seq-mean-token-sum`` a sequence's weight grows with its length (trl #3823).
    Tokens dropped by a rollout or off-policy mask leave the mean of ``log s_i`` (verl's convention: its masks
    shrink ``response_mask`` before the loss).
    """

    name = "gspo"
    paper = "arXiv 2507.18071"
    summary = "length-normalised sequence ratio, clipped per sequence"
    ratio_level = "sequence"
    # verl applies the dual clip in `vanilla` only, not in `gspo`
    verl = Translation(
        fields={"clip_low": "clip_ratio_low", "clip_high": "clip_ratio_high", "aggregation": "loss_agg_mode"}
    )

    aggregation: Aggregation = "seq-mean-token-mean"
    clip_low: float = 3e-4
    clip_high: float = 4e-4

    def sequence_log_ratio(self, log_ratio: Tensor, mask: Tensor) -> Tensor:
        """``log s_i`` broadcastable against ``(B, T)``: ``(B, 1)``."""
        return seq_log_ratio(log_ratio, mask)

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        seq = self.sequence_log_ratio(log_ratio, mask)
        return clipped_surrogate(seq, batch.advantages, self.clip_low, self.clip_high, self.clip_c)


@dataclass(frozen=True, kw_only=True)
class GSPOToken(GSPO):
    """GSPO-token (arXiv 2507.18071, eqs. 13-14): ``s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]``.

    Numerically ``s_it = s_i`` (so clipping is per sequence), but each token carries its own advantage; with
    one advantage per sequence its gradient equals GSPO's.
    """

    name = "gspo_token"
    paper = "arXiv 2507.18071"
    summary = "GSPO for token-level advantages: sg[s_i] pi_t / sg[pi_t]"

    def sequence_log_ratio(self, log_ratio: Tensor, mask: Tensor) -> Tensor:
        seq = seq_log_ratio(log_ratio, mask).detach()  # (B, 1)
        return seq + log_ratio - log_ratio.detach()  # (B, T)
