"""The long task's run: the calibrated configuration, its warm start, its engine and its trainer pass (the hooks
of :class:`~rlguard.bench.collapse.spec.BaseRunConfig`). Design and calibration: :mod:`rlguard.bench.collapse_long`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn

from rlguard.bench.collapse.grid import TaskSpec
from rlguard.bench.collapse.report import Panel, ReportLayout
from rlguard.bench.collapse.spec import BaseRunConfig, TrainerPass
from rlguard.bench.collapse_long.engine import Rollouts, sample_rollouts, trainer_pass
from rlguard.bench.collapse_long.model import ModelConfig, TinyTransformer, make_model
from rlguard.bench.collapse_long.stressors import LongStressor, behaviour_policy
from rlguard.bench.collapse_long.task import NUM_SPECIAL, ReverseShiftTask


def warm_start(
    model: TinyTransformer, task: ReverseShiftTask, *, steps: int, seed: int, lr: float, noise: float
) -> None:
    """Supervised steps (batch 64) on demonstrations of prompts from a seed stream the RL loop never uses, in
    which each answer symbol is replaced by a uniformly drawn one with probability ``noise`` (imperfect SFT data:
    the warm-started policy is right at about ``1 - noise`` of the positions and RL has room to climb)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(20_000_003 * (seed + 1))
    for s in range(steps):
        prompts = task.prompts(64, seed=10_000_019 * (seed + 1) + s)  # (64, P)
        answers = task.answers(prompts)  # (64, T)
        symbols = answers[:, :-1]
        wrong = torch.rand(symbols.shape, generator=gen) < noise
        random_symbols = torch.randint(NUM_SPECIAL, task.vocab_size, symbols.shape, generator=gen)
        answers[:, :-1] = torch.where(wrong, random_symbols, symbols)
        ids = torch.cat([prompts, answers], dim=1)  # (64, P + T)
        logits = model(ids[:, :-1])[:, prompts.shape[1] - 1 :]  # (64, T, V), the answer's positions only
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, prompts.shape[1] :].flatten())
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()


@dataclass(frozen=True, kw_only=True)
class LongRunConfig(BaseRunConfig):
    """One run of the long task (defaults: the calibrated benchmark); the fields of
    :class:`~rlguard.bench.collapse.spec.BaseRunConfig` and:

    Attributes:
        length, alphabet: the task's symbols per prompt and alphabet size.
        d_model, n_layers, num_experts, top_k: the model (``num_experts`` applies under the ``moe`` stressor).
        warm_start_noise: the share of demonstration symbols replaced at random (:func:`warm_start`).
    """

    task: ClassVar[str] = "long"
    guard_sees_engine_gap: ClassVar[bool] = True

    stressor: LongStressor = field(default_factory=LongStressor)
    iterations: int = 60
    lr: float = 1e-3
    length: int = 32
    alphabet: int = 60
    d_model: int = 64
    n_layers: int = 2
    num_experts: int = 4
    top_k: int = 2
    warm_start_steps: int = 300
    warm_start_lr: float = 3e-3
    warm_start_noise: float = 0.5
    min_peak: float = 0.2

    @property
    def reverse_shift(self) -> ReverseShiftTask:
        """The task of the run."""
        return ReverseShiftTask(self.length, self.alphabet)

    @property
    def model(self) -> ModelConfig:
        """The model of the run: dense, or top-k MoE under the ``moe`` stressor."""
        task = self.reverse_shift
        return ModelConfig(
            vocab_size=task.vocab_size,
            max_len=task.prompt_length + task.max_new_tokens,
            d_model=self.d_model,
            n_layers=self.n_layers,
            num_experts=self.num_experts if self.stressor.moe else 0,
            top_k=self.top_k,
        )

    def make_model(self) -> TinyTransformer:
        """:func:`~rlguard.bench.collapse_long.model.make_model` of :attr:`model`."""
        return make_model(self.model, self.seed)

    def warm_start_key(self) -> tuple[object, ...]:
        """Seed, model, warm-start steps, rate and noise."""
        return (self.seed, self.model, self.warm_start_steps, self.warm_start_lr, self.warm_start_noise)

    def warm_start(self, model: nn.Module) -> None:
        """:func:`warm_start` with this run's task, steps, seed, rate and noise."""
        assert isinstance(model, TinyTransformer)
        warm_start(
            model,
            self.reverse_shift,
            steps=self.warm_start_steps,
            seed=self.seed,
            lr=self.warm_start_lr,
            noise=self.warm_start_noise,
        )

    def engine(
        self, model: nn.Module, gen: torch.Generator, history: deque[dict[str, Tensor]], age: int = 0
    ) -> nn.Module:
        """:func:`~rlguard.bench.collapse_long.stressors.behaviour_policy`."""
        assert isinstance(model, TinyTransformer)
        return behaviour_policy(model, self.stressor, gen, history, age)

    def sample(self, engine: nn.Module, iteration: int) -> Rollouts:
        """KV-cache sampling at temperature 1 (bf16 logits where the stressor's engine is bf16)."""
        assert isinstance(engine, TinyTransformer)
        with torch.no_grad():
            return sample_rollouts(
                engine,
                self.reverse_shift,
                num_prompts=self.num_prompts,
                group_size=self.group_size,
                seed=self.seed * 1_000_003 + iteration,
                bf16_logits=self.stressor.numerics.bf16,
            )

    def trainer_pass(self, model: nn.Module, rollouts: object) -> TrainerPass:
        """:func:`~rlguard.bench.collapse_long.engine.trainer_pass` (one float32 causal forward)."""
        assert isinstance(model, TinyTransformer) and isinstance(rollouts, Rollouts)
        return trainer_pass(model, rollouts)


OBJECTIVES: tuple[str, ...] = ("grpo", "dapo", "gspo", "cispo", "sapo")

LONG_TASK = TaskSpec(
    config_type=LongRunConfig,
    description="33-token completions of a reverse-shift task, a dense or top-2 MoE transformer, a bf16 engine",
    objectives=OBJECTIVES,
    guards=("off", "default"),
    default_out="benchmarks/collapse_long/results",
    # a smoke test of every layer (the MoE engine included) in seconds, not a measurement
    quick_objectives=("grpo", "gspo"),
    quick_stressors=("none", "moe"),
    quick_overrides={"iterations": 4, "warm_start_steps": 20, "num_prompts": 4, "group_size": 4, "length": 8},
    layout=ReportLayout(
        run_columns=(
            *("objective", "guard", "stressor", "seed", "collapsed", "collapse_reason", "collapse_step", "halted"),
            *("nonfinite", "start_reward", "final_reward", "peak_reward", "final_entropy", "mean_completion_tokens"),
            *("clip_frac", "routed_differently", "logp_gap_abs_mean", "staleness_mean", "iterations_run"),
            *("skips", "rollbacks", "lr_backoffs", "clip_changes"),
        ),
        summary_columns=(
            *("runs", "collapsed", "collapse_rate", "collapse_ci_low", "collapse_ci_high", "reasons", "halts"),
            *("start_reward_mean", "final_reward_mean", "final_reward_std", "mean_completion_tokens", "clip_frac"),
            *("routed_differently", "logp_gap_abs_mean", "staleness_mean"),
        ),
        table=(
            *(("stressor", "stressor"), ("objective", "objective"), ("guard", "guard")),
            *(("collapsed (95 % CI)", "collapsed_ci"), ("reasons", "reasons"), ("final reward", "final_reward")),
            *(("start", "start_reward"), ("tokens", "mean_completion_tokens"), ("clip frac", "clip_frac")),
            *(("routed differently", "routed_differently"), ("abs log-prob gap", "logp_gap_abs_mean")),
        ),
        paired=True,
        panels=(
            Panel("reward", "{objective}, {stressor}: reward", ylim=(0, 1)),
            Panel("entropy", "entropy (nats/token)"),
        ),
    ),
)
