"""DPPO: a trust region on the divergence of the sampled token's probability, in place of ratio clipping."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlguard.core_losses.aggregation import Aggregation
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objective import Objective, _check_range
from rlguard.core_losses.ratios import Surrogate
from rlguard.core_losses.translation import Translation

#: Added to ``1 - p`` inside the binary KL's log, as the paper's code does, so that ``p -> 1`` stays finite.
BINARY_KL_EPS = 1e-8


@dataclass(frozen=True, kw_only=True)
class DPPO(Objective):
    """DPPO (Divergence Proximal Policy Optimization, arXiv 2602.04879), the Binary approximations.

    ``l_it = -A_it sg[min(r_it, is_cap)] log pi(y_it) M_it``: the policy gradient with truncated importance
    weights (sec. 5.4, in place of the dual clip), where the mask ``M_it`` drops a token whose update has left
    the trust region in the direction its advantage pushes: ``A > 0`` and ``D > clip_high`` with ``pi`` up, or
    ``A <= 0`` and ``D > clip_low`` with ``pi`` down. ``D`` compares the token's probability under ``pi`` and
    ``pi_old`` (``p``, ``mu``): subclasses define it. ``clip_low``/``clip_high`` are the thresholds ``delta``
    (verl's ``clip_ratio_low``/``clip_ratio_high``; defaults are verl's). Dropped tokens count in ``clip_frac``.
    """

    clip_bounds = ("clip_low", "clip_high")
    verl = Translation(
        fields={
            "clip_low": "clip_ratio_low",
            "clip_high": "clip_ratio_high",
            "is_cap": "clip_ratio_c",
            "aggregation": "loss_agg_mode",
        }
    )

    aggregation: Aggregation = "token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    is_cap: float = 20.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_range("clip_low", self.clip_low, low=0.0)
        _check_range("clip_high", self.clip_high, low=0.0)
        _check_range("is_cap", self.is_cap, low=0.0, strict=True)

    def inside(self, p: Tensor, mu: Tensor, advantages: Tensor) -> Tensor:
        """``(B, T)`` bool: the token stays in the trust region. p, mu: probabilities ``(B, T)``."""
        raise NotImplementedError

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        adv = batch.advantages  # (B, T)
        _check_log_probabilities(batch, mask, self.name)
        with torch.no_grad():
            weight = torch.exp(log_ratio).clamp(max=self.is_cap)  # (B, T) sg[min(r, C)]
            p, mu = torch.exp(batch.logprobs), torch.exp(batch.old_logprobs)  # (B, T)
            inside = self.inside(p, mu, adv)
        loss = -adv * weight * batch.logprobs * inside.to(adv.dtype)
        return Surrogate(loss=loss, clipped_low=~inside & (adv < 0), clipped_high=~inside & (adv > 0))


@dataclass(frozen=True, kw_only=True)
class DPPOBinaryTV(DPPO):
    """DPPO-Binary-TV (arXiv 2602.04879): ``D = |p - mu|``, the total variation of the binary distribution
    {sampled token, rest}; the mask keeps ``p - mu <= clip_high`` for ``A > 0`` and ``p - mu >= -clip_low``
    otherwise. verl's ``dppo_tv``."""

    name = "dppo_tv"
    paper = "arXiv 2602.04879"
    summary = "TV trust region |pi - pi_old| <= delta on the sampled token; truncated IS"

    def inside(self, p: Tensor, mu: Tensor, advantages: Tensor) -> Tensor:
        return torch.where(advantages > 0, p - mu <= self.clip_high, p - mu >= -self.clip_low)


@dataclass(frozen=True, kw_only=True)
class DPPOBinaryKL(DPPO):
    """DPPO-Binary-KL (arXiv 2602.04879): ``D = mu log(mu/p) + (1 - mu) log((1 - mu)/(1 - p))``, the KL of the
    binary distributions {sampled token, rest} (with ``1e-8`` added to ``1 - mu`` and ``1 - p``); the mask keeps
    ``D <= clip_high or p <= mu`` for ``A > 0`` and ``D <= clip_low or p >= mu`` otherwise. verl's ``dppo_kl``."""

    name = "dppo_kl"
    paper = "arXiv 2602.04879"
    summary = "binary-KL trust region on the sampled token; truncated IS"

    def inside(self, p: Tensor, mu: Tensor, advantages: Tensor) -> Tensor:
        kl = mu * (torch.log(mu) - torch.log(p)) + (1.0 - mu) * torch.log(
            (1.0 - mu + BINARY_KL_EPS) / (1.0 - p + BINARY_KL_EPS)
        )  # (B, T)
        return torch.where(advantages > 0, (kl <= self.clip_high) | (p <= mu), (kl <= self.clip_low) | (p >= mu))


def _check_log_probabilities(batch: PreparedBatch, mask: Tensor, name: str) -> None:
    """DPPO reads probabilities: a log-prob above 0 is not one (and makes the binary KL NaN). One host read."""
    for field, value in (("logprobs", batch.logprobs), ("old_logprobs", batch.old_logprobs)):
        bad = (value.detach() > 0) & (mask > 0)
        if bool(bad.any()):
            first = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name} needs log-probabilities (<= 0): batch.{field} holds {int(bad.sum())} positive values at "
                f"unmasked positions, first {float(value[first]):.4g} at {first}. Pass the log-probs of the sampled "
                "tokens (log_softmax gathered at the token), not logits or log-ratios."
            )
