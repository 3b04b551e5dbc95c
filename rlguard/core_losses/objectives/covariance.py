"""Clip-Cov and KL-Cov: restrain the few tokens whose covariance of log-prob and advantage drives entropy down."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlguard.core_losses.aggregation import Aggregation, masked_mean
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objective import Objective, _check_range
from rlguard.core_losses.ratios import Surrogate, clipped_surrogate
from rlguard.core_losses.translation import Translation


def token_covariance(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """``Cov_t = (log pi_t - mean log pi)(A_t - mean A)``, means over the unmasked tokens of the batch. All
    ``(B, T)``; detached (arXiv 2505.22617, sec. 4)."""
    with torch.no_grad():
        lp = logprobs.detach()
        return (lp - masked_mean(lp, mask)) * (advantages - masked_mean(advantages, mask))


def _selection_size(ratio: float, mask: Tensor) -> int:
    """``max(1, int(ratio * N))`` for the ``N`` unmasked tokens (one host read: the count sizes the selection)."""
    return max(1, int(ratio * float(mask.sum())))


@dataclass(frozen=True, kw_only=True)
class ClipCov(Objective):
    """Clip-Cov (The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617, sec. 4): PPO's clipped
    token term, except for ``max(1, int(clip_cov_ratio * N))`` tokens drawn uniformly at random among those with
    ``clip_cov_lb < Cov_t < clip_cov_ub`` whose term the PPO clip has not already cut: their term and gradient
    are removed. ``N`` and the means of ``Cov`` are over this (micro-)batch, as in verl's ``clip_cov``.

    The draw is ``torch.randperm(n, generator=generator)`` over the candidates in row-major order, on the CPU;
    ``generator=None`` uses torch's default generator, so verl's loss and this one draw the same tokens from the
    same RNG state. Reading the candidate count costs one host-device sync. Removed tokens count in
    ``clip_frac_high`` (``A > 0``) or ``clip_frac_low``.
    """

    name = "clip_cov"
    paper = "arXiv 2505.22617"
    summary = "PPO clip; random high-covariance tokens lose their gradient"
    needs_whole_batch = True
    clip_bounds = ("clip_low", "clip_high")
    trl = Translation(fields={"clip_low": "epsilon", "clip_high": "epsilon_high"})  # Clip-Cov's PPO clip is TRL's
    verl = Translation(
        fields={
            "clip_low": "clip_ratio_low",
            "clip_high": "clip_ratio_high",
            "clip_cov_ratio": "policy_loss.clip_cov_ratio",
            "clip_cov_lb": "policy_loss.clip_cov_lb",
            "clip_cov_ub": "policy_loss.clip_cov_ub",
            "aggregation": "loss_agg_mode",
        }
    )

    aggregation: Aggregation = "token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_range("clip_low", self.clip_low, low=0.0, high=1.0)
        _check_range("clip_high", self.clip_high, low=0.0)
        _check_range("clip_cov_ratio", self.clip_cov_ratio, low=0.0, high=1.0, strict=True)
        _check_range("clip_cov_lb", self.clip_cov_lb, low=float("-inf"))
        _check_range("clip_cov_ub", self.clip_cov_ub, low=self.clip_cov_lb, strict=True)
        if self.generator is not None and not isinstance(self.generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator or None; got {type(self.generator).__name__}.")

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        adv = batch.advantages  # (B, T)
        terms = clipped_surrogate(log_ratio, adv, self.clip_low, self.clip_high)
        with torch.no_grad():
            ratio = torch.exp(log_ratio)
            cut_by_ppo = -adv * ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high) > -adv * ratio  # (B, T)
            cov = token_covariance(batch.logprobs, adv, mask)  # (B, T)
            candidates = (mask > 0) & ~cut_by_ppo & (cov > self.clip_cov_lb) & (cov < self.clip_cov_ub)
            index = candidates.flatten().nonzero().squeeze(-1)  # (n,) row-major
            drop = torch.zeros_like(candidates)  # (B, T) bool
            if index.numel() > 0:
                device = "cpu" if self.generator is None else self.generator.device
                perm = torch.randperm(index.numel(), generator=self.generator, device=device).to(index.device)
                chosen = index[perm[: _selection_size(self.clip_cov_ratio, mask)]]
                drop.view(-1)[chosen] = True
        loss = terms.loss * (~drop).to(terms.loss.dtype)
        assert terms.clipped_low is not None and terms.clipped_high is not None
        return Surrogate(
            loss=loss,
            clipped_low=terms.clipped_low | (drop & (adv < 0)),
            clipped_high=terms.clipped_high | (drop & (adv > 0)),
        )


@dataclass(frozen=True, kw_only=True)
class KLCov(Objective):
    """KL-Cov (arXiv 2505.22617, sec. 4): ``l_t = -A_t r_t``, plus ``kl_cov_coef * |log r_t|`` on the
    ``max(1, int(kl_cov_ratio * N))`` tokens of largest ``Cov_t`` in this (micro-)batch. No ratio clipping: the
    penalty holds back exactly the tokens that drive entropy down. verl's ``kl_cov`` (``ppo_kl_coef`` is
    ``kl_cov_coef``; defaults are verl's function defaults). Penalised tokens are not counted as clipped.
    """

    name = "kl_cov"
    paper = "arXiv 2505.22617"
    summary = "-A r, |log r| penalty on the top-covariance tokens"
    needs_whole_batch = True
    verl = Translation(
        fields={
            "kl_cov_ratio": "policy_loss.kl_cov_ratio",
            "kl_cov_coef": "policy_loss.ppo_kl_coef",
            "aggregation": "loss_agg_mode",
        }
    )

    aggregation: Aggregation = "token-mean"
    kl_cov_ratio: float = 2e-4
    kl_cov_coef: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_range("kl_cov_ratio", self.kl_cov_ratio, low=0.0, high=1.0, strict=True)
        _check_range("kl_cov_coef", self.kl_cov_coef, low=0.0)

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        adv = batch.advantages  # (B, T)
        loss = -adv * torch.exp(log_ratio)  # (B, T)
        with torch.no_grad():
            cov = token_covariance(batch.logprobs, adv, mask)  # (B, T)
            top = torch.zeros_like(mask, dtype=torch.bool)  # (B, T)
            valid = (mask > 0).flatten().nonzero().squeeze(-1)  # (N,) row-major
            if valid.numel() > 0:
                # top-k over the unmasked tokens only, in row-major order: ties (a micro-batch with one advantage
                # value has Cov = 0 everywhere) are then broken as in verl's kl_cov
                chosen = torch.topk(cov.flatten()[valid], _selection_size(self.kl_cov_ratio, mask)).indices
                top.view(-1)[valid[chosen]] = True
        penalty = self.kl_cov_coef * log_ratio.abs() * top.to(loss.dtype)  # (B, T)
        return Surrogate(loss=loss + penalty)
