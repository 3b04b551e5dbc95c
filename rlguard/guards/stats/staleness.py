"""Staleness stats of one micro-batch: each sample's age in policy versions, and the train-inference gap by age
bucket (:data:`rlguard.metrics.STALENESS_BUCKETS`), added to a :class:`~rlguard.guards.stats.collect.StepStats`.

An asynchronous pipeline (TRL's ``AsyncGRPOTrainer``, verl's fully async and one-step-off trainers) trains on
samples that an older policy generated. The age of a sample is the trainer's policy version minus the version that
sampled it; its age in optimizer steps (:class:`PublishedSteps`) is the updates between the weights that sampled it
and the weights it trains, which a pipeline that publishes every ``k`` optimizer steps counts apart from versions.
Its gap ``|log p_trainer - log p_rollout|`` is the engine's numerics at age 0 and the policy's drift since sampling
on top of that above it: a gap that grows with age is staleness, one that does not is the engine's (the cause
table, :mod:`rlguard.guards.interventions.causes`).
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from rlguard.guards.stats.collect import StepStats
from rlguard.metrics import STALENESS_BUCKETS

__all__ = [
    "PublishedSteps",
    "add_gap_by_age",
    "add_staleness_stats",
    "add_step_ages",
    "gap_by_age_parts",
    "staleness_bucket",
]


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
    if not _add_ages(st, ages, "staleness", "policy versions"):
        return
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


def add_step_ages(st: StepStats, ages: Tensor) -> None:
    """Add ``staleness_steps_mean`` (weighted by samples) and ``staleness_steps_max`` to ``st``: ``ages`` ``(B,)``,
    each sample's age in optimizer steps (:meth:`PublishedSteps.ages`, >= 0)."""
    _add_ages(st, ages, "staleness_steps", "optimizer steps")


def _add_ages(st: StepStats, ages: Tensor, stat: str, unit: str) -> bool:
    """Add ``<stat>_mean`` and ``<stat>_max`` of ``ages`` ``(B,)`` to ``st``; whether there were any."""
    ages = ages.detach().to(torch.float64).reshape(-1)  # (B,)
    if ages.numel() == 0:
        return False
    if not bool(torch.isfinite(ages).all()) or bool((ages < 0).any()):
        raise ValueError(f"ages must be finite and >= 0 {unit}; got {ages.tolist()}.")
    st.add(f"{stat}_mean", ages.mean(), float(ages.numel()))
    st.add(f"{stat}_max", ages.max())
    return True


class PublishedSteps:
    """The optimizer step at which each published policy version was made: a sample's age in optimizer steps.

    A pipeline that publishes its weights every ``k`` optimizer steps (TRL's ``weight_sync_steps``, verl's
    ``async_training.trigger_parameter_sync_step``) numbers them as versions, ``k`` updates apart, and the trainer
    runs up to ``k - 1`` updates ahead of the last one published. A sample's age in optimizer steps is the updates
    between the weights that generated it and the weights it trains: ``step - step_of(version)``, ``step`` the
    updates in the trainer's weights when its loss runs. After a rollback from step ``at`` to the weights of step
    ``to`` (:meth:`rollback`), the versions made after ``to`` are gone and the kept ones are ``at - to`` steps
    nearer than their step numbers say: the discarded updates are in no weights.
    """

    def __init__(self) -> None:
        self._versions: list[int] = []  # published versions, increasing
        self._steps: list[int] = []  # the optimizer step of each (along the kept lineage), non-decreasing

    def publish(self, version: int, step: int) -> None:
        """Version ``version`` holds the weights after ``step`` optimizer steps. A version after the last published
        one, at a step no earlier than its; publishing the last version again (the same weights sent again) keeps
        the step it was made at."""
        version, step = _whole("version", version), _whole("step", step)
        if self._versions and version == self._versions[-1]:
            return
        if self._versions and (version < self._versions[-1] or step < self._steps[-1]):
            raise ValueError(
                f"publish(version={version}, step={step}): versions and their steps go forward; the last published "
                f"is version {self._versions[-1]} at step {self._steps[-1]}."
            )
        self._versions.append(version)
        self._steps.append(step)

    def rollback(self, to_step: int, at_step: int) -> None:
        """At optimizer step ``at_step`` the trainer's weights went back to those of step ``to_step``: the versions
        made after ``to_step`` are forgotten, the kept ones count from ``at_step`` on."""
        to_step, at_step = _whole("to_step", to_step), _whole("at_step", at_step)
        if to_step > at_step:
            raise ValueError(f"rollback(to_step={to_step}, at_step={at_step}): to_step must not be after at_step.")
        kept = bisect.bisect_right(self._steps, to_step)
        self._versions = self._versions[:kept]
        self._steps = [s + at_step - to_step for s in self._steps[:kept]]

    def step_of(self, version: int) -> int:
        """The optimizer step of ``version``'s weights: that of the last version published at or before it."""
        i = bisect.bisect_right(self._versions, version) - 1
        if i < 0:
            first = f"the first is {self._versions[0]}" if self._versions else "none was"
            raise ValueError(f"policy version {version} was never published ({first}): no optimizer step to count.")
        return self._steps[i]

    def ages(self, versions: Tensor, step: int) -> Tensor:
        """``(B,)`` float64 on ``versions``' device: each sample's age in optimizer steps at the trainer's optimizer
        step ``step``, ``step - step_of(version)``, of ``versions`` ``(B,)`` (a fractional version counts by its
        whole versions); NaN for a version never published (no host sync: the caller checks where its values reach
        the host, as :func:`add_step_ages` does)."""
        whole = versions.detach().to(torch.float64).reshape(-1).floor()  # (B,)
        known = torch.tensor(self._versions, dtype=torch.float64, device=whole.device)  # (P,)
        made = torch.tensor(self._steps, dtype=torch.float64, device=whole.device)  # (P,)
        i = torch.searchsorted(known, whole, right=True) - 1  # (B,) the last version published at or before
        if not self._versions:
            return whole * math.nan
        at = torch.where((i >= 0) & whole.isfinite(), made[i.clamp(min=0)], math.nan)
        return float(_whole("step", step)) - at


def _whole(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0; got {value!r}.")
    return int(value)
