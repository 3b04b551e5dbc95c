"""``rlguard.core_losses``: the GRPO family, exact and data-parallel-correct, framework-agnostic.

>>> from rlguard.core_losses import PolicyBatch, get_objective
>>> out = get_objective("gspo")(PolicyBatch(logprobs=..., advantages=..., mask=...))  # doctest: +SKIP
"""

from rlguard.core_losses.advantages import ADVANTAGE_SCALES, GroupAdvantages, group_advantages
from rlguard.core_losses.aggregation import (
    AGGREGATIONS,
    Aggregation,
    aggregate,
    default_normalisers,
    masked_mean,
)
from rlguard.core_losses.batch import LossOutput, PolicyBatch, RolloutBatch
from rlguard.core_losses.controls import Controls
from rlguard.core_losses.fused import FusedLossOutput, objective_from_hidden
from rlguard.core_losses.kl import KL_ESTIMATORS, kl_estimate
from rlguard.core_losses.logprobs import logprobs_from_hidden, logprobs_from_logits
from rlguard.core_losses.objective import Objective
from rlguard.core_losses.objectives import (
    CISPO,
    DAPO,
    DPPO,
    DRO,
    GMPO,
    GPG,
    GRPO,
    GSPO,
    LUSPO,
    SAPO,
    VESPO,
    ClipCov,
    DPPOBinaryKL,
    DPPOBinaryTV,
    DrGRPO,
    GSPOToken,
    KLCov,
)
from rlguard.core_losses.registry import get_objective, list_objectives, objective_class
from rlguard.core_losses.translation import Translation

__all__ = [
    "ADVANTAGE_SCALES",
    "AGGREGATIONS",
    "CISPO",
    "DAPO",
    "DPPO",
    "DRO",
    "GMPO",
    "GPG",
    "GRPO",
    "GSPO",
    "KL_ESTIMATORS",
    "LUSPO",
    "SAPO",
    "VESPO",
    "Aggregation",
    "ClipCov",
    "Controls",
    "DPPOBinaryKL",
    "DPPOBinaryTV",
    "DrGRPO",
    "FusedLossOutput",
    "GSPOToken",
    "GroupAdvantages",
    "KLCov",
    "LossOutput",
    "Objective",
    "PolicyBatch",
    "RolloutBatch",
    "Translation",
    "aggregate",
    "default_normalisers",
    "get_objective",
    "group_advantages",
    "kl_estimate",
    "list_objectives",
    "logprobs_from_hidden",
    "logprobs_from_logits",
    "masked_mean",
    "objective_class",
    "objective_from_hidden",
]
