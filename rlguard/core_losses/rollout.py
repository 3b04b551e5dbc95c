"""Training-inference mismatch: corrections for the gap between the trainer's pi_old and the inference engine's
sampling distribution mu, and DeepSeek-V3.2's off-policy sequence masking.

With ``log rho_it = log pi_old(y_it) - log mu(y_it)`` (the trainer's log-prob minus the engine's):

- truncated IS (TIS; Yao et al., "Your efficient RL framework secretly brings you off-policy RL training",
  2025): weight each token's policy term by ``min(rho_it, C)`` (``"token"``) or every token of sequence i by
  ``min(prod_t rho_it, C)`` (``"sequence"``); the weight is detached.
- masked IS (MIS / IcePop, arXiv 2510.18855): drop tokens with ``rho_it`` outside ``[C_min, C_max]``
  (``"token"``), whole sequences whose product ``prod_t rho_it`` (``"sequence"``) or geometric mean
  ``exp(mean_t log rho_it)`` (``"geometric"``) falls outside it.
- off-policy sequence masking (DeepSeek-V3.2, arXiv 2512.02556, eq. 9): drop sequence i when its advantage
  is negative and ``(1/|y_i|) sum_t log(mu(y_it) / pi(y_it)) > delta``.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import Tensor

from rlguard.core_losses.aggregation import masked_max, masked_mean, masked_sum
from rlguard.core_losses.kl import k3_from_log_ratio
from rlguard.core_losses.ratios import LOG_RATIO_CLAMP

RolloutISLevel = Literal["token", "sequence"]
RolloutMaskLevel = Literal["token", "sequence", "geometric"]
ROLLOUT_IS_LEVELS: tuple[str, ...] = get_args(RolloutISLevel)
ROLLOUT_MASK_LEVELS: tuple[str, ...] = get_args(RolloutMaskLevel)


def rollout_log_ratio(old_logprobs: Tensor, rollout_logprobs: Tensor) -> Tensor:
    """``log pi_old - log mu`` per token, clamped like every log-ratio. ``(B, T)`` -> ``(B, T)``, detached."""
    return (old_logprobs - rollout_logprobs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def truncated_is_weights(log_rho: Tensor, mask: Tensor, level: RolloutISLevel, cap: float) -> Tensor:
    """TIS weights ``min(rho, cap)`` per token or per sequence (product of token ratios). ``(B, T)`` -> ``(B, T)``."""
    if level == "token":
        return torch.exp(log_rho.clamp(max=math.log(cap)))
    log_seq = masked_sum(log_rho, mask, dim=-1).unsqueeze(-1)  # (B, 1)
    return torch.exp(log_seq.clamp(max=math.log(cap))).expand_as(log_rho)


def rejection_keep(log_rho: Tensor, mask: Tensor, level: RolloutMaskLevel, low: float, high: float) -> Tensor:
    """True for tokens whose ratio (token, sequence product or geometric mean) lies in ``[low, high]``. ``(B, T)``."""
    if level == "token":
        stat = log_rho
    elif level == "sequence":
        stat = masked_sum(log_rho, mask, dim=-1).unsqueeze(-1)  # (B, 1)
    else:
        stat = masked_mean(log_rho, mask, dim=-1).unsqueeze(-1)  # (B, 1)
    log_low = -math.inf if low == 0 else math.log(low)
    keep = (stat >= log_low) & (stat <= math.log(high))
    return keep.expand_as(log_rho)


def off_policy_sequence_keep(
    logprobs: Tensor, behaviour_logprobs: Tensor, advantages: Tensor, mask: Tensor, delta: float
) -> Tensor:
    """DeepSeek-V3.2's mask: False for every token of a sequence with negative advantage that drifted more
    than ``delta``. Token-level advantages count through their mean over the sequence.

    logprobs, behaviour_logprobs, advantages, mask: ``(B, T)``; returns bool ``(B, T)``.
    """
    drift = masked_mean((behaviour_logprobs - logprobs).detach(), mask, dim=-1)  # (B,)
    seq_adv = masked_mean(advantages, mask, dim=-1)  # (B,)
    drop = (seq_adv < 0) & (drift > delta)
    return (~drop).unsqueeze(-1).expand_as(logprobs)


def mismatch_metrics(trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """``mismatch_logp_abs_mean``/``_max`` of ``|log pi - log mu|`` and ``mismatch_kl``, k3 estimate of
    KL(mu || pi) from the engine's samples. Inputs ``(B, T)``; outputs 0-dim, detached."""
    with torch.no_grad():
        diff = trainer_logprobs - rollout_logprobs
        return {
            "mismatch_logp_abs_mean": masked_mean(diff.abs(), mask),
            "mismatch_logp_abs_max": masked_max(diff.abs(), mask),
            "mismatch_kl": masked_mean(k3_from_log_ratio(diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)), mask),
        }
