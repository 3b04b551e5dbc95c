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
- takes its clip range from the driver: ``clip_scale`` multiplies ``clip_ratio_low``/``clip_ratio_high``
  (and clip values in ``objective_kwargs``); ``clip_low``/``clip_high``, where set, replace them first
  (the guard's clip schedules);
- reports ``rlguard/nonfinite`` (non-finite values at unmasked positions), ``rlguard/masked_frac`` (tokens
  dropped, poisoned sequences included) and ``rlguard/guard/poisoned_seqs``, ``rlguard/guard/skipped``,
  ``rlguard/guard/clip_scale``, ``rlguard/guard/clip_low``/``clip_high`` (the clip range the loss used) next to
  the objective's ``rlguard/*`` metrics. verl averages every policy-loss
  metric over micro-batches and ranks, so ``rlguard/guard/skipped`` is the fraction of micro-batches skipped.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from rlguard.adapters.verl.loss import RLGuardPolicyLossConfig, policy_loss
from rlguard.adapters.verl.mapping import config_get

__all__ = ["GuardedPolicyLossConfig", "guarded_policy_loss", "poisoned_sequences"]

_CLIP_KEYS = ("clip_low", "clip_high")


@dataclasses.dataclass
class GuardedPolicyLossConfig(RLGuardPolicyLossConfig):
    """``actor_rollout_ref.actor.policy_loss`` for the guarded ``rlguard.<name>`` losses.

    Select it with ``policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig``; set
    ``max_poisoned_frac`` with hydra's ``+``. The other fields are the driver's controls, sent by
    :class:`VerlGuardDriver` (leave them at their defaults on the command line).

    Attributes:
        max_poisoned_frac: a micro-batch with more than this fraction of its sequences poisoned (NaN/Inf inputs)
            gives a zero loss; below it, only the poisoned sequences are masked. 1.0 never skips.
        clip_scale: multiplies the clip range (the guard's clip controller).
        clip_high_scale: multiplies the upper clip bound only, on top of ``clip_scale`` (clip-higher).
        clip_low, clip_high: replace ``clip_ratio_low``/``clip_ratio_high`` before scaling (clip schedules).
        skip: every micro-batch gives a zero loss (zero gradient; verl's optimizer still steps).
    """

    max_poisoned_frac: float = 0.5
    clip_scale: float = 1.0
    clip_high_scale: float = 1.0
    clip_low: float | None = None
    clip_high: float | None = None
    skip: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.max_poisoned_frac <= 1.0:
            raise ValueError(
                f"policy_loss.max_poisoned_frac must be in [0, 1] (1 never skips); got {self.max_poisoned_frac!r}."
            )
        for key in ("clip_scale", "clip_high_scale"):
            scale = getattr(self, key)
            if not (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)):
                raise ValueError(f"policy_loss.{key} must be a finite number > 0; got {scale!r}.")
        for key in _CLIP_KEYS:
            value = getattr(self, key)
            if value is not None and not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"policy_loss.{key} must be null or a number >= 0; got {value!r}.")


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


class _ClipOverlay:
    """verl's actor config with the driver's clip range: ``get`` answers the clip keys, the rest is the config's."""

    def __init__(self, config: Any, guard: GuardedPolicyLossConfig) -> None:
        self._config = config
        ratio = config_get(config, "clip_ratio", 0.2)
        low = guard.clip_low if guard.clip_low is not None else config_get(config, "clip_ratio_low")
        high = guard.clip_high if guard.clip_high is not None else config_get(config, "clip_ratio_high")
        scale = {"clip_low": guard.clip_scale, "clip_high": guard.clip_scale * guard.clip_high_scale}
        self._values: dict[str, Any] = {
            "clip_ratio_low": (ratio if low is None else low) * scale["clip_low"],
            "clip_ratio_high": (ratio if high is None else high) * scale["clip_high"],
        }
        kwargs = dict(guard.objective_kwargs)
        scaled = {key: kwargs[key] * scale[key] for key in _CLIP_KEYS if kwargs.get(key) is not None}
        if scaled:
            self._values["policy_loss"] = dataclasses.replace(guard, objective_kwargs={**kwargs, **scaled})

    def get(self, key: str, default: Any = None) -> Any:
        if key in self._values:
            return self._values[key]
        return config_get(self._config, key, default)


def guarded_policy_loss(
    name: str,
    *,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """rlguard objective ``name`` under ``config.policy_loss`` (a :class:`GuardedPolicyLossConfig`), with verl's
    calling convention; all tensors ``(B, T)``. See the module for what it masks, skips and reports."""
    guard = config_get(config, "policy_loss")
    if not isinstance(guard, GuardedPolicyLossConfig):
        raise ValueError(
            "guarded_policy_loss needs config.policy_loss to be a GuardedPolicyLossConfig; got "
            f"{type(guard).__name__}. Set policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig."
        )
    mask = response_mask.bool()  # (B, T)
    poisoned, nonfinite = poisoned_sequences(mask, log_prob, old_log_prob, advantages, rollout_is_weights)  # (B,)
    kept = mask & ~poisoned.unsqueeze(-1)  # (B, T)
    live = mask.any(dim=-1)  # (B,)
    poisoned_frac = poisoned.sum() / live.sum().clamp(min=1)
    skip = (poisoned_frac > guard.max_poisoned_frac) | guard.skip  # () bool, no host sync
    overlay = _ClipOverlay(config, guard)
    loss, metrics = policy_loss(
        name,
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=kept.to(response_mask.dtype),
        loss_agg_mode=loss_agg_mode,
        config=overlay,
        rollout_is_weights=rollout_is_weights,
    )
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
            "rlguard/guard/clip_scale": float(guard.clip_scale),
            # the clip range this loss used (verl's clip_ratio_low/high after the driver's controls)
            "rlguard/guard/clip_low": float(overlay.get("clip_ratio_low")),
            "rlguard/guard/clip_high": float(overlay.get("clip_ratio_high")),
        }
    )
    return loss, metrics


# -- driver ---------------------------------------------------------------------------------------------------
