"""Collapse benchmark: how often GRPO-family training collapses under known stressors, with and without the guard.

    python benchmarks/collapse/run.py [--quick] [--workers 2] [--seeds 8] [--out benchmarks/collapse/results]

Each run trains the tiny GRU of :mod:`rlguard.tasks.tiny` on single-digit addition with a compact GRPO loop
(pure torch, one thread): sample ``group_size`` [8] completions for each of ``num_prompts`` [8] prompts, score
them, compute group advantages (:func:`~rlguard.core_losses.group_advantages`), then take ``minibatches`` [2]
optimizer steps on slices of the batch with the real objective (:func:`~rlguard.core_losses.get_objective`, the
paper's defaults); the old log-probs are those of the policy that sampled, so the second minibatch is off-policy
by one step, as with TRL's ``steps_per_generation`` or verl's mini-batches (without it ratios are 1 and no
objective clips). With ``guard="default"`` every optimizer step's stats
(:func:`~rlguard.guards.collect_step_stats`) go to ``Guard(GuardConfig.preset("default"))`` and its decision is
carried out by :func:`~rlguard.guards.actuator.apply_decision` on the plain-torch
:class:`~rlguard.guards.actuator.TorchActuator`, the same executor as the adapters'.

Warm start: before RL, ``warm_start_steps`` [100] supervised steps on correct answers of prompts from a separate
seed stream give the policy the answer format and some arithmetic, as RL fine-tuning starts from an SFT model;
unstressed runs then go from a reward of about 0.4 to 0.45-0.7 in the 100 rollout batches.

Stressors (each a knob of :class:`Stressor`, defaults in brackets):

- ``none``: no perturbation.
- ``mismatch``: training-inference mismatch. Completions are sampled from a copy of the policy whose weights
  carry Gaussian noise of ``mismatch_noise`` [0.3] times each tensor's RMS, drawn afresh per rollout, and the
  engine's log-probs are that copy's, computed from bfloat16 logits (mean |log-prob gap| about 0.15 on the
  warm-started model). The objective's old log-probs are the engine's (no recomputation by the trainer), so
  ratios compare the trainer with the engine.
- ``high_lr``: the learning rate times ``lr_multiplier`` [5].
- ``stale``: every batch is sampled by the policy of ``stale_steps`` [8] rollout batches ago (asynchronous RL);
  old log-probs are that stale policy's, the ratio is against the current one.
- ``moe``: the model is :class:`~rlguard.tasks.moe.TinyMoELM` (top-1 routing over 4 experts) and the rollout
  engine's router carries Gaussian noise of ``router_noise`` [1.0] times the router's RMS, drawn afresh per
  rollout, so that the experts chosen at rollout differ from those the trainer recomputes (about 16 % of tokens
  on the warm-started model); routing also shifts between the two minibatch updates of a batch, as in the GSPO
  paper's MoE discussion.

Collapse (fixed before the recorded grid; :func:`collapse_verdict`). ``r_t`` is the mean reward of rollout batch
``t`` (``r_0`` is the warm-started policy's), ``m_t`` its trailing mean over ``window`` [10] batches (fewer at
the start), ``e_t`` likewise for the mean token entropy. A run has collapsed when any of:

1. non-finite: the loss, the gradient norm or a weight became NaN/Inf (the run stops there);
2. halted: the guard halted the run (it did not finish training, so it counts as a failure);
3. reward collapse: the running peak ``P_t = max(m_s, warmup <= s <= t)`` (``warmup`` [0]: the peak includes
   the warm-started level) reached at least ``min_peak`` [0.3] and from some step ``t0`` to the end
   ``m_t < drop * P_t`` (``drop`` [0.5]) for at least ``window`` steps;
4. entropy collapse: from some ``t0`` to the end ``e_t < entropy_drop * e_start`` (``entropy_drop`` [0.1],
   ``e_start`` the mean entropy of the first ``window`` batches) for at least ``window`` steps, while the final
   ``m_t`` is below ``solved`` [0.95] (a collapsed entropy with every answer right is convergence, not collapse).

Steps to collapse is ``t0``, the first batch of the final collapsed stretch (the stop step for 1 and 2).
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import json
import math
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from rlguard.core_losses import PolicyBatch, get_objective, group_advantages
from rlguard.guards import Guard, GuardConfig, collect_step_stats
from rlguard.guards.actuator import TorchActuator, apply_decision, bind_guard
from rlguard.guards.trust_region import measures_update
from rlguard.tasks.moe import make_tiny_moe_model
from rlguard.tasks.tiny import (
    AdditionTask,
    CharTokenizer,
    Rollouts,
    TinyLM,
    make_tiny_model,
    sample_rollouts,
    sequence_logprobs,
)

OBJECTIVES: tuple[str, ...] = ("grpo", "dapo", "gspo")
GUARDS: tuple[str, ...] = ("off", "default", "stable")
STRESSORS: tuple[str, ...] = ("none", "mismatch", "high_lr", "stale", "moe")
GuardName = Literal["off", "default", "stable"]


@dataclass(frozen=True)
class Stressor:
    """One documented cause of collapse and its strength (see the module docstring).

    Attributes:
        name: ``none``, ``mismatch``, ``high_lr``, ``stale`` or ``moe``.
        mismatch_noise: rollout-engine weight noise, times each tensor's RMS (``mismatch``).
        mismatch_bf16: the engine computes its log-probs from bfloat16 logits (``mismatch``).
        lr_multiplier: learning-rate factor (``high_lr``).
        stale_steps: age in rollout batches of the policy that samples (``stale``).
        router_noise: rollout-engine router weight noise, times the router's RMS (``moe``).
    """

    name: str = "none"
    mismatch_noise: float = 0.3
    mismatch_bf16: bool = True
    lr_multiplier: float = 5.0
    stale_steps: int = 8
    router_noise: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in STRESSORS:
            raise ValueError(f"stressor must be one of {list(STRESSORS)}; got {self.name!r}.")
        for knob in ("mismatch_noise", "router_noise"):
            if not getattr(self, knob) >= 0:
                raise ValueError(f"{knob} must be >= 0; got {getattr(self, knob)!r}.")
        if not self.lr_multiplier > 0:
            raise ValueError(f"lr_multiplier must be > 0; got {self.lr_multiplier!r}.")
        if self.stale_steps < 0:
            raise ValueError(f"stale_steps must be >= 0 (0 is on-policy); got {self.stale_steps!r}.")


@dataclass(frozen=True)
class RunConfig:
    """One training run of the grid.

    Attributes:
        objective: objective name for :func:`~rlguard.core_losses.get_objective` (its paper's defaults).
        guard: ``off``, or the preset of :class:`~rlguard.guards.GuardConfig` that acts (``default``, ``stable``).
        stressor: the perturbation.
        seed: seeds the model, the warm start, the prompts and the sampling.
        iterations: rollout batches.
        num_prompts, group_size: prompts per batch and completions per prompt.
        minibatches: optimizer steps per rollout batch (each on ``num_prompts / minibatches`` prompts).
        lr: Adam learning rate (before the stressor's multiplier).
        max_grad_norm: gradient clipping, as TRL's default.
        hidden: model width.
        warm_start_steps: supervised steps before RL (0: none).
        window, warmup, min_peak, drop, entropy_drop, solved: the collapse definition's constants.
    """

    objective: str = "grpo"
    guard: GuardName = "off"
    stressor: Stressor = field(default_factory=Stressor)
    seed: int = 0
    iterations: int = 100
    num_prompts: int = 8
    group_size: int = 8
    minibatches: int = 2
    lr: float = 7e-3
    max_grad_norm: float = 1.0
    hidden: int = 32
    warm_start_steps: int = 100
    warm_start_lr: float = 1e-2
    window: int = 10
    warmup: int = 0
    min_peak: float = 0.3
    drop: float = 0.5
    entropy_drop: float = 0.1
    solved: float = 0.95

    def __post_init__(self) -> None:
        get_objective(self.objective)  # unknown name -> ValueError listing the names
        if self.guard not in GUARDS:
            raise ValueError(f"guard must be one of {list(GUARDS)}; got {self.guard!r}.")
        if self.num_prompts % self.minibatches:
            raise ValueError(f"num_prompts ({self.num_prompts}) must be divisible by minibatches ({self.minibatches}).")
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1; got {self.iterations}.")


@dataclass(frozen=True)
class CollapseVerdict:
    """Outcome of :func:`collapse_verdict`: ``collapsed``, the first step of the final collapsed stretch
    (``None`` if healthy) and the ``reason`` (``nonfinite``, ``halted``, ``reward``, ``entropy`` or ``""``)."""

    collapsed: bool
    step: int | None = None
    reason: str = ""


@dataclass
class RunResult:
    """One run's outcome; :meth:`row` is its CSV row. Curves are per rollout batch."""

    config: RunConfig
    rewards: list[float]
    entropies: list[float]
    verdict: CollapseVerdict
    skips: int = 0
    rollbacks: int = 0
    lr_backoffs: int = 0
    clip_changes: int = 0
    halted: bool = False
    nonfinite: bool = False
    clip_frac_mean: float = 0.0
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The run with its curves, for ``runs.jsonl`` (:meth:`from_json` reads it back)."""
        data = {k: getattr(self, k) for k in ("rewards", "entropies", "skips", "rollbacks", "lr_backoffs")}
        data |= {k: getattr(self, k) for k in ("clip_changes", "halted", "nonfinite", "clip_frac_mean", "wall_s")}
        config = dataclasses.asdict(self.config)
        return {"config": config, "verdict": dataclasses.asdict(self.verdict), **data}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        """Inverse of :meth:`to_json`."""
        config = dict(data["config"])
        config["stressor"] = Stressor(**config["stressor"])
        rest = {k: v for k, v in data.items() if k not in ("config", "verdict")}
        return cls(config=RunConfig(**config), verdict=CollapseVerdict(**data["verdict"]), **rest)

    def row(self) -> dict[str, Any]:
        """The CSV row (one per run)."""
        final = _trailing_mean(self.rewards, self.config.window)
        return {
            "objective": self.config.objective,
            "guard": self.config.guard,
            "stressor": self.config.stressor.name,
            "seed": self.config.seed,
            "collapsed": int(self.verdict.collapsed),
            "collapse_reason": self.verdict.reason,
            "collapse_step": "" if self.verdict.step is None else self.verdict.step,
            "final_reward": round(final[-1], 4) if final else math.nan,
            "peak_reward": round(max(final), 4) if final else math.nan,
            "start_reward": round(final[min(len(final), self.config.window) - 1], 4) if final else math.nan,
            "iterations_run": len(self.rewards),
            "skips": self.skips,
            "rollbacks": self.rollbacks,
            "lr_backoffs": self.lr_backoffs,
            "clip_changes": self.clip_changes,
            "halts": int(self.halted),
            "nonfinite": int(self.nonfinite),
            "clip_frac_mean": round(self.clip_frac_mean, 5),
            "wall_s": round(self.wall_s, 2),
        }


def _trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """``m_t = mean(values[max(0, t - window + 1) : t + 1])``."""
    out, total = [], 0.0
    for t, v in enumerate(values):
        total += v
        if t >= window:
            total -= values[t - window]
        out.append(total / min(t + 1, window))
    return out


def _final_stretch_start(below: Sequence[bool]) -> int | None:
    """First index of the run of ``True`` that reaches the end, or None if the last value is ``False``."""
    if not below or not below[-1]:
        return None
    t0 = len(below) - 1
    while t0 > 0 and below[t0 - 1]:
        t0 -= 1
    return t0


def collapse_verdict(
    rewards: Sequence[float],
    entropies: Sequence[float],
    *,
    nonfinite: bool = False,
    halted: bool = False,
    window: int = 10,
    warmup: int = 0,
    min_peak: float = 0.3,
    drop: float = 0.5,
    entropy_drop: float = 0.1,
    solved: float = 0.95,
) -> CollapseVerdict:
    """Apply the collapse definition of the module docstring to one run's curves (one value per rollout batch).

    ``rewards`` and ``entropies`` must have equal lengths; for a stopped run (``nonfinite`` or ``halted``) they
    end at the stop, which is the collapse step.
    """
    if len(rewards) != len(entropies):
        raise ValueError(f"rewards and entropies must have equal lengths; got {len(rewards)} and {len(entropies)}.")
    if window < 1 or warmup < 0:
        raise ValueError(f"window must be >= 1 and warmup >= 0; got window={window}, warmup={warmup}.")
    if not (0 < drop < 1 and 0 < entropy_drop < 1):
        raise ValueError(f"drop and entropy_drop must lie in (0, 1); got {drop} and {entropy_drop}.")
    if nonfinite or halted:
        return CollapseVerdict(True, max(len(rewards) - 1, 0), "nonfinite" if nonfinite else "halted")
    bad = [t for t, (r, e) in enumerate(zip(rewards, entropies, strict=True)) if not math.isfinite(r + e)]
    if bad:
        return CollapseVerdict(True, bad[0], "nonfinite")
    m = _trailing_mean(rewards, window)
    peak, below = -math.inf, []
    for t, value in enumerate(m):
        if t >= warmup:
            peak = max(peak, value)
        below.append(peak >= min_peak and value < drop * peak)
    t0 = _final_stretch_start(below)
    if t0 is not None and len(m) - t0 >= window:
        return CollapseVerdict(True, t0, "reward")
    e = _trailing_mean(entropies, window)
    if e and m[-1] < solved:
        e_start = statistics.fmean(entropies[:window])
        t0 = _final_stretch_start([x < entropy_drop * e_start for x in e])
        if t0 is not None and len(e) - t0 >= window:
            return CollapseVerdict(True, t0, "entropy")
    return CollapseVerdict(False)


# -- stressors ----------------------------------------------------------------------------------------------------
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


def _subset(rollouts: Rollouts, idx: Tensor) -> Rollouts:
    """The completions ``idx`` of a batch."""
    return dataclasses.replace(
        rollouts,
        input_ids=rollouts.input_ids[idx],
        mask=rollouts.mask[idx],
        rewards=rollouts.rewards[idx],
        group_ids=rollouts.group_ids[idx],
        completions=[rollouts.completions[i] for i in idx.tolist()],
    )


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


# -- one run ------------------------------------------------------------------------------------------------------
def _finite_step(stats: dict[str, float], grad_norm: Tensor) -> bool:
    return math.isfinite(stats.get("loss", 0.0)) and math.isfinite(float(grad_norm))


def _finite_model(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


_WARM_STARTS: dict[tuple[Any, ...], dict[str, Tensor]] = {}


def effective_lr(config: RunConfig) -> float:
    """The Adam learning rate of a run: ``lr``, times ``lr_multiplier`` under ``high_lr``."""
    return config.lr * (config.stressor.lr_multiplier if config.stressor.name == "high_lr" else 1.0)


def behaviour_policy(
    model: TinyLM, stressor: Stressor, gen: torch.Generator, history: deque[dict[str, Tensor]]
) -> tuple[TinyLM, torch.dtype | None]:
    """The policy that samples the next rollout batch and the dtype of its engine's logits (None: float32).

    ``history`` (``maxlen = stale_steps + 1``) receives the current weights under ``stale``; its oldest entry
    is the policy of ``stale_steps`` calls ago (fewer at the start of a run, or after ``history.clear()``).
    """
    if stressor.name == "mismatch":
        return perturbed_copy(model, stressor.mismatch_noise, gen), torch.bfloat16 if stressor.mismatch_bf16 else None
    if stressor.name == "moe":
        return perturbed_copy(model, stressor.router_noise, gen, only="router"), None
    if stressor.name == "stale":
        history.append(copy.deepcopy(model.state_dict()))
        behaviour = copy.deepcopy(model)
        behaviour.load_state_dict(history[0])
        return behaviour, None
    return model, None


def run_one(config: RunConfig, on_batch: Callable[[int, PolicyBatch], None] | None = None) -> RunResult:
    """Train one run of the grid and judge it (see the module docstring).

    ``on_batch(iteration, batch)`` sees every minibatch's :class:`PolicyBatch` before the loss (for tests).
    """
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    st = config.stressor
    moe = st.name == "moe"
    model: TinyLM = (
        make_tiny_moe_model(config.seed, config.hidden) if moe else make_tiny_model(config.seed, config.hidden)
    )
    key = (config.seed, moe, config.hidden, config.warm_start_steps, config.warm_start_lr)
    if key not in _WARM_STARTS:  # identical for every cell of a seed: train once per worker process
        warm_start(model, steps=config.warm_start_steps, seed=config.seed, lr=config.warm_start_lr)
        _WARM_STARTS[key] = copy.deepcopy(model.state_dict())
    model.load_state_dict(_WARM_STARTS[key])
    lr = effective_lr(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    objective = get_objective(config.objective)
    guard = None if config.guard == "off" else Guard(GuardConfig.preset(config.guard))
    # the guard's decisions act through it; it measures each update's relative size for the trust region
    actuator = TorchActuator(model, optimizer, objective=objective, measure_update=measures_update(guard))
    if guard is not None:
        bind_guard(guard, actuator, where="the collapse benchmark's loop")
    counts = {"skip": 0, "rollback": 0, "lr_backoffs": 0, "clip_changes": 0}
    last_lr_scale = 1.0
    last_clip: tuple[float | None, ...] = (1.0, 1.0, None, None)
    gen = torch.Generator().manual_seed(config.seed)
    history: deque[dict[str, Tensor]] = deque(maxlen=st.stale_steps + 1)
    rewards: list[float] = []
    entropies: list[float] = []
    clip_fracs: list[float] = []
    halted = nonfinite = False
    step = 0
    per_mb = config.num_prompts // config.minibatches * config.group_size
    for it in range(config.iterations):
        behaviour, engine_dtype = behaviour_policy(model, st, gen, history)
        rollouts = sample_rollouts(
            behaviour,
            num_prompts=config.num_prompts,
            group_size=config.group_size,
            max_new_tokens=3,
            seed=config.seed * 1_000_003 + it,
        )
        with torch.no_grad():
            old_logprobs, _ = sequence_logprobs(behaviour, rollouts, logits_dtype=engine_dtype)
        advantages = group_advantages(rollouts.rewards, rollouts.group_ids).advantages
        rewards.append(float(rollouts.rewards.mean()))
        batch_entropy = []
        for mb in range(config.minibatches):
            idx = torch.arange(mb * per_mb, (mb + 1) * per_mb)
            sub = _subset(rollouts, idx)
            logprobs, ent = sequence_logprobs(model, sub)
            batch = PolicyBatch(
                logprobs=logprobs,
                advantages=advantages[idx],
                mask=sub.mask,
                old_logprobs=old_logprobs[idx],
                rollout_logprobs=old_logprobs[idx] if behaviour is not model else None,
                entropies=ent,
            )
            if on_batch is not None:
                on_batch(it, batch)
            out = actuator.objective_in_use(batch)
            optimizer.zero_grad()
            out.loss.backward()  # type: ignore[no-untyped-call]
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            stats = collect_step_stats(
                batch=batch,
                output=out,
                grad_norm=grad_norm,
                lr=lr,
                rewards=sub.rewards,
                group_ids=sub.group_ids,
                lengths=sub.mask.sum(-1),
            ).reduce()
            batch_entropy.append(stats.get("entropy", math.nan))
            clip_fracs.append(stats.get("clip_frac", 0.0))
            outcome = "step"
            if guard is not None:
                update_ratio = actuator.take_update_ratio()  # the previous applied update's, if any
                if update_ratio is not None:
                    stats["update_ratio"] = update_ratio
                decision = guard.observe(step, stats)
                if decision.outcome == "step" and not _finite_step(stats, grad_norm):
                    nonfinite = True  # the guard let a non-finite step through: the run has failed
                    break
                outcome = apply_decision(decision, actuator).outcome
                counts[outcome] = counts.get(outcome, 0) + 1
                counts["lr_backoffs"] += decision.lr_scale < last_lr_scale
                clip = (decision.clip_scale, decision.clip_high_scale, decision.clip_low, decision.clip_high)
                counts["clip_changes"] += clip != last_clip
                last_lr_scale, last_clip = decision.lr_scale, clip
            step += 1
            if outcome == "halt":
                halted = True
                break
            if outcome == "rollback" and st.name == "stale":
                history.clear()
            if outcome != "step":
                continue
            if guard is None:
                if not _finite_step(stats, grad_norm):
                    nonfinite = True
                    break
                optimizer.step()
            if not _finite_model(model):
                nonfinite = True
                break
        entropies.append(statistics.fmean(batch_entropy))
        if halted or nonfinite:
            break
    verdict = collapse_verdict(
        rewards,
        entropies,
        nonfinite=nonfinite,
        halted=halted,
        window=config.window,
        warmup=config.warmup,
        min_peak=config.min_peak,
        drop=config.drop,
        entropy_drop=config.entropy_drop,
        solved=config.solved,
    )
    return RunResult(
        config=config,
        rewards=rewards,
        entropies=entropies,
        verdict=verdict,
        skips=counts["skip"],
        rollbacks=counts["rollback"],
        lr_backoffs=counts["lr_backoffs"],
        clip_changes=counts["clip_changes"],
        halted=halted,
        nonfinite=nonfinite,
        clip_frac_mean=statistics.fmean(clip_fracs) if clip_fracs else 0.0,
        wall_s=time.perf_counter() - start,
    )


# -- the grid -----------------------------------------------------------------------------------------------------
def build_grid(
    objectives: Iterable[str] = OBJECTIVES,
    guards: Iterable[str] = GUARDS,
    stressors: Iterable[str] = STRESSORS,
    seeds: int = 8,
    **overrides: Any,
) -> list[RunConfig]:
    """Every combination, seeds ``0 .. seeds - 1``; ``overrides`` set other :class:`RunConfig` fields.

    Seed-major order: a run stopped part-way has every cell at the same number of seeds (give ``--resume``).
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1; got {seeds}.")
    return [
        RunConfig(objective=o, guard=g, stressor=Stressor(s), seed=seed, **overrides)  # type: ignore[arg-type]
        for seed in range(seeds)
        for s in stressors
        for o in objectives
        for g in guards
    ]


def _init_worker() -> None:
    torch.set_num_threads(1)


def run_grid(
    configs: Sequence[RunConfig], *, workers: int = 2, on_result: Callable[[RunResult], None] | None = None
) -> list[RunResult]:
    """Run ``configs`` on ``workers`` processes (one torch thread each); results in the order of ``configs``."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1; got {workers}.")
    results: dict[int, RunResult] = {}
    if workers == 1:
        _init_worker()
        for i, cfg in enumerate(configs):
            results[i] = run_one(cfg)
            if on_result is not None:
                on_result(results[i])
    else:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker) as pool:
            futures = {pool.submit(run_one, cfg): i for i, cfg in enumerate(configs)}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if on_result is not None:
                    on_result(results[futures[fut]])
    return [results[i] for i in range(len(configs))]


# -- outputs ------------------------------------------------------------------------------------------------------
CellKey = tuple[str, str, str]  # (stressor, objective, guard)


def _cells(results: Sequence[RunResult]) -> dict[CellKey, list[RunResult]]:
    cells: dict[CellKey, list[RunResult]] = {}
    for r in results:
        cells.setdefault((r.config.stressor.name, r.config.objective, r.config.guard), []).append(r)
    return cells


def summarise(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per (stressor, objective, guard) cell: collapse rate, final reward mean and std over seeds, median
    steps to collapse, mean interventions, mean clip fraction and mean wall time."""
    rows = []
    for (stressor, objective, guard), runs in _cells(results).items():
        final = [float(r.row()["final_reward"]) for r in runs]
        steps = [r.verdict.step for r in runs if r.verdict.step is not None]
        rows.append(
            {
                "stressor": stressor,
                "objective": objective,
                "guard": guard,
                "runs": len(runs),
                "collapsed": sum(r.verdict.collapsed for r in runs),
                "collapse_rate": round(sum(r.verdict.collapsed for r in runs) / len(runs), 3),
                "final_reward_mean": round(statistics.fmean(final), 3),
                "final_reward_std": round(statistics.stdev(final), 3) if len(final) > 1 else 0.0,
                "median_collapse_step": statistics.median(steps) if steps else "",
                "skips_mean": round(statistics.fmean(r.skips for r in runs), 2),
                "rollbacks_mean": round(statistics.fmean(r.rollbacks for r in runs), 2),
                "lr_backoffs_mean": round(statistics.fmean(r.lr_backoffs for r in runs), 2),
                "halts": sum(r.halted for r in runs),
                "clip_frac_mean": round(statistics.fmean(r.clip_frac_mean for r in runs), 4),
                "wall_s_mean": round(statistics.fmean(r.wall_s for r in runs), 2),
            }
        )
    return rows


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _markdown(rows: Sequence[dict[str, Any]]) -> str:
    head = "| stressor | objective | guard | collapsed | final reward | median steps to collapse | skips | rollbacks "
    head += "| lr backoffs | halts | clip frac | wall s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    lines = [
        f"| {r['stressor']} | {r['objective']} | {r['guard']} | {r['collapsed']}/{r['runs']} "
        f"| {r['final_reward_mean']:.3f} ± {r['final_reward_std']:.3f} | {r['median_collapse_step'] or '-'} "
        f"| {r['skips_mean']} | {r['rollbacks_mean']} | {r['lr_backoffs_mean']} | {r['halts']} "
        f"| {r['clip_frac_mean']} | {r['wall_s_mean']} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


_GUARD_COLOUR = {"off": "tab:red", "default": "tab:blue", "stable": "tab:green"}


def plot_curves(results: Sequence[RunResult], folder: Path) -> list[Path]:
    """One PNG per (stressor, objective) cell: reward per rollout batch (trailing mean), each seed a thin line,
    guard off in red, default in blue, stable in green, collapsed runs dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.config.stressor.name, r.config.objective), []).append(r)
    for (stressor, objective), runs in groups.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for r in runs:
            colour = _GUARD_COLOUR.get(r.config.guard, "tab:grey")
            style = "--" if r.verdict.collapsed else "-"
            ax.plot(_trailing_mean(r.rewards, r.config.window), style, color=colour, lw=0.8, alpha=0.7)
        for guard in dict.fromkeys(r.config.guard for r in runs):
            ax.plot([], [], color=_GUARD_COLOUR.get(guard, "tab:grey"), label=f"guard {guard}")
        ax.plot([], [], "--", color="grey", label="collapsed")
        ax.set(title=f"{objective}, stressor {stressor}", xlabel="rollout batch", ylabel="reward (trailing mean)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = folder / f"curves_{stressor}_{objective}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)
    return paths


def write_results(results: Sequence[RunResult], out: Path) -> list[dict[str, Any]]:
    """``runs.csv`` (one row per run), ``summary.csv``, ``summary.md`` and ``plots/*.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "runs.csv", [r.row() for r in results])
    summary = summarise(results)
    _write_csv(out / "summary.csv", summary)
    (out / "summary.md").write_text(_markdown(summary))
    plot_curves(results, out / "plots")
    return summary


def _table(summary: Sequence[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="collapse benchmark (per cell: runs over seeds)")
    for col in (
        "stressor",
        "objective",
        "guard",
        "collapsed",
        "final reward",
        "median step",
        "skips",
        "rollbacks",
        "lr backoffs",
        "halts",
        "clip frac",
        "wall s",
    ):
        table.add_column(col)
    for r in summary:
        table.add_row(
            r["stressor"],
            r["objective"],
            r["guard"],
            f"{r['collapsed']}/{r['runs']}",
            f"{r['final_reward_mean']:.3f} ± {r['final_reward_std']:.3f}",
            str(r["median_collapse_step"] or "-"),
            str(r["skips_mean"]),
            str(r["rollbacks_mean"]),
            str(r["lr_backoffs_mean"]),
            str(r["halts"]),
            str(r["clip_frac_mean"]),
            str(r["wall_s_mean"]),
        )
    return table


# -- command line -------------------------------------------------------------------------------------------------
QUICK_OBJECTIVES, QUICK_STRESSORS, QUICK_ITERATIONS = ("grpo", "gspo"), ("none", "high_lr"), 30


def run_benchmark(
    *,
    quick: bool = False,
    workers: int = 2,
    seeds: int = 8,
    out: str | Path = "benchmarks/collapse/results",
    objectives: Sequence[str] = OBJECTIVES,
    guards: Sequence[str] = GUARDS,
    stressors: Sequence[str] = STRESSORS,
    iterations: int | None = None,
    resume: bool = False,
) -> list[dict[str, Any]]:
    """Run the grid with a rich progress bar, print the table, write the results; returns the summary rows.

    ``quick``: objectives grpo and gspo, stressors none and high_lr, 1 seed, 30 rollout batches (CI smoke test);
    explicit ``objectives``/``stressors``/``iterations`` still override it. Every finished run is appended to
    ``out/runs.jsonl`` at once; ``resume`` keeps the runs already there and runs only the missing ones.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    for name, values, known in (
        ("objectives", objectives, None),
        ("guards", guards, GUARDS),
        ("stressors", stressors, STRESSORS),
    ):
        if not values:
            raise ValueError(f"{name} must name at least one entry; got none.")
        bad = [v for v in values if known is not None and v not in known]
        if bad:
            raise ValueError(f"unknown {name} {bad}; choose from {list(known or ())}.")
    for name, value in (
        ("workers", workers),
        ("seeds", seeds),
        ("iterations", 1 if iterations is None else iterations),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1; got {value}.")
    if quick:
        objectives = QUICK_OBJECTIVES if tuple(objectives) == OBJECTIVES else objectives
        stressors = QUICK_STRESSORS if tuple(stressors) == STRESSORS else stressors
        seeds = 1
        iterations = iterations or QUICK_ITERATIONS
    overrides: dict[str, Any] = {} if iterations is None else {"iterations": iterations}
    configs = build_grid(objectives, guards, stressors, seeds, **overrides)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "runs.jsonl"
    done = {_key(r.config): r for r in _read_log(log)} if resume else {}
    todo = [c for c in configs if _key(c) not in done]
    console = Console(width=160)
    start = time.perf_counter()
    with (
        log.open("a" if resume else "w") as fh,
        Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress,
    ):
        task = progress.add_task("runs", total=len(todo))

        def record(result: RunResult) -> None:
            fh.write(json.dumps(result.to_json()) + "\n")
            fh.flush()
            progress.advance(task)
            if not console.is_terminal:  # a log file: one line per run instead of the bar
                row = result.row()
                print(f"{progress.tasks[0].completed:.0f}/{len(todo)}", *list(row.values())[:8], flush=True)

        for result in run_grid(todo, workers=workers, on_result=record):
            done[_key(result.config)] = result
    results = [done[_key(c)] for c in configs]
    summary = write_results(results, folder)
    console.print(_table(summary))
    console.print(f"{len(todo)} runs on {workers} workers in {time.perf_counter() - start:.0f} s; results in {out}")
    return summary


def _key(config: RunConfig) -> str:
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


def _read_log(path: Path) -> list[RunResult]:
    if not path.is_file():
        return []
    return [RunResult.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def split_names(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]`` (the comma-separated options of the command line)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """``python benchmarks/collapse/run.py [--quick] [--workers 2] [--seeds 8] [--out DIR] ...``; returns the exit
    code (2 on bad input)."""
    args = build_parser().parse_args(argv)
    try:
        run_benchmark(
            quick=args.quick,
            workers=args.workers,
            seeds=args.seeds,
            out=args.out,
            objectives=split_names(args.objectives),
            guards=split_names(args.guards),
            stressors=split_names(args.stressors),
            iterations=args.iterations,
            resume=args.resume,
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(
        prog="rlguard bench collapse", description="Collapse benchmark: collapse rate per objective x guard x stressor."
    )
    parser.add_argument("--quick", action="store_true", help="grpo+gspo, stressors none+high_lr, 1 seed, 30 batches")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (one torch thread each)")
    parser.add_argument("--seeds", type=int, default=8, help="seeds per cell")
    parser.add_argument("--out", default="benchmarks/collapse/results", help="folder for CSVs, summary and plots")
    parser.add_argument("--objectives", default=",".join(OBJECTIVES), help="comma-separated objective names")
    parser.add_argument("--guards", default=",".join(GUARDS), help="comma-separated: off, default, stable")
    parser.add_argument("--stressors", default=",".join(STRESSORS), help=f"comma-separated: {', '.join(STRESSORS)}")
    parser.add_argument("--iterations", type=int, default=None, help="rollout batches per run (default 100)")
    parser.add_argument("--resume", action="store_true", help="keep the finished runs of --out/runs.jsonl")
    return parser
