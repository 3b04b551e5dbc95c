"""GRPO and the objectives that differ from it only in clip range and aggregation: Dr. GRPO and DAPO."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlguard.core_losses.aggregation import Aggregation
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objective import Objective, _check_range
from rlguard.core_losses.ratios import Surrogate, clipped_surrogate
from rlguard.core_losses.translation import Translation


@dataclass(frozen=True, kw_only=True)
class GRPO(Objective):
    """GRPO (DeepSeekMath, arXiv 2402.03300, eq. 3): PPO's clipped token ratio, per-sequence token mean, then
    the mean over sequences.

    ``l_it = -min(r_it A_it, clip(r_it, 1 - clip_low, 1 + clip_high) A_it)``, ``r_it = pi(y_it)/pi_old(y_it)``;
    with ``clip_c`` the dual clip ``min(l_it, -clip_c A_it)`` for ``A_it < 0`` (Ye et al., arXiv 1912.09729).
    Tokens cut off by the dual clip count in ``clip_frac_high`` (it bounds the ratio from above).
    """

    name = "grpo"
    paper = "arXiv 2402.03300"
    summary = "token ratio, PPO clip; sequence mean of token means"
    sequence_variant = "gspo"
    token_local = True
    clip_bounds = ("clip_low", "clip_high")
    # TRL's two-sided clip delta is the dual clip where delta >= 1 + epsilon_high (the adapter checks)
    trl = Translation(
        fields={"clip_low": "epsilon", "clip_high": "epsilon_high", "clip_c": "delta"}, metrics="clip_ratio"
    )
    verl = Translation(
        fields={
            "clip_low": "clip_ratio_low",
            "clip_high": "clip_ratio_high",
            "clip_c": "clip_ratio_c",
            "aggregation": "loss_agg_mode",
        }
    )

    aggregation: Aggregation = "seq-mean-token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_c: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_range("clip_low", self.clip_low, low=0.0, high=1.0)
        _check_range("clip_high", self.clip_high, low=0.0)
        if self.clip_c is not None:
            _check_range("clip_c", self.clip_c, low=1.0, strict=True)

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        return clipped_surrogate(log_ratio, batch.advantages, self.clip_low, self.clip_high, self.clip_c)

    def ratio_bounds(self) -> tuple[float | None, float | None]:
        return 1.0 - self.clip_low, 1.0 + self.clip_high


@dataclass(frozen=True, kw_only=True)
class DrGRPO(GRPO):
    """Dr. GRPO (Understanding R1-Zero-Like Training, arXiv 2503.20783, eq. 3): GRPO without the length bias.

    The per-token terms are summed and divided by a constant, ``num_sequences * max_length``, instead of each
    sequence's own length; pair it with advantages without std normalisation (``group_advantages(...,
    scale="none")``). Pass ``max_length`` = the generation budget; the default (the batch's ``T``) depends on
    padding.
    """

    name = "dr_grpo"
    paper = "arXiv 2503.20783"
    summary = "GRPO without length bias: token sum / (G * max_length)"

    aggregation: Aggregation = "seq-mean-token-sum-norm"


@dataclass(frozen=True, kw_only=True)
class DAPO(GRPO):
    """DAPO (arXiv 2503.14476, eq. 8): decoupled clip-higher ``(0.2, 0.28)`` and the token mean over the batch.

    Dynamic sampling and the overlong reward shaping of the paper act on the data, not the loss.
    """

    name = "dapo"
    paper = "arXiv 2503.14476"
    summary = "clip-higher (0.2, 0.28), token mean over the batch"

    aggregation: Aggregation = "token-mean"
    clip_high: float = 0.28
