"""rlguard: exact GRPO-family objectives and stability guards for RL on LLMs, pluggable into TRL and verl.

The names below are loaded on first use (PEP 562), so ``import rlguard.doctor`` or ``rlguard --version`` does not
import torch; ``from rlguard import get_objective`` imports :mod:`rlguard.core_losses` then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlguard._lazy import lazy

if TYPE_CHECKING:
    from rlguard.core_losses import LossOutput, PolicyBatch, get_objective, list_objectives

__version__ = "0.1.0"

_LAZY = {name: "rlguard.core_losses" for name in ("LossOutput", "PolicyBatch", "get_objective", "list_objectives")}

__all__ = ["LossOutput", "PolicyBatch", "__version__", "get_objective", "list_objectives"]


__getattr__ = lazy(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
