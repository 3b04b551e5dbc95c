"""The short task: the tiny GRU of :mod:`rlguard.tasks.tiny` on single-digit addition (at most 4 sampled tokens),
its stressors and its engine. The design, the stressors and the collapse definition are in
:mod:`rlguard.bench.collapse`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn

from rlguard.bench.collapse.grid import TaskSpec
from rlguard.bench.collapse.report import Panel, ReportLayout
from rlguard.bench.collapse.spec import GUARDS, BaseRunConfig, BaseStressor, TrainerPass
from rlguard.tasks.moe import TinyMoELM, make_tiny_moe_model
from rlguard.tasks.tiny import (
    AdditionTask,
    CharTokenizer,
    Rollouts,
    TinyLM,
    make_tiny_model,
    sample_rollouts,
    sequence_logprobs,
)


@dataclass(frozen=True)
class TinyStressor(BaseStressor):
    """The short task's stressors (see :mod:`rlguard.bench.collapse`; defaults in brackets there).

    Attributes:
        name: ``none``, ``mismatch``, ``high_lr``, ``stale`` or ``moe``.
        mismatch_noise: rollout-engine weight noise, times each tensor's RMS (``mismatch``).
        mismatch_bf16: the engine computes its log-probs from bfloat16 logits (``mismatch``).
        lr_multiplier: learning-rate factor (``high_lr``).
        stale_steps: age in rollout batches of the policy that samples (``stale``).
        router_noise: rollout-engine router weight noise, times the router's RMS (``moe``).
    """

    mismatch_noise: float = 0.3
    mismatch_bf16: bool = True
    lr_multiplier: float = 5.0
    stale_steps: int = 8
    router_noise: float = 1.0


def perturbed_copy(model: TinyLM, noise: float, gen: torch.Generator, *, only: str | None = None) -> TinyLM:
    """A copy of ``model`` whose parameters (those whose name starts with ``only``, or all) carry Gaussian noise
    of ``noise`` times each tensor's RMS: a rollout engine whose numerics differ from the trainer's."""
    engine = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in engine.named_parameters():
            if only is None or name.startswith(only):
                rms = p.pow(2).mean().sqrt()
                p.add_(torch.randn(p.shape, generator=gen) * (noise * rms))
    return engine


def behaviour_policy(
    model: TinyLM, stressor: TinyStressor, gen: torch.Generator, history: deque[dict[str, Tensor]]
) -> tuple[TinyLM, torch.dtype | None]:
    """The policy that samples the next rollout batch and the dtype of its engine's logits (None: float32).

    ``history`` (``maxlen = stale_steps + 1``) receives the current weights under ``stale``; its oldest entry
    is the policy of ``stale_steps`` calls ago (fewer at the start of a run, or after ``history.clear()``).
    """
    if stressor.name == "mismatch":
        dtype = torch.bfloat16 if stressor.mismatch_bf16 else None
        return perturbed_copy(model, stressor.mismatch_noise, gen), dtype
    if stressor.name == "moe":
        return perturbed_copy(model, stressor.router_noise, gen, only="router"), None
    if stressor.name == "stale":
        history.append(copy.deepcopy(model.state_dict()))
        behaviour = copy.deepcopy(model)
        behaviour.load_state_dict(history[0])
        return behaviour, None
    return model, None


def effective_lr(config: TinyRunConfig) -> float:
    """The Adam learning rate of a run: ``lr``, times ``lr_multiplier`` under ``high_lr``."""
    return config.lr * config.stressor.lr_factor


def warm_start(model: TinyLM, *, steps: int, seed: int, lr: float = 3e-3, batch: int = 64) -> None:
    """Supervised steps on ``"a+b=" -> str(a+b) <eos>`` with prompts from a seed stream the RL loop never uses."""
    if steps <= 0:
        return
    tok, task = CharTokenizer(), AdditionTask()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for s in range(steps):
        pairs = task.prompts(batch, seed=10_000_019 * (seed + 1) + s)
        rows = [[tok.BOS, *tok.encode(p), *tok.encode(str(a)), tok.EOS] for p, a in pairs]
        width = max(map(len, rows))
        ids = torch.tensor([r + [tok.PAD] * (width - len(r)) for r in rows])
        targets = ids[:, 1:].clone()
        targets[:, : len(pairs[0][0])] = -100  # learn the answer only, not the prompt
        targets[targets == tok.PAD] = -100
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()


def _completion_routing(model: nn.Module, prompt_length: int) -> Tensor | None:
    """The experts the last forward of a :class:`TinyMoELM` chose for the completion positions, ``(B, T, 1, 1)``."""
    if not isinstance(model, TinyMoELM) or model.last_routing is None:
        return None
    return model.last_routing[:, prompt_length - 1 :, None, None]


@dataclass(frozen=True)
class TinyRollouts:
    """A rollout batch of the addition task with the engine's log-probs and (MoE) routing.

    Attributes:
        rollouts: the sampled completions (:class:`~rlguard.tasks.tiny.Rollouts`).
        engine_logprobs: ``(B, T)`` the engine's log-probs of its samples. engine_routing: ``(B, T, 1, 1)`` or None.
    """

    rollouts: Rollouts
    engine_logprobs: Tensor
    engine_routing: Tensor | None = None

    @property
    def mask(self) -> Tensor:
        """``(B, T)``."""
        return self.rollouts.mask

    @property
    def rewards(self) -> Tensor:
        """``(B,)``."""
        return self.rollouts.rewards

    @property
    def group_ids(self) -> Tensor:
        """``(B,)``."""
        return self.rollouts.group_ids

    def select(self, idx: Tensor) -> TinyRollouts:
        """The completions ``idx`` ``(b,)``."""
        r = self.rollouts
        sub = dataclasses.replace(
            r,
            input_ids=r.input_ids[idx],
            mask=r.mask[idx],
            rewards=r.rewards[idx],
            group_ids=r.group_ids[idx],
            completions=[r.completions[i] for i in idx.tolist()],
        )
        routing = None if self.engine_routing is None else self.engine_routing[idx]
        return TinyRollouts(sub, self.engine_logprobs[idx], routing)


@dataclass(frozen=True, kw_only=True)
class TinyRunConfig(BaseRunConfig):
    """One run of the short task (defaults: the recorded grid); the fields of
    :class:`~rlguard.bench.collapse.spec.BaseRunConfig` and:

    Attributes:
        hidden: model width.
    """

    task: ClassVar[str] = "short"

    stressor: TinyStressor = field(default_factory=TinyStressor)
    iterations: int = 100
    lr: float = 7e-3
    hidden: int = 32
    warm_start_steps: int = 100
    warm_start_lr: float = 1e-2
    min_peak: float = 0.3

    def make_model(self) -> TinyLM:
        """The GRU, or its top-1 MoE variant under the ``moe`` stressor."""
        if self.stressor.name == "moe":
            return make_tiny_moe_model(self.seed, self.hidden)
        return make_tiny_model(self.seed, self.hidden)

    def warm_start_key(self) -> tuple[object, ...]:
        """Seed, model kind and width, warm-start steps and rate."""
        return (self.seed, self.stressor.name == "moe", self.hidden, self.warm_start_steps, self.warm_start_lr)

    def warm_start(self, model: nn.Module) -> None:
        """:func:`warm_start` with this run's steps, seed and rate."""
        assert isinstance(model, TinyLM)
        warm_start(model, steps=self.warm_start_steps, seed=self.seed, lr=self.warm_start_lr)

    def engine(
        self, model: nn.Module, gen: torch.Generator, history: deque[dict[str, Tensor]], age: int = 0
    ) -> nn.Module:
        """:func:`behaviour_policy` (the short task has no asynchronous-pipeline stressor: ``age`` is unused)."""
        assert isinstance(model, TinyLM)
        return behaviour_policy(model, self.stressor, gen, history)[0]

    def sample(self, engine: nn.Module, iteration: int) -> TinyRollouts:
        """3 new tokens per completion, then the engine's log-probs (bf16 logits under ``mismatch``)."""
        assert isinstance(engine, TinyLM)
        bf16 = self.stressor.name == "mismatch" and self.stressor.mismatch_bf16
        rollouts = sample_rollouts(
            engine,
            num_prompts=self.num_prompts,
            group_size=self.group_size,
            max_new_tokens=3,
            seed=self.seed * 1_000_003 + iteration,
        )
        with torch.no_grad():
            logprobs, _ = sequence_logprobs(engine, rollouts, logits_dtype=torch.bfloat16 if bf16 else None)
        return TinyRollouts(rollouts, logprobs, _completion_routing(engine, rollouts.prompt_length))

    def trainer_pass(self, model: nn.Module, rollouts: object) -> TrainerPass:
        """:func:`~rlguard.tasks.tiny.sequence_logprobs` in float32."""
        assert isinstance(model, TinyLM) and isinstance(rollouts, TinyRollouts)
        logprobs, entropies = sequence_logprobs(model, rollouts.rollouts)
        return TrainerPass(logprobs, entropies, _completion_routing(model, rollouts.rollouts.prompt_length))


OBJECTIVES: tuple[str, ...] = ("grpo", "dapo", "gspo")
STRESSORS: tuple[str, ...] = TinyStressor.NAMES

TINY_TASK = TaskSpec(
    config_type=TinyRunConfig,
    description="the tiny GRU on single-digit addition (at most 4 tokens), the GRU or a top-1 MoE",
    objectives=OBJECTIVES,
    guards=GUARDS,
    default_out="benchmarks/collapse/results",
    quick_objectives=("grpo", "gspo"),
    quick_stressors=("none", "high_lr"),
    quick_overrides={"iterations": 30},
    layout=ReportLayout(
        run_columns=(
            *("objective", "guard", "stressor", "seed", "collapsed", "collapse_reason", "collapse_step"),
            *("final_reward", "peak_reward", "start_reward", "iterations_run"),
            *("skips", "rollbacks", "lr_backoffs", "clip_changes", "halts", "nonfinite", "clip_frac_mean"),
        ),
        summary_columns=(
            *("runs", "collapsed", "collapse_rate", "final_reward_mean", "final_reward_std", "median_collapse_step"),
            *("skips_mean", "rollbacks_mean", "lr_backoffs_mean", "halts", "clip_frac_mean"),
        ),
        table=(
            *(("stressor", "stressor"), ("objective", "objective"), ("guard", "guard"), ("collapsed", "collapsed")),
            *(("final reward", "final_reward"), ("median steps to collapse", "median_collapse_step")),
            *(("skips", "skips_mean"), ("rollbacks", "rollbacks_mean"), ("lr backoffs", "lr_backoffs_mean")),
            *(("halts", "halts"), ("clip frac", "clip_frac_mean"), ("wall s", "wall_s_mean")),
        ),
        paired=False,
        panels=(Panel("reward_trailing", "{objective}, stressor {stressor}", "reward (trailing mean)", (0, 1)),),
        plot_prefix="curves_",
        figsize=(6, 3.5),
        wall_digits=2,
    ),
)
