"""One run of any task: the warm start (cached), then a compact GRPO-family loop in plain torch, the guard acting
through the plain-torch actuator (:class:`~rlguard.guards.actuation.torch_actuator.TorchActuator`,
:func:`~rlguard.guards.actuation.apply_decision`), judged for collapse.

The task supplies the model, the warm start, the engine under its stressor, the sampler and the trainer's forward
(the hooks of :class:`~rlguard.bench.collapse.spec.BaseRunConfig`); everything else is here, once.
"""

from __future__ import annotations

import copy
import hashlib
import math
import pickle
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlguard.bench.collapse.spec import BaseRunConfig, RolloutBatch, RunResult, TrainerPass, draw_age, numerics
from rlguard.bench.collapse.verdict import collapse_verdict
from rlguard.core_losses import PolicyBatch, get_objective, group_advantages
from rlguard.core_losses.rollout import mismatch_metrics
from rlguard.guards import Guard, GuardConfig, collect_step_stats
from rlguard.guards.actuation import TorchActuator, bind_guard
from rlguard.guards.interventions.trust_region import measures_update
from rlguard.guards.stats.collect import StepStats
from rlguard.guards.stats.staleness import add_staleness_stats

# -- warm start -----------------------------------------------------------------------------------------------------
_WARM_STARTS: dict[tuple[Any, ...], dict[str, Tensor]] = {}
WARM_START_CACHE: list[Path] = []  # a folder here makes warm starts persist across processes (set by the grid)


def _load_warm_start(path: Path) -> dict[str, Tensor]:
    """A cached state dict; tensors only (``weights_only``: a cache file cannot run code when it is read)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        raise ValueError(
            f"warm-start cache {path} is not a state dict of tensors ({type(err).__name__}: {err}); delete it and "
            "the run trains the warm start again."
        ) from err
    if not (isinstance(state, dict) and all(isinstance(v, Tensor) for v in state.values())):
        raise ValueError(f"warm-start cache {path} holds {type(state).__name__}, not a state dict; delete it.")
    return state


def warm_started_model(config: BaseRunConfig) -> nn.Module:
    """The run's model after its warm start; identical for every cell of a seed, so trained once per process
    (and once per ``WARM_START_CACHE`` folder)."""
    model = config.make_model()
    task_key = config.warm_start_key()
    key = (config.task, *task_key)
    path = None
    if WARM_START_CACHE:
        name = f"warm_{config.seed}_{hashlib.sha1(repr(task_key).encode()).hexdigest()[:12]}.pt"
        path = WARM_START_CACHE[0] / name
        if key not in _WARM_STARTS and path.is_file():
            _WARM_STARTS[key] = _load_warm_start(path)
    if key not in _WARM_STARTS:
        config.warm_start(model)
        _WARM_STARTS[key] = copy.deepcopy(model.state_dict())
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(_WARM_STARTS[key], path)
    model.load_state_dict(_WARM_STARTS[key])
    return model


# -- the guard ------------------------------------------------------------------------------------------------------
@dataclass
class GuardTally:
    """What the guard did in a run: outcomes other than ``step``, LR back-offs, and changes of the objective in
    use (its clip range, ``beta`` or entropy coefficient)."""

    skips: int = 0
    rollbacks: int = 0
    lr_backoffs: int = 0
    clip_changes: int = 0
    last_lr_scale: float = 1.0
    #: the asynchronous pipeline's staleness bound the guard set (``Controls.max_staleness``/``stale_drop_age``,
    #: the stricter of the two: this loop's pipeline drops what its bound refuses); None: as configured
    staleness_bound: int | None = None

    def counts(self) -> dict[str, int]:
        """The ``interventions`` of :class:`~rlguard.bench.collapse.spec.RunResult`."""
        return {k: getattr(self, k) for k in ("skips", "rollbacks", "lr_backoffs", "clip_changes")}


def _finite_stats(stats: dict[str, float]) -> bool:
    return math.isfinite(stats.get("loss", 0.0)) and math.isfinite(stats.get("grad_norm", 0.0))


def _finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


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
    outcome = guard.apply(decision, actuator).outcome
    lr_scale = decision.controls.lr_scale
    tally.skips += outcome == "skip"
    tally.rollbacks += outcome == "rollback"
    tally.lr_backoffs += lr_scale < tally.last_lr_scale
    tally.clip_changes += actuator.objective_in_use is not current
    tally.last_lr_scale = lr_scale
    bounds = [b for b in (decision.controls.max_staleness, decision.controls.stale_drop_age) if b is not None]
    tally.staleness_bound = int(min(bounds)) if bounds else None
    return outcome


#: what this loop's asynchronous pipeline carries out (the ``async<A>`` stressors): the guard's staleness bound
ASYNC_CAPABILITIES = frozenset({"staleness_bound", "drop_stale"})


class PipelineActuator(TorchActuator):
    """:class:`TorchActuator` of a loop whose engine is an asynchronous pipeline: it also lowers the pipeline's
    staleness bound and drops over-age batches (the loop reads the bound from :class:`GuardTally`)."""

    @property
    def capabilities(self) -> frozenset[str]:
        return super().capabilities | ASYNC_CAPABILITIES


def staleness_step_stats(age: int, bound: int, trainer: TrainerPass, rollouts: RolloutBatch) -> dict[str, float]:
    """The staleness stats of a batch sampled by the policy of ``age`` versions ago under ``bound``
    (:func:`~rlguard.guards.stats.staleness.add_staleness_stats`; every sample of the batch has that age)."""
    st = StepStats()
    ages = torch.full((rollouts.mask.shape[0],), float(age))  # (B,)
    add_staleness_stats(st, ages, trainer.logprobs, rollouts.engine_logprobs, rollouts.mask)
    st.add("staleness_bound", float(bound))
    return st.reduce()


def policy_gradient_step(
    actuator: TorchActuator,
    optimizer: torch.optim.Optimizer,
    batch: PolicyBatch,
    *,
    max_grad_norm: float,
    lr: float,
    rollouts: RolloutBatch,
) -> dict[str, float]:
    """The objective in use on ``batch``, its gradient (clipped to ``max_grad_norm``) and the step's reduced stats;
    the optimizer step itself is the guard's to allow."""
    out = actuator.objective_in_use(batch)
    optimizer.zero_grad()
    out.loss.backward()  # type: ignore[no-untyped-call]
    grad_norm = torch.nn.utils.clip_grad_norm_(actuator.model.parameters(), max_grad_norm)
    return collect_step_stats(
        batch=batch,
        output=out,
        grad_norm=grad_norm,
        lr=lr,
        rewards=rollouts.rewards,
        group_ids=rollouts.group_ids,
        lengths=rollouts.mask.sum(-1),
    ).reduce()


# -- trainer vs engine ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MismatchStats:
    """Trainer vs engine on the completion tokens of a batch.

    Attributes:
        logp_gap_abs_mean: mean ``|log pi_trainer - log pi_engine|`` per token.
        routed_differently: share of tokens for which some layer's chosen expert set differs (0 for dense).
    """

    logp_gap_abs_mean: float
    routed_differently: float


def mismatch_stats(trainer: TrainerPass, rollouts: RolloutBatch) -> MismatchStats:
    """Compare the trainer's pass with what the engine reported, over ``rollouts.mask``."""
    mask = rollouts.mask > 0  # (B, T)
    tokens = max(int(mask.sum()), 1)
    gap = (trainer.logprobs.detach() - rollouts.engine_logprobs).abs()  # (B, T)
    routed = 0.0
    if trainer.routing is not None and rollouts.engine_routing is not None:
        differs = (trainer.routing != rollouts.engine_routing).any(-1).any(-1)  # (B, T)
        routed = float((differs & mask).sum()) / tokens
    return MismatchStats(float(gap[mask].sum()) / tokens, routed)


def _engine_gap(trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """:func:`~rlguard.core_losses.rollout.mismatch_metrics` of the trainer against the engine, as floats."""
    return {k: float(v) for k, v in mismatch_metrics(trainer_logprobs, engine_logprobs, mask).items()}


# -- one run --------------------------------------------------------------------------------------------------------
def run_one(config: BaseRunConfig, on_batch: Callable[[int, PolicyBatch], None] | None = None) -> RunResult:
    """Train one run and judge it; ``on_batch(iteration, batch)`` sees every minibatch's :class:`PolicyBatch`
    before its loss (for tests).

    Per rollout batch: the task's engine samples (:meth:`~BaseRunConfig.engine`, :meth:`~BaseRunConfig.sample`),
    group advantages, then ``minibatches`` optimizer steps on slices of the batch, so every slice after the first
    is off-policy by one step more. pi_old is the engine's log-probs, or (``old_logprobs="trainer"``) the
    trainer's own of each slice before the batch's first update, the engine's then passed as
    ``rollout_logprobs``.
    """
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    st = config.stressor
    model = warm_started_model(config)
    lr = config.lr * st.lr_factor
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    objective = get_objective(config.objective)
    guard = None if config.guard == "off" else Guard(GuardConfig.preset(config.guard))
    # the guard's decisions act through it; it measures each update's relative size for the trust region
    actuator = (TorchActuator if st.max_age is None else PipelineActuator)(
        model,
        optimizer,
        objective=objective,
        measure_update=measures_update(guard),
        rollout_correction=config.old_logprobs == "trainer",  # the engine's log-probs are rollout_logprobs then
    )
    if guard is not None:
        bind_guard(guard, actuator, where=f"the collapse benchmark's loop ({config.task} task)")
    tally = GuardTally()
    gen = torch.Generator().manual_seed(config.seed)
    history: deque[dict[str, Tensor]] = deque(maxlen=st.history_length)
    curves: dict[str, list[float]] = {k: [] for k in ("reward", "entropy", "length", "clip", "gap", "routed", "age")}
    step_clip: list[float] = []
    halted = nonfinite = False
    step = 0
    per_mb = config.num_prompts // config.minibatches * config.group_size
    slices = [torch.arange(mb * per_mb, (mb + 1) * per_mb) for mb in range(config.minibatches)]
    for it in range(config.iterations):
        age = bound = 0
        if st.max_age is not None:  # an asynchronous pipeline: the batch's age is drawn under the bound in force
            bound = st.max_age if tally.staleness_bound is None else min(st.max_age, tally.staleness_bound)
            age = draw_age(gen, bound)
        engine = config.engine(model, gen, history, age)
        age = min(age, len(history) - 1) if st.max_age is not None else 0  # a younger policy early in a run
        rollouts = config.sample(engine, it)
        exact_engine = engine is model
        advantages = group_advantages(rollouts.rewards, rollouts.group_ids).advantages  # (B,)
        curves["reward"].append(float(rollouts.rewards.mean()))
        curves["length"].append(float(rollouts.mask.sum(-1).mean()))
        trainer_old = None
        if config.old_logprobs == "trainer":  # pi_old: the trainer's model before this batch's first update
            with torch.no_grad():
                trainer_old = [config.trainer_pass(model, rollouts.select(idx)).logprobs for idx in slices]
        entropy, clip = [], []
        for mb, idx in enumerate(slices):
            sub = rollouts.select(idx)
            tp = config.trainer_pass(model, sub)
            if mb == 0:  # trainer vs engine before any update of this batch
                gap = mismatch_stats(tp, sub)
                curves["gap"].append(gap.logp_gap_abs_mean)
                curves["routed"].append(gap.routed_differently)
                engine_gap = (
                    _engine_gap(tp.logprobs, sub.engine_logprobs, sub.mask)
                    if config.guard_sees_engine_gap and trainer_old is None and not exact_engine
                    else {}
                )
                if st.max_age is not None:
                    curves["age"].append(float(age))
                    engine_gap.update(staleness_step_stats(age, bound, tp, sub))
            if trainer_old is None:
                old, behaviour = sub.engine_logprobs, None if exact_engine else sub.engine_logprobs
            else:
                old, behaviour = trainer_old[mb], sub.engine_logprobs
            batch = PolicyBatch(
                logprobs=tp.logprobs,
                advantages=advantages[idx],
                mask=sub.mask,
                old_logprobs=old,
                rollout_logprobs=behaviour,
                entropies=tp.entropies,
            )
            if on_batch is not None:
                on_batch(it, batch)
            stats = policy_gradient_step(
                actuator, optimizer, batch, max_grad_norm=config.max_grad_norm, lr=lr, rollouts=sub
            )
            entropy.append(stats.get("entropy", math.nan))
            clip.append(stats.get("clip_frac", 0.0))
            # with the engine's pi_old the step's own mismatch stats compare the engine with itself; a framework
            # that recomputes the old log-probs reports the trainer-vs-engine gap instead (verl's
            # rollout_probs_diff, TRL's vLLM mismatch stats): the tasks that model one give the guard that
            stats.update(engine_gap)
            outcome = "step" if guard is None else guarded_update(guard, step, stats, actuator, tally)
            step += 1
            if outcome == "halt":
                halted = True
                break
            if outcome == "rollback":
                history.clear()  # the stale engine's past weights are not the restored run's
            if guard is None:
                if not _finite_stats(stats):
                    outcome = "nonfinite"
                else:
                    optimizer.step()
            if outcome == "nonfinite" or not _finite(model):
                nonfinite = True
                break
        step_clip += clip
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
        warmup=config.warmup,
        min_peak=config.min_peak,
        drop=config.drop,
        entropy_drop=config.entropy_drop,
        solved=config.solved,
    )
    return RunResult(
        config=config,
        rewards=curves["reward"],
        entropies=curves["entropy"],
        verdict=verdict,
        halted=halted,
        nonfinite=nonfinite,
        interventions=tally.counts(),
        lengths=curves["length"],
        clip_fracs=curves["clip"],
        logp_gaps=curves["gap"],
        routed_differently=curves["routed"],
        ages=curves["age"],
        clip_frac_mean=statistics.fmean(step_clip) if step_clip else 0.0,
        wall_s=time.perf_counter() - start,
        numerics=numerics(),
    )
