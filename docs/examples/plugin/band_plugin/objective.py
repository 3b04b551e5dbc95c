"""The torch half of the plugin: an objective, in the ``rlguard.objectives`` group, loaded only where objectives
are listed or asked for (``get_objective``, the TRL and verl adapters, ``rlguard losses``).

BandPG, the policy gradient through a ratio clipped to a trust band: ``l_it = -A_it clip(r_it, 1 - band_low,
1 + band_high)``, token mean over the batch. Unlike PPO's ``-min(r A, clip(r) A)``, which keeps the gradient where
the ratio moves against the advantage, every token whose ratio left the band loses its gradient. It is no paper's
(``paper`` is left empty, and the TRL adapter announces it as a plugin with its defaults). It declares what
rlguard's adapters and fused path need (``docs/guides/plugins.md``): its clip bounds, TRL's and verl's settings of
them, TRL's clip metrics, and that each token's gradient is local to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlguard.core_losses import Objective, Translation
from rlguard.core_losses.aggregation import Aggregation
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.ratios import Surrogate
from rlguard.hookspecs import hookimpl


@dataclass(frozen=True, kw_only=True)
class BandPG(Objective):
    """``l_it = -A_it clip(r_it, 1 - band_low, 1 + band_high)``, ``r_it = pi(y_it) / pi_old(y_it)``."""

    name = "band_pg"  # get_objective("band_pg"); in verl, loss_mode=rlguard.band_pg
    summary = "-A clip(r, 1 - band_low, 1 + band_high): no gradient outside the band"
    token_local = True  # each token's gradient depends on that token only: the fused path may chunk a sequence
    clip_bounds = ("band_low", "band_high")  # what the guard's clip controls scale
    trl = Translation(fields={"band_low": "epsilon", "band_high": "epsilon_high"}, metrics="clip_ratio")
    verl = Translation(
        fields={"band_low": "clip_ratio_low", "band_high": "clip_ratio_high", "aggregation": "loss_agg_mode"}
    )

    aggregation: Aggregation = "token-mean"
    band_low: float = 0.1
    band_high: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0.0 <= self.band_low < 1.0 and self.band_high >= 0.0):
            raise ValueError(
                f"band_pg needs 0 <= band_low < 1 and band_high >= 0; got band_low={self.band_low!r}, "
                f"band_high={self.band_high!r}."
            )

    def ratio_bounds(self) -> tuple[float, float]:
        """The band in ratio units: what TRL's clip metrics count outside."""
        return 1.0 - self.band_low, 1.0 + self.band_high

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        """The per-token term from ``log_ratio`` (B, T) and the batch's advantages (B, 1) or (B, T)."""
        lo, hi = self.ratio_bounds()
        ratio = torch.exp(log_ratio)  # (B, T)
        loss = -batch.advantages * ratio.clamp(lo, hi)  # (B, T)
        with torch.no_grad():
            return Surrogate(loss=loss, clipped_low=ratio < lo, clipped_high=ratio > hi)


@hookimpl
def rlguard_add_objectives() -> list[type[Objective]]:
    return [BandPG]
