"""CISPO: clip the importance-sampling weight, not the update, so every token keeps its gradient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from rlguard.core_losses.aggregation import Aggregation
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objective import Objective, _check_choice, _check_range
from rlguard.core_losses.ratios import Surrogate, truncated_weight_surrogate
from rlguard.core_losses.translation import Translation

CISPOBounds = Literal["relative", "absolute"]


@dataclass(frozen=True, kw_only=True)
class CISPO(Objective):
    """CISPO (MiniMax-M1, arXiv 2506.13585, eqs. 4-5): ``l_it = -sg[clip(r_it, lo, hi)] A_it log pi(y_it)``,
    token mean over the batch.

    Two conventions for the bounds are in use, chosen with ``bounds``:

    - ``"relative"`` (verl's ``cispo``): ``lo = 1 - clip_low``, ``hi = 1 + clip_high``;
    - ``"absolute"`` (TRL's ``loss_type="cispo"``, which clamps at ``epsilon_high``): ``lo = clip_low``,
      ``hi = clip_high``.

    ``clip_low=None`` puts no lower bound, as the paper does ("we did not impose a lower bound"). The default
    upper bound, ``1 + 4.0 = 5.0``, is TRL's recommended ``epsilon_high=5.0`` (ScaleRL, arXiv 2510.13786).
    """

    name = "cispo"
    paper = "arXiv 2506.13585"
    summary = "clipped, detached IS weight times log-prob"
    token_local = True
    keeps_gradient = True
    clip_bounds = ("clip_low", "clip_high")
    trl = Translation(
        fields={"clip_high": "epsilon_high"},
        fixed={"bounds": "absolute", "clip_low": None},
        paper={"epsilon_high": 5.0},  # 1 + the default clip_high: the same cap in TRL's absolute convention
        metrics="cispo_clip_ratio",
    )
    verl = Translation(
        fields={"clip_low": "clip_ratio_low", "clip_high": "clip_ratio_high", "aggregation": "loss_agg_mode"}
    )

    aggregation: Aggregation = "token-mean"
    clip_low: float | None = None
    clip_high: float = 4.0
    bounds: CISPOBounds = "relative"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("bounds", self.bounds, ("relative", "absolute"))
        if self.clip_low is not None:
            _check_range("clip_low", self.clip_low, low=0.0, high=1.0)
        _check_range("clip_high", self.clip_high, low=0.0, strict=True)
        lo, hi = self.weight_bounds()
        if lo is not None and lo > hi:
            raise ValueError(f"CISPO's lower weight bound {lo} exceeds its upper bound {hi} (bounds={self.bounds!r}).")

    def weight_bounds(self) -> tuple[float | None, float]:
        """``(lo, hi)`` of the IS weight in ratio units."""
        if self.bounds == "absolute":
            return self.clip_low, self.clip_high
        return (None if self.clip_low is None else 1.0 - self.clip_low), 1.0 + self.clip_high

    def ratio_bounds(self) -> tuple[float | None, float | None]:
        return self.weight_bounds()

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        lo, hi = self.weight_bounds()
        return truncated_weight_surrogate(log_ratio, batch.advantages, batch.logprobs, lo, hi)
