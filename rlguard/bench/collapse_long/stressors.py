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

#: the asynchronous pipelines measured: staleness bound 1, 2, 4 and 8 policy versions
ASYNC_NAMES: tuple[str, ...] = ("async1", "async2", "async4", "async8")


@dataclass(frozen=True)
class LongStressor(BaseStressor):
    """One perturbation of the training loop and its strength.

    Attributes:
        name: ``none`` (control: dense model, exact engine), ``high_lr``, ``stale``, ``mismatch``, ``moe``, or
            ``async<A>`` (``async1``, ``async2``, ``async4``, ``async8``: an asynchronous pipeline with staleness
            bound ``A``; :func:`behaviour_policy`).
        lr_multiplier: learning-rate factor (``high_lr``).
        stale_steps: age, in rollout batches, of the policy that samples (``stale``).
        mismatch_noise: the dense engine's weight noise times each tensor's RMS, on top of bf16 (``mismatch``).
        router_noise: the MoE engine's router noise times the router's RMS, on top of bf16 (``moe``).
    """

    NAMES: ClassVar[tuple[str, ...]] = ("none", "high_lr", "stale", "mismatch", "moe", *ASYNC_NAMES)
    #: the asynchronous pipelines are a grid of their own (``--stressors none,async1,...``), not the default one
    GRID: ClassVar[tuple[str, ...] | None] = ("none", "high_lr", "stale", "mismatch", "moe")

    name: str = "none"
    lr_multiplier: float = 30.0
    stale_steps: int = 16
    mismatch_noise: float = 0.2
    router_noise: float = 3.0

    @property
    def max_age(self) -> int | None:
        """The pipeline's staleness bound under ``async<A>`` (``A``), else None."""
        return int(self.name[len("async") :]) if self.name in ASYNC_NAMES else None

    @property
    def history_length(self) -> int:
        """The past policies the engine may need: ``A + 1`` under ``async<A>``, ``stale_steps + 1`` otherwise."""
        return self.max_age + 1 if self.max_age is not None else self.stale_steps + 1

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
    model: TinyTransformer,
    stressor: LongStressor,
    gen: torch.Generator,
    history: deque[dict[str, Tensor]],
    age: int = 0,
) -> TinyTransformer:
    """The engine that samples the next rollout batch.

    ``history`` (``maxlen = stressor.history_length``) receives the current weights under ``stale`` and
    ``async<A>``; under ``stale`` its oldest entry samples (the policy of ``stale_steps`` calls ago), under
    ``async<A>`` the policy of ``age`` calls ago (the loop draws it:
    :func:`~rlguard.bench.collapse.spec.draw_age`). Fewer entries at the start of a run or after
    ``history.clear()`` give a younger policy.
    """
    if stressor.name == "stale" or stressor.max_age is not None:
        history.append(copy.deepcopy(model.state_dict()))
        behaviour = copy.deepcopy(model)
        behaviour.load_state_dict(history[0] if stressor.name == "stale" else history[-1 - min(age, len(history) - 1)])
        return behaviour
    return engine_copy(model, stressor.numerics, gen)
