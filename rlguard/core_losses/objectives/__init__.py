"""The built-in objectives, one module each; registered through the plugin manager by
:mod:`rlguard.core_losses.registry`."""

from rlguard.core_losses.objectives.cispo import CISPO
from rlguard.core_losses.objectives.gmpo import GMPO
from rlguard.core_losses.objectives.grpo import DAPO, GRPO, DrGRPO
from rlguard.core_losses.objectives.gspo import GSPO, GSPOToken
from rlguard.core_losses.objectives.sapo import SAPO

BUILTIN_OBJECTIVES = (GRPO, DrGRPO, DAPO, GSPO, GSPOToken, CISPO, SAPO, GMPO)

__all__ = ["BUILTIN_OBJECTIVES", "CISPO", "DAPO", "GMPO", "GRPO", "GSPO", "SAPO", "DrGRPO", "GSPOToken"]
