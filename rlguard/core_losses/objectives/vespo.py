"""VESPO: a smooth gamma-shaped reshaping of the sequence-level importance weight, in place of clipping."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rlguard.core_losses.aggregation import Aggregation, masked_sum
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objective import Objective, _check_range
from rlguard.core_losses.ratios import LOG_RATIO_CLAMP, Surrogate
from rlguard.core_losses.translation import Translation

#: ``log W`` is clamped to ``[log 1e-8, 20]`` before the kernel, as in the paper's code (and TRL's).
LOG_WEIGHT_MIN = math.log(1e-8)


@dataclass(frozen=True, kw_only=True)
class VESPO(Objective):
    """VESPO (Variational Sequence-level Soft Policy Optimization, arXiv 2602.10693):

    ``W_i = prod_t r_it`` (the sequence's importance weight, no length normalisation),
    ``phi(W) = W^k exp(lambda (1 - W))`` (so ``phi(1) = 1``), with ``(k, lambda) = (k_pos, lambda_pos)`` where
    ``A >= 0`` and ``(k_neg, lambda_neg)`` otherwise, and ``l_it = -sg[phi(W_i)] A_it log pi(y_it)``: the
    gradient is the policy gradient scaled by ``phi(W_i)``, which decays smoothly for stale sequences instead of
    being cut off. Token mean over the batch; defaults are TRL's (``vespo_k_pos`` ... ``vespo_lambda_neg``).
    Nothing is clipped, so no ``clip_frac`` metrics.
    """

    name = "vespo"
    paper = "arXiv 2602.10693"
    summary = "gamma kernel W^k e^(lambda (1 - W)) on the sequence IS weight, detached"
    ratio_level = "sequence"
    trl = Translation(
        fields={
            "k_pos": "vespo_k_pos",
            "lambda_pos": "vespo_lambda_pos",
            "k_neg": "vespo_k_neg",
            "lambda_neg": "vespo_lambda_neg",
        },
        unsupported={
            "vllm_importance_sampling_correction": "TRL folds the engine ratio into VESPO's sequence weight W (log W "
            "gains sum_t log rho_t); rlguard's rollout_is multiplies each token's term instead, which is a different "
            "estimator"
        },
        metrics="vespo_phi",
    )

    aggregation: Aggregation = "token-mean"
    k_pos: float = 2.0
    lambda_pos: float = 3.0
    k_neg: float = 3.0
    lambda_neg: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("k_pos", "k_neg"):
            _check_range(name, getattr(self, name), low=0.0)
        for name in ("lambda_pos", "lambda_neg"):
            _check_range(name, getattr(self, name), low=0.0, strict=True)

    def sequence_weights(self, log_ratio: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
        """``phi(W_i)`` per token, detached. # log_ratio, mask (B, T); advantages (B, T) -> (B, T)"""
        with torch.no_grad():
            log_w = masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1)  # (B, 1) log W_i
            log_w = log_w.clamp(LOG_WEIGHT_MIN, LOG_RATIO_CLAMP)
            nonneg = advantages >= 0
            k = torch.where(nonneg, torch.full_like(advantages, self.k_pos), torch.full_like(advantages, self.k_neg))
            lam = torch.where(
                nonneg, torch.full_like(advantages, self.lambda_pos), torch.full_like(advantages, self.lambda_neg)
            )  # (B, T)
            return torch.exp(lam + k * log_w - lam * torch.exp(log_w))  # (B, T) phi(W_i), in log space

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        adv = batch.advantages  # (B, T)
        phi = self.sequence_weights(log_ratio, adv, mask)  # (B, T)
        return Surrogate(loss=-phi * adv * batch.logprobs)
