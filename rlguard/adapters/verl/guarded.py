"""The guarded ``rlguard.<name>`` loss in verl's workers: the workers' actuator (``docs/design.md``).

Select the guarded loss with the usual ``rlguard.<name>`` loss mode and this module's config::

    actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo
    actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig
    +actor_rollout_ref.actor.policy_loss.max_poisoned_frac=0.5

Each micro-batch, :func:`guarded_policy_loss` (what ``rlguard.<name>`` runs under this config):

- masks poisoned sequences: a response with a NaN/Inf log-prob, old log-prob, advantage or IS weight at an
  unmasked position leaves the loss (zero gradient through ``torch.where``; the mini-batch's normalisers,
  which verl fixes from ``global_batch_info``, are unchanged), so the other sequences train as if it were
  absent;
- returns a zero loss, still connected to the graph (zero gradient, finite, and every FSDP rank runs its
  backward), when more than ``max_poisoned_frac`` of its sequences are poisoned or the driver set ``skip``;
- applies the driver's controls to the objective as verl's config sets it
  (:meth:`~rlguard.core_losses.Objective.with_controls`): ``clip_scale`` multiplies its clip bounds (from
  ``clip_ratio_low``/``clip_ratio_high`` or ``objective_kwargs``); ``clip_low``/``clip_high``, where set, replace
  them first (the guard's clip schedules);
- reports ``rlguard/nonfinite`` (non-finite values at unmasked positions), ``rlguard/masked_frac`` (tokens
  dropped, poisoned sequences included) and ``rlguard/guard/poisoned_seqs``, ``rlguard/guard/skipped``,
  ``rlguard/guard/clip_scale``, ``rlguard/guard/clip_low``/``clip_high`` (the objective's clip bounds the loss
  used, for objectives that have them) next to the objective's ``rlguard/*`` metrics. verl averages every
  policy-loss metric over micro-batches and ranks, so ``rlguard/guard/skipped`` is the fraction of micro-batches
  skipped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from rlguard.adapters.verl.loss import RLGuardPolicyLossConfig, VerlLossInputs, objective_loss
from rlguard.adapters.verl.mapping import config_get
from rlguard.core_losses import Controls

__all__ = ["GuardedPolicyLossConfig", "guarded_policy_loss", "poisoned_sequences"]


@dataclasses.dataclass
class GuardedPolicyLossConfig(RLGuardPolicyLossConfig):
    """``actor_rollout_ref.actor.policy_loss`` for the guarded ``rlguard.<name>`` losses.

    Select it with ``policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig``; set
    ``max_poisoned_frac`` with hydra's ``+``. ``controls`` and ``skip`` are the driver's, sent by
    :class:`VerlGuardDriver` (leave them at their defaults on the command line).

    Attributes:
        max_poisoned_frac: a micro-batch with more than this fraction of its sequences poisoned (NaN/Inf inputs)
            gives a zero loss; below it, only the poisoned sequences are masked. 1.0 never skips.
        controls: the guard's controls of the objective (:class:`~rlguard.core_losses.Controls` as a dict:
            ``clip_scale``, ``clip_high_scale``, scheduled ``clip_low``/``clip_high``, ...); the ones verl applies
            outside the policy loss (``beta``, ``entropy_coef``) go to verl's own keys instead.
        skip: every micro-batch gives a zero loss (zero gradient; verl's optimizer still steps).
    """

    max_poisoned_frac: float = 0.5
    controls: dict[str, Any] = dataclasses.field(default_factory=dict)
    skip: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.max_poisoned_frac <= 1.0:
            raise ValueError(
                f"policy_loss.max_poisoned_frac must be in [0, 1] (1 never skips); got {self.max_poisoned_frac!r}."
            )
        try:
            Controls.from_dict(self.controls)
        except ValueError as err:
            raise ValueError(f"policy_loss.{err}") from None


def poisoned_sequences(response_mask: Tensor, *tensors: Tensor | None) -> tuple[Tensor, Tensor]:
    """Rows with a NaN/Inf at an unmasked position of any of ``tensors`` (each ``(B, T)``, None skipped).

    Returns:
        ``(poisoned (B,) bool, nonfinite () count of non-finite values at unmasked positions)``.
    """
    keep = response_mask.bool()  # (B, T)
    bad = torch.zeros_like(keep)
    count = torch.zeros((), dtype=torch.float64, device=keep.device)
    for value in tensors:
        if value is None:
            continue
        hit = ~torch.isfinite(value.detach()) & keep  # (B, T)
        bad = bad | hit
        count = count + hit.sum()
    return bad.any(dim=-1), count


def guarded_policy_loss(name: str, inputs: VerlLossInputs) -> tuple[Tensor, dict[str, float]]:
    """rlguard objective ``name`` on verl's ``inputs`` under their ``config.policy_loss`` (a
    :class:`GuardedPolicyLossConfig`); all tensors ``(B, T)``. See the module for what it masks, skips and reports."""
    guard = config_get(inputs.config, "policy_loss")
    if not isinstance(guard, GuardedPolicyLossConfig):
        raise ValueError(
            "guarded_policy_loss needs config.policy_loss to be a GuardedPolicyLossConfig; got "
            f"{type(guard).__name__}. Set policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig."
        )
    log_prob, mask = inputs.log_prob, inputs.response_mask.bool()  # (B, T)
    poisoned, nonfinite = poisoned_sequences(  # (B,)
        mask, log_prob, inputs.old_log_prob, inputs.advantages, inputs.rollout_is_weights
    )
    kept = mask & ~poisoned.unsqueeze(-1)  # (B, T)
    live = mask.any(dim=-1)  # (B,)
    poisoned_frac = poisoned.sum() / live.sum().clamp(min=1)
    skip = (poisoned_frac > guard.max_poisoned_frac) | guard.skip  # () bool, no host sync
    controls = Controls.from_dict(guard.controls)
    configured, norm = inputs.objective(name)
    objective = configured.with_controls(controls)
    loss, metrics = objective_loss(objective, norm, inputs, mask=kept.to(inputs.response_mask.dtype))
    # zero loss, zero gradient, graph intact (every rank's FSDP backward must run)
    zero = torch.where(torch.zeros_like(mask), log_prob, torch.zeros_like(log_prob)).sum().to(loss.dtype)
    loss = torch.where(skip, zero, loss)
    with torch.no_grad():
        tokens = mask.sum()
        dropped = tokens - kept.sum()
        extra = torch.stack([nonfinite, dropped.double(), tokens.double(), poisoned.sum().double(), skip.double()])
    nonfinite_count, dropped_tokens, all_tokens, n_poisoned, skipped = extra.tolist()
    objective_dropped = metrics.get("rlguard/masked_frac", 0.0) * (all_tokens - dropped_tokens)
    metrics.update(
        {
            "rlguard/nonfinite": nonfinite_count,
            "rlguard/masked_frac": (dropped_tokens + objective_dropped) / max(all_tokens, 1.0),
            "rlguard/guard/poisoned_seqs": n_poisoned,
            "rlguard/guard/skipped": skipped,
            "rlguard/guard/clip_scale": float(controls.clip_scale),
        }
    )
    # the clip range this loss used: the objective's bounds after the driver's controls
    for key, field in zip(("clip_low", "clip_high"), objective.clip_bounds or (), strict=False):
        value = getattr(objective, field)
        if value is not None:
            metrics[f"rlguard/guard/{key}"] = float(value)
    return loss, metrics
