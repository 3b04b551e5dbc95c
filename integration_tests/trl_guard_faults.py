"""Fault injection for real TRL runs: the shared helpers of ``test_trl_guard_faults.py`` and its torchrun worker.

A fault hits one chosen optimizer step (1-based, as ``state.global_step`` after the step):

- ``poison``: the policy's log-probs of the first completion token of every row are NaN (a poisoned batch);
- ``grad``: the loss is multiplied by 1e6 (an exploding gradient; the runs do not clip);
- ``lr``: the scheduler's learning rate is multiplied by 1e3 for that step (a bad schedule or config).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from trl.trainer.grpo_trainer import GRPOTrainer

from rlguard.guards import GuardConfig
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments

FAULTS = ("poison", "grad", "lr")

RUN: dict[str, Any] = {
    **cpu_training_arguments(),
    "use_vllm": False,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 4,
    "learning_rate": 1e-3,
    "lr_scheduler_type": "constant",
    "max_grad_norm": 0.0,  # no clipping: an exploding gradient reaches the weights unless the guard acts
    "logging_steps": 1,
    "save_strategy": "no",
    "disable_tqdm": True,
    "seed": 0,
}


def guard_config(preset: str = "default", *, no_signal_skips: bool = False, **changes: Any) -> GuardConfig:
    """``preset`` with warm-ups short enough for runs of a few steps (its own thresholds), a snapshot every 2 steps,
    and without ``skip_no_signal`` unless ``no_signal_skips``: the random-init model's batches are one group of 4,
    often all rewarded 0 (no signal, skipped by it), and these runs test the faults they inject."""
    base = GuardConfig.preset(preset)
    short = ("grad_norm_spike", "grad_norm_explosion", "ratio_explosion", "kl_old_blowup", "entropy_collapse")
    detectors = {**base.detectors, **{name: {**(base.detectors.get(name) or {}), "warmup": 2} for name in short}}
    off = {} if no_signal_skips else {"skip_no_signal": None}
    interventions = {**base.interventions, **off, **changes.pop("interventions", {})}
    return GuardConfig.preset(preset, detectors=detectors, interventions=interventions, snapshot_interval=2, **changes)


def with_fault(base: type[GRPOTrainer], fault: str | None, at: int) -> type[GRPOTrainer]:
    """A subclass of ``base`` (stock or guarded trainer) that injects ``fault`` at optimizer step ``at``."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS} or None; got {fault!r}.")
    if at < 2:
        raise ValueError(f"at must be >= 2 (step 1 judges the initial weights); got {at}.")

    class Faulty(base):  # type: ignore[valid-type,misc]
        def _hit(self, kind: str) -> bool:
            return fault == kind and bool(self.model.training) and self.state.global_step + 1 == at

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if self._hit("poison") and torch.is_grad_enabled():
                # added, not assigned: the NaN reaches the gradient too, as a NaN from the forward pass would
                first = torch.zeros_like(logps, dtype=torch.bool)
                first[:, 0] = True
                logps = logps + torch.where(first, math.nan, 0.0)
            return logps, entropies, aux

        def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> Tensor:
            loss: Tensor = super()._compute_loss(model, inputs)
            return loss * 1e6 if self._hit("grad") else loss

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            scheduler = super().create_scheduler(num_training_steps, optimizer)
            if fault == "lr":
                # LambdaLR: the LR of optimizer step s (1-based) is base_lr * lambda(s - 1)
                # (at >= 2: the LR already set, of step 1, is not the one spiked)
                scheduler.lr_lambdas = [
                    (lambda s, f=f: f(s) * (1e3 if s == at - 1 else 1.0)) for f in scheduler.lr_lambdas
                ]
            return scheduler

    Faulty.__name__ = f"{base.__name__}With{(fault or 'no').title()}Fault"
    return Faulty


def build(
    trainer_cls: type[GRPOTrainer], model_dir: Path, args: Any, fault: str | None, at: int, **kwargs: Any
) -> GRPOTrainer:
    return with_fault(trainer_cls, fault, at)(
        model=str(model_dir), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(64), **kwargs
    )


def summary(trainer: GRPOTrainer) -> dict[str, Any]:
    """Finite weights, their size, the per-step rewards and the guard's actions (JSON-ready)."""
    params = [p.detach().double() for p in trainer.model.parameters()]
    finite = all(bool(torch.isfinite(p).all()) for p in params)
    logs = [r for r in trainer.state.log_history if "reward" in r and "train_runtime" not in r]
    return {
        "finite": finite,
        "weight_abs_max": max(p.abs().max().item() for p in params) if finite else math.inf,
        "weights_checksum": repr(sum(p.sum().item() for p in params)),
        "steps": trainer.state.global_step,
        "rewards": [r["reward"] for r in logs],
        "entropy": [r["entropy"] for r in logs],
        "skipped": [r["step"] for r in logs if r.get("rlguard/guard/skipped")],
        "rolled_back": [r["step"] for r in logs if "rlguard/guard/rollback_to" in r],
        "halted": [r["step"] for r in logs if r.get("rlguard/guard/halted")],
    }
