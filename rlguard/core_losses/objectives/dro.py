"""DRO: the policy gradient with a quadratic penalty on the log-ratio to the behaviour policy."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlguard.core_losses.aggregation import Aggregation
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objective import Objective, _check_range
from rlguard.core_losses.ratios import Surrogate
from rlguard.core_losses.translation import Translation


@dataclass(frozen=True, kw_only=True)
class DRO(Objective):
    """DRO (Direct Reward Optimization, arXiv 2405.19107, its policy term):
    ``l_it = -(A_it log pi(y_it) - tau/2 (log pi(y_it) - log pi_old(y_it))^2)``, token mean over the batch.

    The square keeps the policy near the one that sampled the data (DRO's regulariser, with pi_old in place of
    the paper's pi_ref). verl's ``dro`` (``policy_loss.dro_beta`` is ``tau``, which verl requires to be set).
    """

    name = "dro"
    paper = "arXiv 2405.19107"
    summary = "-A log pi + tau/2 (log pi/pi_old)^2"
    verl = Translation(
        fields={"tau": "policy_loss.dro_beta", "aggregation": "loss_agg_mode"}, required=("policy_loss.dro_beta",)
    )

    aggregation: Aggregation = "token-mean"
    tau: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_range("tau", self.tau, low=0.0, strict=True)

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        return Surrogate(loss=-(batch.advantages * batch.logprobs - 0.5 * self.tau * log_ratio.square()))
