"""The stressors: each one documented cause of collapse, with its strength as a knob (calibration in
:mod:`rlguard.bench.collapse_long`)."""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

import torch
from torch import Tensor

from rlguard.bench.collapse_long.engine import EngineNumerics, engine_copy
from rlguard.bench.collapse_long.model import TinyTransformer

STRESSORS: tuple[str, ...] = ("none", "high_lr", "stale", "mismatch", "moe")


@dataclass(frozen=True)
class Stressor:
    """One perturbation of the training loop and its strength.

    Attributes:
        name: ``none`` (control: dense model, exact engine), ``high_lr``, ``stale``, ``mismatch`` or ``moe``.
        lr_multiplier: learning-rate factor (``high_lr``).
        stale_steps: age, in rollout batches, of the policy that samples (``stale``).
        mismatch_noise: the dense engine's weight noise times each tensor's RMS, on top of bf16 (``mismatch``).
        router_noise: the MoE engine's router noise times the router's RMS, on top of bf16 (``moe``).
    """

    name: str = "none"
    lr_multiplier: float = 30.0
    stale_steps: int = 16
    mismatch_noise: float = 0.2
    router_noise: float = 3.0

    def __post_init__(self) -> None:
        if self.name not in STRESSORS:
            raise ValueError(f"stressor must be one of {list(STRESSORS)}; got {self.name!r}.")
        if not self.lr_multiplier > 0:
            raise ValueError(f"lr_multiplier must be > 0; got {self.lr_multiplier!r}.")
        if self.stale_steps < 0:
            raise ValueError(f"stale_steps must be >= 0 (0 is on-policy); got {self.stale_steps!r}.")
        for knob in ("mismatch_noise", "router_noise"):
            if not getattr(self, knob) >= 0:
                raise ValueError(f"{knob} must be >= 0; got {getattr(self, knob)!r}.")

    @property
    def moe(self) -> bool:
        """The run trains the top-k MoE model instead of the dense one."""
        return self.name == "moe"

    @property
    def lr_factor(self) -> float:
        """What the base learning rate is multiplied by."""
        return self.lr_multiplier if self.name == "high_lr" else 1.0

    @property
    def numerics(self) -> EngineNumerics:
        """The rollout engine's numerics (exact except under ``mismatch`` and ``moe``)."""
        if self.name == "mismatch":
            return EngineNumerics(bf16=True, weight_noise=self.mismatch_noise)
        if self.name == "moe":
            return EngineNumerics(bf16=True, router_noise=self.router_noise)
        return EngineNumerics()


def behaviour_policy(
    model: TinyTransformer, stressor: Stressor, gen: torch.Generator, history: deque[dict[str, Tensor]]
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
