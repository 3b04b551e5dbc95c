"""rlguard: exact GRPO-family objectives and stability guards for RL on LLMs, pluggable into TRL and verl."""

from rlguard.core_losses import LossOutput, PolicyBatch, get_objective, list_objectives

__version__ = "0.1.0"

__all__ = ["LossOutput", "PolicyBatch", "__version__", "get_objective", "list_objectives"]
