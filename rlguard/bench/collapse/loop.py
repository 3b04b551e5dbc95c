"""One run: the tiny GRPO loop on CPU, the guard acting through the plain-torch actuator
(:class:`~rlguard.guards.actuator.TorchActuator`, :func:`~rlguard.guards.actuator.apply_decision`).

See :mod:`rlguard.bench.collapse` for the design, the stressors and the collapse definition.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from rlguard.bench.collapse.spec import RunConfig, RunResult, Stressor, numerics
from rlguard.bench.collapse.verdict import collapse_verdict
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


def policy_gradient_step(
    actuator: TorchActuator,
    optimizer: torch.optim.Optimizer,
    batch: PolicyBatch,
    *,
    max_grad_norm: float,
    lr: float,
    rollouts: Any,
) -> tuple[dict[str, float], Tensor]:
    """The objective in use on ``batch``, its gradient (clipped to ``max_grad_norm``) and the step's reduced stats;
    the optimizer step itself is the guard's to allow. ``rollouts`` carries ``rewards``, ``group_ids`` and ``mask``.
    Shared by both collapse benchmarks' loops."""
    out = actuator.objective_in_use(batch)
    optimizer.zero_grad()
    out.loss.backward()  # type: ignore[no-untyped-call]
    grad_norm = torch.nn.utils.clip_grad_norm_(actuator.model.parameters(), max_grad_norm)
    stats = collect_step_stats(
        batch=batch,
        output=out,
        grad_norm=grad_norm,
        lr=lr,
        rewards=rollouts.rewards,
        group_ids=rollouts.group_ids,
        lengths=rollouts.mask.sum(-1),
    ).reduce()
    return stats, grad_norm


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
            stats, grad_norm = policy_gradient_step(
                actuator, optimizer, batch, max_grad_norm=config.max_grad_norm, lr=lr, rollouts=sub
            )
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
                controls = decision.controls
                counts["lr_backoffs"] += controls.lr_scale < last_lr_scale
                clip = (controls.clip_scale, controls.clip_high_scale, controls.clip_low, controls.clip_high)
                counts["clip_changes"] += clip != last_clip
                last_lr_scale, last_clip = controls.lr_scale, clip
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
        numerics=numerics(),
    )
