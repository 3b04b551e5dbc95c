"""Importance ratios and the clipped surrogate, shared by every objective.

Ratios live in log space: ``log r_it = log pi(y_it) - log pi_old(y_it)``. Token-level and sequence-level
sampling share one code path by broadcasting a ``(B, T)`` or ``(B, 1)`` log-ratio, as TRL does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlguard.core_losses.aggregation import masked_mean

#: |log r| is clamped here before exponentiation (verl's value): ``exp(20) ~ 4.9e8`` is far beyond any clip
#: range, and without it ``exp`` overflows to Inf in float32 and ``0 * Inf`` turns an unused branch's gradient
#: into NaN.
LOG_RATIO_CLAMP = 20.0


def token_log_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """``log pi/pi_old`` per token, clamped to ``[-20, 20]``. ``(B, T)`` -> ``(B, T)``."""
    return (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def seq_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """GSPO's length-normalised sequence log-ratio ``log s_i = (1/|y_i|) sum_t log r_it``. ``(B, T)`` -> ``(B, 1)``.

    arXiv 2507.18071, eq. 7. Empty rows give 0 (ratio 1).
    """
    return masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1)


@dataclass(frozen=True)
class Surrogate:
    """Per-token policy terms of one objective, before IS weights, KL, entropy and aggregation.

    ``clipped_low``/``clipped_high`` mark tokens whose term was cut off by the lower/upper bound (the gradient
    through the ratio is zero there); ``None`` for objectives that do not clip (SAPO).
    """

    loss: Tensor  # (B, T)
    clipped_low: Tensor | None = None  # (B, T) bool
    clipped_high: Tensor | None = None  # (B, T) bool


def clipped_surrogate(
    log_ratio: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    clip_c: float | None = None,
) -> Surrogate:
    """PPO's clipped surrogate with decoupled bounds and optional dual clip.

    ``l = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)`` (PPO, arXiv 1707.06347; DAPO's clip-higher,
    arXiv 2503.14476), and for ``A < 0`` with dual clip ``l = min(l, -clip_c A)`` (arXiv 1912.09729).
    log_ratio ``(B, T)`` or ``(B, 1)``, advantages ``(B, T)``; returns terms of shape ``(B, T)``.
    """
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    with torch.no_grad():
        clipped_low = (ratio < 1.0 - clip_low) & (advantages < 0)
        clipped_high = (ratio > 1.0 + clip_high) & (advantages > 0)
    if clip_c is not None:
        loss_dual = -advantages * clip_c
        dual = (advantages < 0) & (loss_dual < loss)
        loss = torch.where(advantages < 0, torch.minimum(loss, loss_dual), loss)
        clipped_high = clipped_high | dual.detach()
    return Surrogate(loss=loss, clipped_low=clipped_low.expand_as(loss), clipped_high=clipped_high.expand_as(loss))


def truncated_weight_surrogate(
    log_ratio: Tensor, advantages: Tensor, logprobs: Tensor, low: float | None, high: float
) -> Surrogate:
    """A detached, truncated importance weight times the log-prob: ``l = -sg[clip(r, low, high)] A log pi``
    (CISPO, MiniMax-M1, arXiv 2506.13585, eqs. 4-5). Unlike a clipped ratio, every token keeps its gradient; the
    clip marks count the tokens whose weight was truncated. ``low=None``: no lower bound (the paper's choice).
    log_ratio ``(B, T)`` or ``(B, 1)`` (a sequence's), advantages and logprobs ``(B, T)``; terms ``(B, T)``."""
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(min=low, max=high).detach()
    loss = -advantages * weight * logprobs
    with torch.no_grad():
        clipped_low = ratio < low if low is not None else torch.zeros_like(ratio, dtype=torch.bool)
        clipped_high = ratio > high
    return Surrogate(loss=loss, clipped_low=clipped_low.expand_as(loss), clipped_high=clipped_high.expand_as(loss))
