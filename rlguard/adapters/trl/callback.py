"""The guard in TRL's training loop: :class:`StabilityCallback` feeds each optimizer step's canonical stats to a
:class:`~rlguard.guards.Guard` and applies its :class:`~rlguard.guards.Decision`, identically on every rank.

>>> trainer = GRPOTrainer(..., callbacks=[cb := StabilityCallback(guard="default")])  # doctest: +SKIP
>>> cb.attach(trainer)  # TRL's rewards, lengths, entropy, KL, clip fractions join the stats  # doctest: +SKIP

``GuardedGRPOConfig(guard="default")`` does all of this for ``GuardedGRPOTrainer`` and adds the objective's own
metrics (each micro-batch's, from the same transfer to the host that logs them:
:func:`~rlguard.guards.stats.collect.add_metric_values`) and the clip range.

Each decision is carried out by :func:`~rlguard.guards.actuation.apply_decision` on an actuator
(:mod:`rlguard.adapters.trl.actuators`: ``TrainerActuator`` without DeepSpeed, ``ZeroActuator`` under it, where a
stand-in for accelerate's ``deepspeed_engine_wrapped`` decides before ``engine.step()``). Both paths take one
guarded step (``StabilityCallback._guarded_step``); only the gradient norm, the LR and the actuator differ. What
each part of a decision does in transformers' loop (``on_pre_optimizer_step``) and under DeepSpeed, the checkpoints
and the logged keys: ``docs/guides/trl.md``, "The guard in TRL's training loop".
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(f"rlguard.adapters.trl needs transformers: pip install 'rlguard[trl]' ({err}).") from err

from rlguard.adapters.trl.actuators import TrainerActuator, ZeroActuator
from rlguard.adapters.trl.compat import (
    GuardedEngineWrapper,
    check_logged_metrics,
    install_engine_wrapper,
    logged_metrics,
    remove_engine_wrapper,
    zero_grad_norm,
)
from rlguard.adapters.trl.metrics_file import METRICS_FILE, MetricsFile
from rlguard.guards import STAT_REDUCTIONS, Decision, Guard, GuardConfig, StepStats, collect_step_stats
from rlguard.guards.actuation import Applied, bind_guard
from rlguard.guards.decision import tracker_metrics
from rlguard.guards.events import EVENTS_FILE
from rlguard.guards.guard import make_guard
from rlguard.guards.interventions.trust_region import measures_update
from rlguard.guards.state import GUARD_STATE_FILE, missing_state_message, read_state_file, write_state_file
from rlguard.metrics import TRL_TO_CANONICAL, canonical_stats

__all__ = ["StabilityCallback"]

_ENGINE_SNAPSHOT_DIR = "rlguard_snapshot"

#: TRL metrics written when completions are generated and scored (the rest come from TRL's loss).
_GENERATION_KEYS = (
    "reward",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    # AsyncGRPOTrainer's, logged as its data loader takes each sample from the rollout queue
    "sample/staleness_mean",
    "sample/staleness_max",
    "sample/dropped_stale_total",
)
#: TRL metrics written by TRL's own loss (stock trainer only; GuardedGRPOTrainer gives the objective's).
_TRL_LOSS_KEYS = ("entropy", "kl", "clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean")


_REDUCE: dict[str, Any] = {"mean": lambda v: sum(v) / len(v), "sum": sum, "max": max, "min": min}


class StabilityCallback(TrainerCallback):
    """Records the canonical stats of every optimizer step and, given a ``guard``, acts on its decisions.

    Works on a stock ``trl.GRPOTrainer``; with a guard, call ``cb.attach(trainer)`` first (training refuses to
    start otherwise). TRL averages its metrics over the steps between two logs, so with ``every_step=True`` (the
    default, and always with a guard) the callback asks the trainer to log after every optimizer step (warned about
    once at train start unless ``logging_steps=1``). Records are identical on every process: TRL reduces its
    metrics before logging.

    Args:
        every_step: log after every optimizer step.
        guard: a preset name, a ``GuardConfig`` or a ``Guard``; None only records. See the module for what each
            decision does.
        snapshot_dir: keep rollback snapshots in this folder (one safetensors file per rank) instead of host memory.
        measure_update: report ``update_ratio`` (``||theta_t - theta_(t-1)|| / ||theta_(t-1)||`` of the last applied
            update) in the next step's stats; costs a host copy of the trainable weights (this rank's share under DDP)
            and a bounded chunk on the device (:mod:`rlguard.guards.actuation.update_meter`). Not under DeepSpeed. On by
            itself when the guard runs a ``trust_region`` that reads it (the ``stable`` preset).
        metrics_file: write every logged record to this file in the output folder, for ``rlguard doctor``,
            ``watch`` and ``report`` (:mod:`rlguard.adapters.trl.metrics_file`); None writes none.

    Attributes:
        history: one ``{"step": global_step, <canonical name>: value, ...}`` per logged training step.
        decisions: the guard's decision of every optimizer step.
        observed: the reduced stats the guard judged, one per optimizer step (identical on every rank).
    """

    #: the actuator built for a trainer without DeepSpeed (GuardedAsyncGRPOTrainer's also syncs the rollout side)
    actuator_class: type[TrainerActuator] = TrainerActuator

    def __init__(
        self,
        *,
        every_step: bool = True,
        guard: str | GuardConfig | Guard | None = None,
        snapshot_dir: str | None = None,
        measure_update: bool = False,
        metrics_file: str | None = METRICS_FILE,
    ) -> None:
        self.every_step = every_step
        self.guard: Guard | None = None if guard is None else make_guard(guard)
        self.snapshot_dir = snapshot_dir
        self.measure_update = measure_update
        self.metrics_file = metrics_file
        self._metrics: MetricsFile | None = None
        self.history: list[dict[str, float]] = []
        self.decisions: list[Decision] = []
        self._trainer: Any = None
        self.observed: list[dict[str, float]] = []
        self._max_grad_norm: float | None = None
        self._engine_wrapper: GuardedEngineWrapper | None = None
        self._actuator: TrainerActuator | ZeroActuator | None = None

    @property
    def snapshot_step(self) -> int | None:
        """The step of the last rollback snapshot, or None."""
        return None if self._actuator is None else self._actuator.snapshot_step

    @property
    def last(self) -> dict[str, float] | None:
        """The latest record, or ``None`` before the first."""
        return self.history[-1] if self.history else None

    def attach(self, trainer: Any) -> None:
        """Read this trainer's metrics each step (``GuardedGRPOTrainer`` attaches its callbacks itself)."""
        self._trainer = trainer

    # -- transformers events ---------------------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._warn_forced_logging(args)
        if self._metrics is not None:
            self._metrics.close()
        if self.metrics_file is not None and args.process_index == 0:
            folder = Path(str(args.output_dir))
            self._metrics = MetricsFile(folder / self.metrics_file, resume_step=state.global_step or None)
        if self.guard is None:
            return
        if self._trainer is None:
            raise ValueError(
                "StabilityCallback(guard=...) needs its trainer: the guard judges TRL's rewards, lengths, entropy, "
                "KL and clip fractions of each step and logs rlguard/* to the tracker through it, which a callback "
                "is not given. Call cb.attach(trainer) before trainer.train(), or use GuardedGRPOTrainer with "
                "GuardedGRPOConfig(guard=...), which attaches its callbacks itself."
            )
        deepspeed = bool(getattr(args, "deepspeed", None) or getattr(self._trainer, "is_deepspeed_enabled", False))
        where = type(self._trainer).__name__
        actuator: TrainerActuator | ZeroActuator
        if deepspeed:
            actuator = self._install_engine_wrapper(args)  # raises before anything changes when it cannot act
            where += " under DeepSpeed"
        else:
            model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
            if model is None or optimizer is None:  # transformers' Trainer passes both to every callback
                raise ValueError(f"on_train_begin needs model= and optimizer=; got {model!r} and {optimizer!r}.")
            actuator = self._trainer_actuator(args, model, optimizer)
        bind_guard(self.guard, actuator, where=where)
        check_logged_metrics(self._trainer)
        if state.global_step > 0:
            self._load_guard_state(args, state)
        # the first process writes the events: a fresh run moves an old file aside, a resumed one continues it
        path = self.guard.config.events_path or str(Path(str(args.output_dir)) / EVENTS_FILE)
        self.guard.open_events(path if args.process_index == 0 else None, resume_step=state.global_step or None)
        if not deepspeed:
            # the guard needs the norm before clipping, which the trainer does not pass to callbacks: clip here
            self._max_grad_norm, args.max_grad_norm = args.max_grad_norm, 0.0

    def _warn_forced_logging(self, args: TrainingArguments) -> None:
        """Say once per training run that the callback logs every optimizer step whatever ``logging_steps`` says."""
        every_step = self.every_step or self.guard is not None
        strategy = str(getattr(args.logging_strategy, "value", args.logging_strategy))
        if every_step and (strategy != "steps" or args.logging_steps != 1):
            warnings.warn(
                f"StabilityCallback logs after every optimizer step, overriding logging_strategy={strategy!r}, "
                f"logging_steps={args.logging_steps}: TRL averages its metrics between two logs, and the callback"
                f"{' and its guard' if self.guard is not None else ''} need each step's. Set logging_steps=1 to "
                "silence this"
                + ("." if self.guard is not None else ", or StabilityCallback(every_step=False) to log as configured."),
                UserWarning,
                stacklevel=2,
            )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._max_grad_norm is not None:
            args.max_grad_norm, self._max_grad_norm = self._max_grad_norm, None
        if self._engine_wrapper is not None:
            remove_engine_wrapper(self._trainer, self._engine_wrapper)
            self._engine_wrapper = None

    def on_pre_optimizer_step(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        **kwargs: Any,
    ) -> None:
        if self._engine_wrapper is not None:  # DeepSpeed: decided and applied inside accelerator.backward
            self._stop_if_requested(control)
            return
        if self.guard is None or model is None or optimizer is None:
            return
        params = [p for p in model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self._max_grad_norm or math.inf)  # norm before clipping
        lr = lr_scheduler.get_last_lr()[0] if lr_scheduler is not None else optimizer.param_groups[0]["lr"]
        actuator = self._trainer_actuator(args, model, optimizer)
        self._guarded_step(state.global_step + 1, grad_norm, float(lr), actuator)
        self._stop_if_requested(control)

    def on_optimizer_step(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(self._actuator, TrainerActuator):
            self._actuator.finish_step()  # the LR scale was for this optimizer step only; the update's size

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.every_step or self.guard is not None:
            control.should_log = True
        return control

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs or "train_runtime" in logs:
            return  # the end-of-training summary
        if self._metrics is not None:
            self._metrics.write(state.global_step, logs)
        if any(key.startswith("eval_") for key in logs):
            return  # evaluation records are not optimizer steps
        self.history.append({"step": float(state.global_step), **canonical_stats(logs)})

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        folder = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if self.guard is not None and args.should_save and folder.is_dir():
            write_state_file(folder / GUARD_STATE_FILE, self.guard.state_dict())  # atomically

    # -- the guarded step ------------------------------------------------------------------------------
    def _guarded_step(
        self, step: int, grad_norm: torch.Tensor, lr: float, actuator: TrainerActuator | ZeroActuator
    ) -> None:
        """The guarded step under DDP and DeepSpeed alike: the step's stats (gradient norm before clipping, LR, the
        last update's size where ``actuator`` measures it), the guard's decision, carried out by ``actuator``."""
        stats = collect_step_stats(grad_norm=grad_norm, lr=lr, stats=self._step_stats())
        update_ratio = actuator.take_update_ratio()  # the previous step's update, measured after it
        if update_ratio is not None:
            stats.add("update_ratio", update_ratio)
        decision = self._observe(step, stats)
        assert self.guard is not None  # a guarded step has a guard
        self._log(decision, self.guard.apply(decision, actuator))

    def _observe(self, step: int, stats: StepStats) -> Decision:
        """The guard's decision on this step's stats, reduced over the processes with one ``all_gather``."""
        assert self.guard is not None
        reduced = stats.reduce()
        decision = self.guard.observe(step, reduced)
        self.observed.append({"step": float(step), **reduced})
        self.decisions.append(decision)
        return decision

    def _step_stats(self) -> StepStats:
        """The objective's per-micro-batch stats (GuardedGRPOTrainer) plus the trainer's metrics of this step."""
        trainer = self._trainer
        if trainer is None:
            return StepStats()
        take = getattr(trainer, "rlguard_take_step_stats", None)
        stats: StepStats = take() if take is not None else StepStats()
        # TRL's lists hold this step only (the callback logs every step) and are already reduced over processes,
        # so every rank adds the same values and the mean over ranks keeps them
        keys = _GENERATION_KEYS if take is not None else (*_GENERATION_KEYS, *_TRL_LOSS_KEYS)
        metrics = logged_metrics(trainer)
        for key in keys:
            name = TRL_TO_CANONICAL[key]
            values = [v for v in metrics.get(key, ()) if isinstance(v, float | int) and not math.isnan(v)]
            if values and name in STAT_REDUCTIONS:  # the step's values combined as the metric table says
                stats.add(name, _REDUCE[STAT_REDUCTIONS[name]](values))
        return stats

    # -- the actuators --------------------------------------------------------------------------------
    def _trainer_actuator(self, args: TrainingArguments, model: nn.Module, optimizer: Any) -> TrainerActuator:
        """The actuator of this trainer's model and optimizer (kept across steps: it holds the snapshot)."""
        actuator = self._actuator
        if (
            not isinstance(actuator, TrainerActuator)
            or actuator.model is not model
            or actuator.optimizer is not optimizer
        ):
            folder = self.snapshot_dir
            if folder is None and self.guard is not None and self.guard.config.snapshot_to_disk:
                folder = str(Path(str(args.output_dir)) / _ENGINE_SNAPSHOT_DIR)
            path = None if folder is None else str(Path(folder) / f"rank{args.process_index}.safetensors")
            actuator = self.actuator_class(
                model,
                optimizer,
                owns_step=False,
                snapshot_path=path,
                replicas=self._replicas(),
                measure_update=self.measure_update or measures_update(self.guard),  # trust_region reads it
                trainer=self._trainer,
            )
            self._actuator = actuator
        return actuator

    def _replicas(self) -> Any:
        """The process group over which the weights are replicated (DDP: every process), whose ranks share the
        snapshot and the update measurement; None in one process and under FSDP (each rank's parameters are its own
        shards)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return None
        return None if getattr(self._trainer, "is_fsdp_enabled", False) else dist.group.WORLD

    def _stop_if_requested(self, control: TrainerControl) -> None:
        if self._actuator is not None and self._actuator.stop_requested:
            control.should_training_stop = True
            self._actuator.stop_requested = False

    def _install_engine_wrapper(self, args: TrainingArguments) -> ZeroActuator:
        """Put the guarded wrapper in place of accelerate's ``deepspeed_engine_wrapped`` (see the module)."""
        self._engine_wrapper = install_engine_wrapper(self._trainer, self._decide_in_engine)
        folder = Path(self.snapshot_dir or Path(str(args.output_dir)) / _ENGINE_SNAPSHOT_DIR)
        actuator = ZeroActuator(self._engine_wrapper.engine, folder, self._trainer)
        self._actuator = actuator
        return actuator

    def _decide_in_engine(self, engine: Any) -> None:
        """At the accumulation boundary, after ``engine.backward``: the guarded step, whose actuator then runs
        ``engine.step()``."""
        assert isinstance(self._actuator, ZeroActuator)
        grad_norm = zero_grad_norm(engine.optimizer)  # before the engine clips
        self._actuator.grad_norm = grad_norm
        lr = float(engine.optimizer.param_groups[0]["lr"])
        self._guarded_step(self._trainer.state.global_step + 1, grad_norm, lr, self._actuator)

    def _log(self, decision: Decision, applied: Applied) -> None:
        """The decision's tracker keys (:func:`~rlguard.guards.decision.tracker_metrics`) into TRL's next log."""
        metrics = logged_metrics(self._trainer)
        rollback_to = self.snapshot_step if applied.outcome == "rollback" else None
        logged = tracker_metrics(
            decision, skipped=applied.outcome == "skip", rollback_to=rollback_to, halted=applied.outcome == "halt"
        )
        for key, value in logged.items():
            metrics[key].append(value)

    def _load_guard_state(self, args: TrainingArguments, state: TrainerState) -> None:
        assert self.guard is not None
        path = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}" / GUARD_STATE_FILE
        if path.is_file():
            self.guard.load_state_dict(read_state_file(path), source=str(path))  # validated, the path in errors
        else:
            warnings.warn(missing_state_message(path, state.global_step), UserWarning, stacklevel=2)
