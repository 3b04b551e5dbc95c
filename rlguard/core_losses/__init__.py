"""``rlguard.core_losses``: the GRPO family, exact and data-parallel-correct, framework-agnostic.

>>> from rlguard.core_losses import PolicyBatch, get_objective
>>> out = get_objective("gspo")(PolicyBatch(logprobs=..., advantages=..., mask=...))  # doctest: +SKIP

The names are loaded on first use (PEP 562): importing a torch-free module of this package (``controls``,
``translation``) does not import torch, so the doctor and the command line stay light. Without torch (the core
install, no ``rlguard[torch]``), asking for a name that needs it raises an ``ImportError`` naming the extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlguard._lazy import lazy

if TYPE_CHECKING:
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

#: public name -> the module that defines it
_MODULE_OF: dict[str, str] = {
    "ADVANTAGE_SCALES": "rlguard.core_losses.advantages",
    "AGGREGATIONS": "rlguard.core_losses.aggregation",
    "Aggregation": "rlguard.core_losses.aggregation",
    "CISPO": "rlguard.core_losses.objectives",
    "ClipCov": "rlguard.core_losses.objectives",
    "Controls": "rlguard.core_losses.controls",
    "DAPO": "rlguard.core_losses.objectives",
    "DPPO": "rlguard.core_losses.objectives",
    "DPPOBinaryKL": "rlguard.core_losses.objectives",
    "DPPOBinaryTV": "rlguard.core_losses.objectives",
    "DRO": "rlguard.core_losses.objectives",
    "DrGRPO": "rlguard.core_losses.objectives",
    "FusedLossOutput": "rlguard.core_losses.fused",
    "GMPO": "rlguard.core_losses.objectives",
    "GPG": "rlguard.core_losses.objectives",
    "GRPO": "rlguard.core_losses.objectives",
    "GSPO": "rlguard.core_losses.objectives",
    "GSPOToken": "rlguard.core_losses.objectives",
    "GroupAdvantages": "rlguard.core_losses.advantages",
    "KLCov": "rlguard.core_losses.objectives",
    "KL_ESTIMATORS": "rlguard.core_losses.kl",
    "LUSPO": "rlguard.core_losses.objectives",
    "LossOutput": "rlguard.core_losses.batch",
    "Objective": "rlguard.core_losses.objective",
    "PolicyBatch": "rlguard.core_losses.batch",
    "RolloutBatch": "rlguard.core_losses.batch",
    "SAPO": "rlguard.core_losses.objectives",
    "Translation": "rlguard.core_losses.translation",
    "VESPO": "rlguard.core_losses.objectives",
    "aggregate": "rlguard.core_losses.aggregation",
    "default_normalisers": "rlguard.core_losses.aggregation",
    "get_objective": "rlguard.core_losses.registry",
    "group_advantages": "rlguard.core_losses.advantages",
    "kl_estimate": "rlguard.core_losses.kl",
    "list_objectives": "rlguard.core_losses.registry",
    "logprobs_from_hidden": "rlguard.core_losses.logprobs",
    "logprobs_from_logits": "rlguard.core_losses.logprobs",
    "masked_mean": "rlguard.core_losses.aggregation",
    "objective_class": "rlguard.core_losses.registry",
    "objective_from_hidden": "rlguard.core_losses.fused",
}

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


__getattr__ = lazy(__name__, _MODULE_OF)


def __dir__() -> list[str]:
    return sorted(__all__)
