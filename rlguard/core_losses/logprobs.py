"""Per-token log-probs and entropies from logits (the plain path; a chunked path will share its contract)."""

from __future__ import annotations

import torch
from torch import Tensor


def logprobs_from_logits(
    logits: Tensor, target_ids: Tensor, *, compute_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """log pi(target) and optionally the entropy of pi, per position, in float32 or wider.

    Args:
        logits: ``(B, T, V)``.
        target_ids: ``(B, T)`` integer ids of the sampled tokens.
        compute_entropy: also return ``H = -sum_v p_v log p_v``, ``(B, T)``.
    Returns:
        ``(logprobs (B, T), entropies (B, T) or None)``.
    """
    if logits.dim() != 3 or target_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"logits must be (B, T, V) and target_ids (B, T); got {tuple(logits.shape)} and {tuple(target_ids.shape)}."
        )
    logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # (B, T, V)
    logprobs = logp_all.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    entropies = -(logp_all.exp() * logp_all).sum(-1) if compute_entropy else None
    return logprobs, entropies
