"""The built-in objectives, one module each; registered through the plugin manager by
:mod:`rlguard.core_losses.registry`."""

from rlguard.core_losses.objectives.cispo import CISPO
from rlguard.core_losses.objectives.covariance import ClipCov, KLCov
from rlguard.core_losses.objectives.dppo import DPPO, DPPOBinaryKL, DPPOBinaryTV
from rlguard.core_losses.objectives.dro import DRO
from rlguard.core_losses.objectives.gmpo import GMPO
from rlguard.core_losses.objectives.gpg import GPG
from rlguard.core_losses.objectives.grpo import DAPO, GRPO, DrGRPO
from rlguard.core_losses.objectives.gspo import GSPO, GSPOToken
from rlguard.core_losses.objectives.luspo import LUSPO
from rlguard.core_losses.objectives.sapo import SAPO
from rlguard.core_losses.objectives.vespo import VESPO

BUILTIN_OBJECTIVES = (
    GRPO,
    DrGRPO,
    DAPO,
    GSPO,
    GSPOToken,
    CISPO,
    SAPO,
    GMPO,
    LUSPO,
    VESPO,
    ClipCov,
    KLCov,
    GPG,
    DPPOBinaryTV,
    DPPOBinaryKL,
    DRO,
)

__all__ = [
    "BUILTIN_OBJECTIVES",
    "CISPO",
    "DAPO",
    "DPPO",
    "DRO",
    "GMPO",
    "GPG",
    "GRPO",
    "GSPO",
    "LUSPO",
    "SAPO",
    "VESPO",
    "ClipCov",
    "DPPOBinaryKL",
    "DPPOBinaryTV",
    "DrGRPO",
    "GSPOToken",
    "KLCov",
]
