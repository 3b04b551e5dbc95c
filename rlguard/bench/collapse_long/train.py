"""One run: supervised warm start, then a compact GRPO-family loop in plain torch, judged for collapse."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from rlguard.bench.collapse import CollapseVerdict, collapse_verdict
from rlguard.bench.collapse.loop import policy_gradient_step
from rlguard.bench.collapse.spec import check_run_fields
from rlguard.bench.collapse_long.engine import mismatch_stats, sample_rollouts, trainer_pass
from rlguard.bench.collapse_long.model import ModelConfig, TinyTransformer, make_model
from rlguard.bench.collapse_long.stressors import Stressor, behaviour_policy
from rlguard.bench.collapse_long.task import NUM_SPECIAL, ReverseShiftTask
from rlguard.core_losses import PolicyBatch, get_objective, group_advantages
from rlguard.core_losses.rollout import mismatch_metrics
from rlguard.guards import Guard, GuardConfig
from rlguard.guards.actuator import TorchActuator, apply_decision, bind_guard
from rlguard.guards.trust_region import measures_update

GUARDS: tuple[str, ...] = ("off", "default", "stable")
GuardName = Literal["off", "default", "stable"]


@dataclass(frozen=True)
class RunConfig:
    """One training run of the grid (defaults: the calibrated benchmark).

    Attributes:
        objective: name for :func:`~rlguard.core_losses.get_objective` (its paper's defaults).
        guard: ``off``, or the preset of :class:`~rlguard.guards.GuardConfig` that acts (``default``, ``stable``).
        stressor: the perturbation and its strength.
        seed: seeds the model, the warm start, the prompts and the sampling (same data order in every cell).
        iterations: rollout batches. num_prompts, group_size: prompts per batch, completions per prompt.
        minibatches: optimizer steps per rollout batch, each on ``num_prompts / minibatches`` prompts.
        lr: Adam learning rate before the stressor's factor. max_grad_norm: gradient clipping (TRL's default).
        length, alphabet: the task's symbols per prompt and alphabet size.
        d_model, n_layers, num_experts, top_k: the model (``num_experts`` applies under the ``moe`` stressor).
        warm_start_steps, warm_start_lr, warm_start_noise: supervised steps (batch 64) before RL, their
            learning rate and the share of demonstration symbols replaced at random (:func:`warm_start`).
        window, min_peak, drop, entropy_drop, solved: the collapse definition's constants.
    """

    objective: str = "grpo"
    guard: GuardName = "off"
    stressor: Stressor = field(default_factory=Stressor)
    seed: int = 0
    iterations: int = 60
    num_prompts: int = 8
    group_size: int = 8
    minibatches: int = 2
    lr: float = 1e-3
    max_grad_norm: float = 1.0
    length: int = 32
    alphabet: int = 60
    d_model: int = 64
    n_layers: int = 2
    num_experts: int = 4
    top_k: int = 2
    warm_start_steps: int = 300
    warm_start_lr: float = 3e-3
    warm_start_noise: float = 0.5
    window: int = 10
    min_peak: float = 0.2
    drop: float = 0.5
    entropy_drop: float = 0.1
    solved: float = 0.95

    def __post_init__(self) -> None:
        check_run_fields(self, GUARDS)

    @property
    def task(self) -> ReverseShiftTask:
        """The task of the run."""
        return ReverseShiftTask(self.length, self.alphabet)

    @property
    def model(self) -> ModelConfig:
        """The model of the run: dense, or top-k MoE under the ``moe`` stressor."""
        task = self.task
        return ModelConfig(
            vocab_size=task.vocab_size,
            max_len=task.prompt_length + task.max_new_tokens,
            d_model=self.d_model,
            n_layers=self.n_layers,
            num_experts=self.num_experts if self.stressor.moe else 0,
            top_k=self.top_k,
        )


@dataclass
class RunResult:
    """One run's outcome; curves have one value per rollout batch."""

    config: RunConfig
    rewards: list[float]
    entropies: list[float]
    lengths: list[float]
    clip_fracs: list[float]
    logp_gaps: list[float]
    routed_differently: list[float]
    verdict: CollapseVerdict
    halted: bool = False
    nonfinite: bool = False
    interventions: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


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


_WARM_STARTS: dict[tuple[Any, ...], dict[str, Tensor]] = {}
WARM_START_CACHE: list[Path] = []  # a folder here makes warm starts persist across processes (set by the grid)


def warm_started_model(config: RunConfig) -> TinyTransformer:
    """The run's model after its warm start; identical for every cell of a seed, so trained once per process
    (and once per ``WARM_START_CACHE`` folder)."""
    model = make_model(config.model, config.seed)
    key = (config.seed, config.model, config.warm_start_steps, config.warm_start_lr, config.warm_start_noise)
    path = None
    if WARM_START_CACHE:
        name = f"warm_{config.seed}_{hashlib.sha1(repr(key).encode()).hexdigest()[:12]}.pt"
        path = WARM_START_CACHE[0] / name
        if key not in _WARM_STARTS and path.is_file():
            _WARM_STARTS[key] = torch.load(path)
    if key not in _WARM_STARTS:
        warm_start(
            model,
            config.task,
            steps=config.warm_start_steps,
            seed=config.seed,
            lr=config.warm_start_lr,
            noise=config.warm_start_noise,
        )
        _WARM_STARTS[key] = copy.deepcopy(model.state_dict())
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(_WARM_STARTS[key], path)
    model.load_state_dict(_WARM_STARTS[key])
    return model


@dataclass
class GuardTally:
    """What the guard did in a run: outcomes other than ``step``, LR backoffs and clip-range changes."""

    skips: int = 0
    rollbacks: int = 0
    lr_backoffs: int = 0
    clip_changes: int = 0
    last_lr_scale: float = 1.0

    def counts(self) -> dict[str, int]:
        """The ``runs.csv`` columns."""
        return {k: getattr(self, k) for k in ("skips", "rollbacks", "lr_backoffs", "clip_changes")}


def guarded_update(guard: Guard, step: int, stats: dict[str, float], actuator: TorchActuator, tally: GuardTally) -> str:
    """The one place the guard acts on this loop: judge ``stats`` and carry the decision out through the
    plain-torch actuator (which takes the optimizer step when the outcome is ``step``). Returns ``step``,
    ``skip``, ``rollback``, ``halt`` or ``nonfinite`` (the guard let a non-finite step through: a failed run)."""
    update_ratio = actuator.take_update_ratio()  # the previous applied update's, if the trust region reads it
    if update_ratio is not None:
        stats["update_ratio"] = update_ratio
    decision = guard.observe(step, stats)
    if decision.outcome == "step" and not _finite_stats(stats):
        return "nonfinite"
    current = actuator.objective_in_use
    outcome = apply_decision(decision, actuator).outcome
    tally.skips += outcome == "skip"
    tally.rollbacks += outcome == "rollback"
    tally.lr_backoffs += decision.controls.lr_scale < tally.last_lr_scale
    tally.clip_changes += actuator.objective_in_use is not current
    tally.last_lr_scale = decision.controls.lr_scale
    return outcome


def _mismatch(trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """:func:`~rlguard.core_losses.rollout.mismatch_metrics` of the trainer against the engine, as floats."""
    return {k: float(v) for k, v in mismatch_metrics(trainer_logprobs, engine_logprobs, mask).items()}


def _finite_stats(stats: dict[str, float]) -> bool:
    return math.isfinite(stats.get("loss", 0.0)) and math.isfinite(stats.get("grad_norm", 0.0))


def _finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def run_one(config: RunConfig, on_batch: Callable[[int, PolicyBatch], None] | None = None) -> RunResult:
    """Train one run and judge it; ``on_batch(iteration, batch)`` sees every minibatch before its loss."""
    start = time.perf_counter()
    st, task = config.stressor, config.task
    model = warm_started_model(config)
    lr = config.lr * st.lr_factor
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    objective = get_objective(config.objective)
    guard = None if config.guard == "off" else Guard(GuardConfig.preset(config.guard))
    # the guard's decisions act through it; it measures each update's relative size for the trust region
    actuator = TorchActuator(model, optimizer, objective=objective, measure_update=measures_update(guard))
    if guard is not None:
        bind_guard(guard, actuator, where="the long-completion collapse benchmark's loop")
    tally = GuardTally()
    gen = torch.Generator().manual_seed(config.seed)
    history: deque[dict[str, Tensor]] = deque(maxlen=st.stale_steps + 1)
    curves: dict[str, list[float]] = {k: [] for k in ("reward", "entropy", "length", "clip", "gap", "routed")}
    halted = nonfinite = False
    step = 0
    per_mb = config.num_prompts // config.minibatches * config.group_size
    for it in range(config.iterations):
        behaviour = behaviour_policy(model, st, gen, history)
        with torch.no_grad():
            rollouts = sample_rollouts(
                behaviour,
                task,
                num_prompts=config.num_prompts,
                group_size=config.group_size,
                seed=config.seed * 1_000_003 + it,
                bf16_logits=st.numerics.bf16,
            )
        advantages = group_advantages(rollouts.rewards, rollouts.group_ids).advantages  # (B,)
        curves["reward"].append(float(rollouts.rewards.mean()))
        curves["length"].append(float(rollouts.mask.sum(-1).mean()))
        entropy, clip = [], []
        for mb in range(config.minibatches):
            idx = torch.arange(mb * per_mb, (mb + 1) * per_mb)
            sub = rollouts.select(idx)
            tp = trainer_pass(model, sub)
            if mb == 0:  # trainer vs engine before any update of this batch
                gap = mismatch_stats(tp, sub)
                gap_stats = {} if behaviour is model else _mismatch(tp.logprobs, sub.engine_logprobs, sub.mask)
                curves["gap"].append(gap.logp_gap_abs_mean)
                curves["routed"].append(gap.routed_differently)
            batch = PolicyBatch(
                logprobs=tp.logprobs,
                advantages=advantages[idx],
                mask=sub.mask,
                old_logprobs=sub.engine_logprobs,
                rollout_logprobs=sub.engine_logprobs if behaviour is not model else None,
                entropies=tp.entropies,
            )
            if on_batch is not None:
                on_batch(it, batch)
            stats, _ = policy_gradient_step(
                actuator, optimizer, batch, max_grad_norm=config.max_grad_norm, lr=lr, rollouts=sub
            )
            entropy.append(stats.get("entropy", math.nan))
            clip.append(stats.get("clip_frac", 0.0))
            # the train-inference gap a framework that recomputes the old log-probs reports (verl's
            # rollout_probs_diff, TRL's vLLM mismatch stats): the trainer's pass before this batch's first update
            # against the engine's log-probs. The step's own mismatch stats compare the engine with itself (the old
            # log-probs are the engine's), so the guard gets these instead.
            stats.update(gap_stats)
            outcome = "step" if guard is None else guarded_update(guard, step, stats, actuator, tally)
            step += 1
            if outcome == "halt":
                halted = True
                break
            if outcome == "rollback" and st.name == "stale":
                history.clear()
            if guard is None:
                if not _finite_stats(stats):
                    outcome = "nonfinite"
                else:
                    optimizer.step()
            if outcome == "nonfinite" or not _finite(model):
                nonfinite = True
                break
        curves["entropy"].append(statistics.fmean(entropy))
        curves["clip"].append(statistics.fmean(clip))
        if halted or nonfinite:
            break
    verdict = collapse_verdict(
        curves["reward"],
        curves["entropy"],
        nonfinite=nonfinite,
        halted=halted,
        window=config.window,
        min_peak=config.min_peak,
        drop=config.drop,
        entropy_drop=config.entropy_drop,
        solved=config.solved,
    )
    return RunResult(
        config=config,
        rewards=curves["reward"],
        entropies=curves["entropy"],
        lengths=curves["length"],
        clip_fracs=curves["clip"],
        logp_gaps=curves["gap"],
        routed_differently=curves["routed"],
        verdict=verdict,
        halted=halted,
        nonfinite=nonfinite,
        interventions=tally.counts(),
        wall_s=time.perf_counter() - start,
    )


def result_to_json(result: RunResult) -> dict[str, Any]:
    """The run with its curves, for ``runs.jsonl`` (:func:`result_from_json` reads it back)."""
    data = dataclasses.asdict(result)
    return data


def result_from_json(data: dict[str, Any]) -> RunResult:
    """Inverse of :func:`result_to_json`."""
    config = dict(data["config"])
    config["stressor"] = Stressor(**config["stressor"])
    rest = {k: v for k, v in data.items() if k not in ("config", "verdict")}
    return RunResult(config=RunConfig(**config), verdict=CollapseVerdict(**data["verdict"]), **rest)
