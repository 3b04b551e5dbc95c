"""The metrics of one micro-batch's loss under TRL's own keys, computed as TRL computes them
(:func:`trl_metric_parts`). Which of TRL's families of loss metrics an objective logs is its own declaration
(``Objective.trl.metrics``), and the numbers come from what it declares about itself (``ratio_bounds``,
``ratio_level``, ``sequence_weights``): a plugin objective gets TRL's metrics like a built-in. ``GuardedGRPOTrainer``
gathers them with the objective's canonical metrics (reduced by :func:`rlguard.guards.stats.reduction.reduce_rows`) in
one collective per micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from numpy.typing import NDArray as _NDArray
from torch import Tensor

from rlguard.core_losses import Objective, PolicyBatch, kl_estimate
from rlguard.core_losses.ratios import seq_log_ratio, token_log_ratio

__all__ = ["TRLMetricParts", "trl_metric_parts"]

NDArray = _NDArray[Any]


@dataclass(frozen=True)
class TRLMetricParts:
    """One micro-batch's share of the metrics TRL's own loss logs (local sums, counted units, extremes), to gather
    over processes and :meth:`reduce` into TRL's keys; see :func:`trl_metric_parts`."""

    tokens: Tensor  # () loss tokens
    entropy: Tensor  # () sum of per-token entropies
    kl: Tensor | None  # () sum of per-token KL estimates; None without a KL term (TRL logs no "kl")
    clip: Tensor | None  # (6,) low, high, region sums, counted units, low_min, high_max; None: TRL logs none
    cispo: bool = False  # TRL's CISPO logs only cispo_clip_ratio
    vespo_phi: Tensor | None = None  # (2,) sum of VESPO's phi(W_i) over sequences, sequences; None: not VESPO

    def parts(self) -> list[Tensor]:
        """The values to gather, flat."""
        out = [self.tokens, self.entropy]
        out += [] if self.kl is None else [self.kl]
        out += [] if self.vespo_phi is None else list(self.vespo_phi.unbind())
        return out + ([] if self.clip is None else list(self.clip.unbind()))

    def reduce(self, gathered: NDArray) -> dict[str, float]:
        """``(W, len(parts()))`` gathered :meth:`parts` (float64, on the host) -> TRL's keys and values: means over
        all processes' tokens (or rows, for a sequence ratio), min and max over their sequences (NaN where none
        counted)."""
        sums = gathered.sum(axis=0).tolist()
        tokens = max(sums[0], 1.0)
        out = {"entropy": sums[1] / tokens}
        k = 2
        if self.kl is not None:
            out["kl"] = sums[2] / tokens
            k = 3
        if self.vespo_phi is not None:  # TRL: the mean of phi(W_i) over all processes' sequences
            out["vespo/phi_seq_mean"] = sums[k] / max(sums[k + 1], 1.0)
            k += 2
        if self.clip is None:
            return out
        units = max(sums[k + 3], 1.0)
        low, high, region = (v / units for v in sums[k : k + 3])
        if self.cispo:
            return {**out, "cispo_clip_ratio": high}
        low_min, high_max = float(gathered[:, k + 4].min()), float(gathered[:, k + 5].max())
        return {
            **out,
            "clip_ratio/low_mean": low,
            "clip_ratio/high_mean": high,
            "clip_ratio/region_mean": region,
            "clip_ratio/low_min": low_min if math.isfinite(low_min) else math.nan,
            "clip_ratio/high_max": high_max if math.isfinite(high_max) else math.nan,
        }


def trl_metric_parts(objective: Objective, batch: PolicyBatch) -> TRLMetricParts:
    """The metrics TRL's ``GRPOTrainer._compute_loss`` logs, as TRL defines them, for this micro-batch.

    ``entropy`` and ``kl`` are token means over the loss mask (before any off-policy or rollout masking, as in
    TRL; rlguard's ``rlguard/entropy`` and ``rlguard/kl_ref`` average over the tokens the loss kept). Clip fractions,
    for the objectives that declare TRL's families ``clip_ratio`` (the GRPO family: ``clip_ratio/*``) or
    ``cispo_clip_ratio`` (CISPO: its upper cap only): TRL counts a ratio clipped below where ``r < lo`` and
    ``A < 0``, above where ``r > hi`` and ``A > 0``, with ``(lo, hi)`` the objective's ``ratio_bounds()``
    (``1 - epsilon``, ``1 + epsilon_high``; CISPO's absolute cap ``epsilon_high``); the dual clip ``delta`` is not
    included. ``r`` is the ratio the loss clips: per token, or per sequence for an objective whose ``ratio_level``
    is ``"sequence"`` (GSPO, TRL's ``importance_sampling_level="sequence"``), where each row counts once. ``*_mean``
    average over the units of all processes; ``low_min``/``high_max`` are the extremes of the per-sequence
    fractions. The bounds are the objective's current ones (the guard may change them). rlguard's own
    ``rlguard/clip_frac*`` count tokens, the dual clip included, and every capped CISPO weight. ``vespo_phi``:
    the mean of the objective's ``sequence_weights`` over sequences.
    """
    with torch.no_grad():
        f64 = torch.float64
        logprobs = batch.logprobs.detach().to(f64)
        old = logprobs if batch.old_logprobs is None else batch.old_logprobs.to(f64)
        mask = batch.mask.to(f64)  # (B, T)
        tokens = mask.sum()
        entropy = torch.zeros((), dtype=f64) if batch.entropies is None else (batch.entropies.to(f64) * mask).sum()
        kl = None
        if objective.beta != 0.0 and batch.ref_logprobs is not None:
            behaviour = old if objective.kl_unbiased else None
            per_token = kl_estimate(
                logprobs, batch.ref_logprobs.to(f64), objective.kl_estimator, old_logprobs=behaviour
            )
            kl = (per_token * mask).sum()
        family = objective.trl.metrics
        if family == "vespo_phi":
            advantages = batch.advantages.to(f64)
            per_sequence = advantages.dim() == 1
            advantages = advantages.unsqueeze(-1) if per_sequence else advantages  # (B, 1) or (B, T)
            phi = objective.sequence_weights(token_log_ratio(logprobs, old), advantages.expand_as(mask), mask)
            if phi is None:
                raise ValueError(
                    f"objective {objective.name!r} declares TRL's vespo_phi metrics but has no sequence_weights."
                )
            phi = phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # as TRL's get_gamma_weights
            # TRL's phi is (B, 1) for sequence advantages (one value per sequence), else (B, T) over the mask
            phi_parts = (
                torch.stack([phi[:, 0].sum(), torch.tensor(float(phi.size(0)), dtype=f64)])
                if per_sequence
                else torch.stack([(phi * mask).sum(), tokens])
            )
            return TRLMetricParts(tokens, entropy, kl, None, vespo_phi=phi_parts)
        if family is None:
            return TRLMetricParts(tokens, entropy, kl, None)
        log_ratio = token_log_ratio(logprobs, old)  # (B, T)
        if objective.ratio_level == "sequence":
            log_ratio = seq_log_ratio(log_ratio, mask)  # (B, 1)
        advantages = batch.advantages.to(f64)
        advantages = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
        ratio = torch.exp(log_ratio)
        lo, hi = objective.ratio_bounds()
        high = ((ratio > (math.inf if hi is None else hi)) & (advantages > 0)).to(f64)  # (B, 1) or (B, T)
        low = ((ratio < (-math.inf if lo is None else lo)) & (advantages < 0)).to(f64)
        if family == "cispo_clip_ratio":
            low = torch.zeros_like(high)  # TRL's CISPO counts its upper cap only
        region = torch.maximum(low, high)
        if low.size(-1) == 1:  # one ratio per sequence: each row counts once
            weights, count = torch.ones_like(low), torch.tensor(float(low.size(0)), dtype=f64)
            per_seq_low, per_seq_high = low.squeeze(-1), high.squeeze(-1)  # (B,)
        else:
            weights, count = mask, tokens
            per_seq_low = (low * mask).sum(-1) / mask.sum(-1)  # (B,), NaN for empty rows
            per_seq_high = (high * mask).sum(-1) / mask.sum(-1)
        inf = torch.tensor(math.inf, dtype=f64)
        low_min = torch.where(per_seq_low.isnan(), inf, per_seq_low).min() if per_seq_low.numel() else inf
        high_max = torch.where(per_seq_high.isnan(), -inf, per_seq_high).max() if per_seq_high.numel() else -inf
        clip = torch.stack(
            [(low * weights).sum(), (high * weights).sum(), (region * weights).sum(), count, low_min, high_max]
        )
        return TRLMetricParts(tokens, entropy, kl, clip, cispo=family == "cispo_clip_ratio")
