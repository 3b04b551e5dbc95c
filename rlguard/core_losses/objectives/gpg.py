"""GPG: the plain policy gradient, with no ratio, clip or KL of its own."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlguard.core_losses.aggregation import Aggregation
from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objective import Objective
from rlguard.core_losses.ratios import Surrogate


@dataclass(frozen=True, kw_only=True)
class GPG(Objective):
    """GPG (Group Policy Gradient, arXiv 2504.02546): ``l_it = -A_it log pi(y_it)``, token mean over the
    batch.

    The paper's other ingredient, rescaling advantages by ``alpha = B / (B - M)`` for ``M`` groups whose
    rewards are all equal, acts on the advantages (compute them so); the loss is the REINFORCE term. verl's
    ``gpg``.
    """

    name = "gpg"
    paper = "arXiv 2504.02546"
    summary = "plain policy gradient -A log pi"

    aggregation: Aggregation = "token-mean"

    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        return Surrogate(loss=-batch.advantages * batch.logprobs)
