"""Loss aggregation: the one place where per-token terms become a scalar.

All modes are a *local sum divided by a normaliser*. When the normalisers are the counts of the whole optimizer
step (``num_tokens`` tokens, ``num_sequences`` sequences), the losses of its micro-batches add up to the loss of
the whole batch, and so do their gradients; under data parallelism where gradients are averaged over ``W``
ranks, pass the global counts divided by ``W``. This is the design of verl's ``agg_loss``
(verl/trainer/ppo/core_algos.py), with the normalisers made explicit.

With ``m`` the mask, ``l`` the per-token loss, ``L_i = sum_t m_it`` and ``G`` sequences:

- ``token-mean``              ``sum_it m_it l_it / num_tokens``        (DAPO, arXiv 2503.14476, eq. 8)
- ``seq-mean-token-mean``     ``sum_i (sum_t m_it l_it / L_i) / num_sequences``  (GRPO, arXiv 2402.03300)
- ``seq-mean-token-sum``      ``sum_it m_it l_it / num_sequences``
- ``seq-mean-token-sum-norm`` ``sum_it m_it l_it / (num_sequences * max_length)``  (Dr. GRPO, arXiv 2503.20783)

Biases, in brief: ``seq-mean-token-mean`` gives each sequence equal weight, so a token of a short completion
weighs more than one of a long completion (longer wrong answers are penalised less per token). ``token-mean``
weighs every token alike but its normaliser depends on the batch's total length. ``seq-mean-token-sum-norm``
uses a constant (the generation budget) and so has neither bias; its scale is smaller by ``mean L / max_length``.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)

Normaliser = float | int | Tensor


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(values * mask)`` over ``dim`` (all if None). values, mask: ``(B, T)``."""
    prod = values * mask
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 where nothing is unmasked. values, mask: ``(B, T)``."""
    return masked_sum(values, mask, dim) / (mask.sum() if dim is None else mask.sum(dim=dim)).clamp(min=1)


def masked_max(values: Tensor, mask: Tensor) -> Tensor:
    """Max of ``values`` where ``mask`` is 1; 0 where nothing is unmasked. No host-device sync."""
    top = values.masked_fill(mask == 0, float("-inf")).max()
    return torch.where(mask.any(), top, torch.zeros_like(top))


def masked_min(values: Tensor, mask: Tensor) -> Tensor:
    """Min of ``values`` where ``mask`` is 1; 0 where nothing is unmasked."""
    return -masked_max(-values, mask)


def check_aggregation(aggregation: str) -> None:
    """Raise ``ValueError`` naming the accepted modes unless ``aggregation`` is one of them."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {list(AGGREGATIONS)}; got {aggregation!r}.")


def check_normaliser(name: str, value: Normaliser | None) -> None:
    """Normalisers must be positive and finite (a count, possibly divided by the data-parallel size)."""
    if value is None:
        return
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a number or a 1-element tensor; got shape {tuple(value.shape)}.")
        if value.device.type != "cpu":
            return  # reading an accelerator's value would cost a host-device sync on every step
        number = float(value.detach())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise ValueError(f"{name} must be a positive number; got {type(value).__name__} {value!r}.")
    if not number > 0 or number == float("inf"):
        raise ValueError(
            f"{name} must be positive and finite; got {number}. It is the count of the whole step's "
            f"{'tokens' if name == 'num_tokens' else 'sequences'} (divided by the data-parallel size if "
            "gradients are averaged); leave it None to use this batch's own count."
        )


def aggregate(
    values: Tensor,
    mask: Tensor,
    aggregation: Aggregation,
    *,
    count_mask: Tensor | None = None,
    num_tokens: Normaliser | None = None,
    num_sequences: Normaliser | None = None,
    max_length: int | None = None,
) -> Tensor:
    """Reduce per-token terms to the loss.

    Args:
        values: ``(B, T)`` per-token loss terms.
        mask: ``(B, T)`` float 0/1, tokens whose terms are summed.
        aggregation: one of :data:`AGGREGATIONS`.
        count_mask: ``(B, T)`` tokens that define the default counts and per-sequence lengths; defaults to
            ``mask``. Objectives pass the mask before rollout corrections here, so that tokens dropped by a
            correction lower the sum but not the normaliser, as with externally given global counts.
        num_tokens: normaliser of ``token-mean``; default ``count_mask.sum()``.
        num_sequences: normaliser of the ``seq-mean-*`` modes; default the number of non-empty rows.
        max_length: the constant of ``seq-mean-token-sum-norm``; default ``T``.

    Returns:
        0-dim loss. An all-masked batch gives exactly 0 with a zero gradient.
    """
    check_aggregation(aggregation)
    counts = mask if count_mask is None else count_mask
    if aggregation == "token-mean":
        denom = counts.sum().clamp(min=1) if num_tokens is None else num_tokens
        return masked_sum(values, mask) / denom
    seq_lengths = counts.sum(dim=-1)  # (B,)
    denom_seq = (seq_lengths > 0).sum().clamp(min=1) if num_sequences is None else num_sequences
    if aggregation == "seq-mean-token-mean":
        per_seq = masked_sum(values, mask, dim=-1) / seq_lengths.clamp(min=1)  # (B,)
        return per_seq.sum() / denom_seq
    total = masked_sum(values, mask)
    if aggregation == "seq-mean-token-sum":
        return total / denom_seq
    length = values.shape[-1] if max_length is None else max_length
    return total / (denom_seq * length)


def default_normalisers(mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(num_tokens, num_sequences)`` of a batch: the counts to sum over micro-batches/ranks. mask ``(B, T)``."""
    m = mask.to(torch.float64)
    return m.sum(), (m.sum(dim=-1) > 0).sum().to(torch.float64)
