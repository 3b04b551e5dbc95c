"""The long task's stressors: each one documented cause of collapse, with its strength as a knob (calibration in
:mod:`rlguard.bench.collapse_long`)."""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from rlguard.bench.collapse.spec import BaseStressor
from rlguard.bench.collapse_long.engine import EngineNumerics, engine_copy
from rlguard.bench.collapse_long.model import TinyTransformer


@dataclass(frozen=True)
class LongStressor(BaseStressor):
    """One perturbation of the training loop and its strength.

    Attributes:
        name: ``none`` (control: dense model, exact engine), ``high_lr``, ``stale``, ``mismatch`` or ``moe``.
        lr_multiplier: learning-rate factor (``high_lr``).
        stale_steps: age, in rollout batches, of the policy that samples (``stale``).
        mismatch_noise: the dense engine's weight noise times each tensor's RMS, on top of bf16 (``mismatch``).
        router_noise: the MoE engine's router noise times the router's RMS, on top of bf16 (``moe``).
    """

    NAMES: ClassVar[tuple[str, ...]] = ("none", "high_lr", "stale", "mismatch", "moe")

    name: str = "none"
    lr_multiplier: float = 30.0
    stale_steps: int = 16
    mismatch_noise: float = 0.2
    router_noise: float = 3.0

    @property
    def moe(self) -> bool:
        """The run trains the top-k MoE model instead of the dense one."""
        return self.name == "moe"

    @property
    def numerics(self) -> EngineNumerics:
        """The rollout engine's numerics (exact except under ``mismatch`` and ``moe``)."""
        if self.name == "mismatch":
            return EngineNumerics(bf16=True, weight_noise=self.mismatch_noise)
        if self.name == "moe":
            return EngineNumerics(bf16=True, router_noise=self.router_noise)
        return EngineNumerics()


STRESSORS: tuple[str, ...] = LongStressor.NAMES


def behaviour_policy(
    model: TinyTransformer, stressor: LongStressor, gen: torch.Generator, history: deque[dict[str, Tensor]]
) -> TinyTransformer:
    """The engine that samples the next rollout batch.

    ``history`` (``maxlen = stale_steps + 1``) receives the current weights under ``stale``; its oldest entry is
    the policy of ``stale_steps`` calls ago (fewer at the start of a run, or after ``history.clear()``).
    """
    if stressor.name == "stale":
        history.append(copy.deepcopy(model.state_dict()))
        behaviour = copy.deepcopy(model)
        behaviour.load_state_dict(history[0])
        return behaviour
    return engine_copy(model, stressor.numerics, gen)
