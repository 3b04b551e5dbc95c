"""A third-party objective, as a plugin author writes it (tests/project/test_plugin_objective.py installs this module as
the distribution ``rlguard-band-pg`` with an ``rlguard`` entry point; rlguard never imports it otherwise).

BandPG, the policy gradient through a ratio clipped to a trust band: ``l_it = -A_it clip(r_it, 1 - band_low,
1 + band_high)``, token mean over the batch. Unlike PPO's ``-min(r A, clip(r) A)``, which keeps the gradient where
the ratio moves against the advantage, every token whose ratio left the band loses its gradient. It declares what
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

    name = "band_pg"
    paper = "rlguard's plugin test"
    summary = "-A clip(r, 1 - band_low, 1 + band_high): no gradient outside the band"
    token_local = True
    clip_bounds = ("band_low", "band_high")
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
        return 1.0 - self.band_low, 1.0 + self.band_high

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        lo, hi = self.ratio_bounds()
        ratio = torch.exp(log_ratio)  # (B, T)
        loss = -batch.advantages * ratio.clamp(lo, hi)
        with torch.no_grad():
            return Surrogate(loss=loss, clipped_low=ratio < lo, clipped_high=ratio > hi)


@hookimpl
def rlguard_add_objectives() -> list[type[Objective]]:
    return [BandPG]
