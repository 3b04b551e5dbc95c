"""GMPO: the geometric mean of token ratios instead of the arithmetic mean of token terms."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rlguard.core_losses.aggregation import Aggregation, masked_mean
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objective import Objective, _check_range
from rlguard.core_losses.ratios import Surrogate
from rlguard.core_losses.translation import Translation


@dataclass(frozen=True, kw_only=True)
class GMPO(Objective):
    """GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673, eq. 4):

    ``l_i = -A_i exp((1/|y_i|) sum_t sgn(A_i) min(sgn(A_i) log r_it, sgn(A_i) clip(log r_it, -clip_low,
    clip_high)))``, averaged over sequences. The clip is in log space, so the default ``0.4`` is the paper's
    ratio range ``(e^-0.4, e^0.4)``. Token-level advantages are averaged over each sequence's tokens to give
    ``A_i`` (as verl does). Tokens dropped by a rollout or off-policy mask leave both means.
    """

    name = "gmpo"
    paper = "arXiv 2507.20673"
    summary = "geometric mean of sign-aware clipped token ratios"
    ratio_level = "sequence"
    clip_bounds = ("clip_low", "clip_high")
    # TRL's epsilons are ratio bounds: GMPO's log-space clip keeps its own. verl's geo_mean ignores loss_agg_mode.
    verl = Translation(fields={"clip_low": "clip_ratio_low", "clip_high": "clip_ratio_high"})

    aggregation: Aggregation = "seq-mean-token-mean"
    clip_low: float = 0.4
    clip_high: float = 0.4

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_range("clip_low", self.clip_low, low=0.0)
        _check_range("clip_high", self.clip_high, low=0.0)

    def ratio_bounds(self) -> tuple[float | None, float | None]:
        return math.exp(-self.clip_low), math.exp(self.clip_high)

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        adv = batch.advantages  # (B, T)
        seq_adv = masked_mean(adv, mask, dim=-1).unsqueeze(-1)  # (B, 1) A_i
        sign = torch.sign(seq_adv)  # (B, 1) sgn(A_i)
        clamped = log_ratio.clamp(-self.clip_low, self.clip_high)
        log_min = sign * torch.minimum(sign * log_ratio, sign * clamped)  # (B, T)
        seq_log_ratio = masked_mean(log_min, mask, dim=-1).unsqueeze(-1)  # (B, 1)
        loss = (-seq_adv * torch.exp(seq_log_ratio)).expand_as(log_ratio)
        with torch.no_grad():
            clipped_low = ((log_ratio < -self.clip_low) & (seq_adv < 0)).expand_as(log_ratio)
            clipped_high = ((log_ratio > self.clip_high) & (seq_adv > 0)).expand_as(log_ratio)
        return Surrogate(loss=loss, clipped_low=clipped_low, clipped_high=clipped_high)
