"""Staleness stats of one micro-batch: each sample's age in policy versions, and the train-inference gap by age
bucket (:data:`rlguard.metrics.STALENESS_BUCKETS`), added to a :class:`~rlguard.guards.stats.collect.StepStats`.

An asynchronous pipeline (TRL's ``AsyncGRPOTrainer``, verl's fully async and one-step-off trainers) trains on
samples that an older policy generated. The age of a sample is the trainer's policy version minus the version that
sampled it. Its gap ``|log p_trainer - log p_rollout|`` is the engine's numerics at age 0 and the policy's drift
since sampling on top of that above it: a gap that grows with age is staleness, one that does not is the engine's
(the cause table, :mod:`rlguard.guards.interventions.causes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from rlguard.guards.stats.collect import StepStats
from rlguard.metrics import STALENESS_BUCKETS

__all__ = ["add_gap_by_age", "add_staleness_stats", "gap_by_age_parts", "staleness_bucket"]


def staleness_bucket(age: float) -> str:
    """The gap-by-age stat of a sample of ``age`` policy versions; a fractional age counts by its whole versions."""
    if isinstance(age, bool) or not isinstance(age, (int, float)) or not (math.isfinite(age) and age >= 0):
        raise ValueError(f"age must be a finite number of policy versions >= 0; got {age!r}.")
    whole = math.floor(age)
    return next(name for name, low, high in STALENESS_BUCKETS if low <= whole <= high)


def add_staleness_stats(
    st: StepStats,
    ages: Tensor,
    trainer_logprobs: Tensor | None = None,
    rollout_logprobs: Tensor | None = None,
    mask: Tensor | None = None,
) -> None:
    """Add ``staleness_mean`` (weighted by samples), ``staleness_max`` and, where the rollout's log-probs are
    given, the gap of each age bucket present (weighted by its tokens) to ``st``.

    Args:
        st: the step's accumulator.
        ages: ``(B,)`` each sample's age in policy versions (>= 0).
        trainer_logprobs, rollout_logprobs: ``(B, T)`` the trainer's and the engine's log-probs of the sampled
            tokens; ``mask``: ``(B, T)`` 1 for completion tokens. All three or none.
    """
    ages = ages.detach().to(torch.float64).reshape(-1)  # (B,)
    if ages.numel() == 0:
        return
    if not bool(torch.isfinite(ages).all()) or bool((ages < 0).any()):
        raise ValueError(f"ages must be finite and >= 0 policy versions; got {ages.tolist()}.")
    st.add("staleness_mean", ages.mean(), float(ages.numel()))
    st.add("staleness_max", ages.max())
    given = [x is not None for x in (trainer_logprobs, rollout_logprobs, mask)]
    if not any(given):
        return
    if not all(given):
        raise ValueError("trainer_logprobs, rollout_logprobs and mask: pass all three (the gap by age) or none.")
    assert trainer_logprobs is not None and rollout_logprobs is not None and mask is not None
    add_gap_by_age(st, gap_by_age_parts(ages, trainer_logprobs, rollout_logprobs, mask).tolist())


def gap_by_age_parts(ages: Tensor, trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Each age bucket's share of one micro-batch's gap: ``(2, K)`` float64 on the log-probs' device, row 0 the sum
    of ``|log p_trainer - log p_rollout|`` over the bucket's tokens, row 1 its tokens (``K`` the buckets of
    :data:`~rlguard.metrics.STALENESS_BUCKETS`, in order). Sums, so that they add over micro-batches and processes
    before the division (:func:`add_gap_by_age`); no host sync.

    Args:
        ages: ``(B,)`` each sample's age in policy versions (>= 0; a fractional age counts by its whole versions).
        trainer_logprobs, rollout_logprobs: ``(B, T)`` the trainer's and the engine's log-probs of the sampled
            tokens.
        mask: ``(B, T)`` 1 for completion tokens.
    """
    if trainer_logprobs.shape != rollout_logprobs.shape or mask.shape != trainer_logprobs.shape:
        raise ValueError(
            f"trainer_logprobs {tuple(trainer_logprobs.shape)}, rollout_logprobs {tuple(rollout_logprobs.shape)} and "
            f"mask {tuple(mask.shape)} must have one shape (B, T)."
        )
    if trainer_logprobs.shape[0] != ages.numel():
        raise ValueError(f"ages has {ages.numel()} samples, the log-probs {trainer_logprobs.shape[0]}.")
    keep = mask.detach().to(torch.float64)  # (B, T)
    gap = (trainer_logprobs.detach().to(torch.float64) - rollout_logprobs.detach().to(torch.float64)).abs() * keep
    whole = ages.detach().to(device=keep.device, dtype=torch.float64).reshape(-1).floor()  # (B,)
    rows = torch.stack([(whole >= low) & (whole <= high) for _, low, high in STALENESS_BUCKETS])  # (K, B)
    in_bucket = rows.to(torch.float64)
    return torch.stack([in_bucket @ gap.sum(dim=-1), in_bucket @ keep.sum(dim=-1)])  # (2, K)


def add_gap_by_age(st: StepStats, parts: Sequence[Sequence[float]]) -> None:
    """Add the gap of each age bucket that has tokens in ``parts`` (:func:`gap_by_age_parts`, on the host: its
    ``(2, K)`` rows as lists) to ``st``, weighted by its tokens."""
    sums, tokens = parts
    for (name, _, _), total, count in zip(STALENESS_BUCKETS, sums, tokens, strict=True):
        if count > 0:
            st.add(name, total / count, count)
