"""SAPO: a smooth, temperature-controlled gate in place of the hard clip."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlguard.core_losses.aggregation import Aggregation
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objective import Objective, _check_range
from rlguard.core_losses.ratios import Surrogate
from rlguard.core_losses.translation import Translation


@dataclass(frozen=True, kw_only=True)
class SAPO(Objective):
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347, eqs. 5-7):
    ``l_it = -f(r_it) A_it``, ``f(r) = sigmoid(tau (r - 1)) * 4 / tau``, with ``tau = tau_pos`` for
    ``A_it > 0`` and ``tau_neg`` otherwise (the paper's 1.0 and 1.05), sequence mean of token means.

    ``f'(1) = 1``: on-policy the gradient is the plain policy gradient; off-policy it decays smoothly. SAPO
    clips nothing, so it reports no ``clip_frac`` metrics.
    """

    name = "sapo"
    paper = "arXiv 2511.20347"
    summary = "soft sigmoid gate 4/tau * sigmoid(tau (r - 1))"
    token_local = True
    keeps_gradient = True
    trl = Translation(fields={"tau_pos": "sapo_temperature_pos", "tau_neg": "sapo_temperature_neg"})
    # verl's sapo ignores loss_agg_mode: SAPO keeps its seq-mean-token-mean
    verl = Translation(fields={"tau_pos": "tau_pos", "tau_neg": "tau_neg"})

    aggregation: Aggregation = "seq-mean-token-mean"
    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_range("tau_pos", self.tau_pos, low=0.0, strict=True)
        _check_range("tau_neg", self.tau_neg, low=0.0, strict=True)

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        adv = batch.advantages
        # full_like keeps the compute dtype: a Python-float torch.where would round tau to float32
        tau = torch.where(adv > 0, torch.full_like(adv, self.tau_pos), torch.full_like(adv, self.tau_neg))  # (B, T)
        gate = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0)) * 4.0 / tau
        return Surrogate(loss=-gate * adv)
