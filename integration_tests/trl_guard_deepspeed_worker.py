"""One rank of ``test_trl_guard_deepspeed.py`` (``torchrun --nproc_per_node=2``, ``DS_ACCELERATOR=cpu``, gloo).

Trains, one after the other in this process (one interpreter start for all), guarded ``GuardedGRPOTrainer`` runs
under ZeRO-2 and ZeRO-3 (``--runs 2/poison,3/poison,...``; the Trainer's optimizer and scheduler unless said)
with the faults of ``trl_guard_faults.py``:

- ``poison`` (AdamW, linear LR decay): NaN log-probs at step ``AT``; the guard skips it. Around that step a probe
  copies the full weights and this rank's ZeRO optimizer state (fp32 partitions, Adam's moments and step) before
  and after, and every step it records the engine's step counter and LR; at every boundary a spy computes the
  full gradient's norm with DeepSpeed's public ``safe_get_full_grad`` (per parameter, independent of the
  guard's partition norm);
- ``grad`` (plain SGD, the engine clipping at 1.0): the loss times 1e6 at step ``AT``, skipped;
- ``halt`` (DeepSpeed's AdamW, so the engine steps the scheduler): the poisoned step is skipped and the guard,
  allowed no rollback, halts the step after;
- ``lr``: an LR x1000 at step ``AT``; the strict preset rolls back to an engine checkpoint;
- ``lrscale`` (plain SGD, no fault): a guard whose ``lr_scale`` schedule is 0, so no step may move the weights,
  while the scheduler's LR must stay unscaled between steps;
- ``stock``: ``trl.GRPOTrainer`` with ``StabilityCallback(guard=...)`` attached by hand, poisoned (its NaN loss
  gives NaN gradients);
- ``resume``: poisoned, checkpointed at step 5, killed after step 6 and resumed by a new trainer from the
  DeepSpeed checkpoint: the guard's events and baselines carry over;
- ``script`` (``test_actuators_zero.py``): no fault; a guard whose decisions are scripted (:data:`SCRIPT`: snapshot,
  LR and clip scale, skip, clip-higher and entropy coefficient, rollback, halt), without DeepSpeed (``script``) and
  under ZeRO-2/3 (``2/script``, ``3/script``); every step records sums of the full weights and the controls;
- ``plain``: the first steps of ``poison`` without DeepSpeed (DDP over the same two processes), for the gradient
  norm the guard sees without ZeRO; it runs first, because accelerate's process-wide state stays on DeepSpeed
  once a DeepSpeed run has started (a later run without ``deepspeed=`` would still get an engine).

Writes ``rank<r>.json`` with each run's actions, observed stats, checks and a hash of the full final weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.utils import safe_get_full_grad
from transformers import TrainerCallback
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer
from trl_guard_faults import RUN, build, guard_config

from rlguard.adapters.trl import GUARD_STATE_FILE, GuardedGRPOConfig, GuardedGRPOTrainer, StabilityCallback
from rlguard.guards import Controls, Decision, Guard, GuardConfig
from rlguard.guards.decision import decision_action
from rlguard.guards.schedules import Constant

AT, STEPS, PLAIN_STEPS = 4, 7, 3
LR = RUN["learning_rate"]


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter in full, on every rank (ZeRO-3 gathers its shards; a no-op otherwise)."""
    params = dict(model.named_parameters())
    if all(not hasattr(p, "ds_id") for p in params.values()):
        return {name: p.detach().clone() for name, p in params.items()}
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
        return {name: p.detach().clone() for name, p in params.items()}


def flat_tensors(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a nested state dict, by path, copied."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().clone()
    elif isinstance(obj, dict):
        for key, value in obj.items():
            out.update(flat_tensors(value, f"{prefix}/{key}"))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            out.update(flat_tensors(value, f"{prefix}/{i}"))
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bit-identical (NaN equal to NaN)."""
    bits = {k: v.reshape(-1).view(torch.uint8) for k, v in a.items()}
    return a.keys() == b.keys() and all(torch.equal(bits[k], b[k].reshape(-1).view(torch.uint8)) for k in a)


def digest(weights: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(weights[name].double().numpy().tobytes())
    return h.hexdigest()


class Probe(TrainerCallback):
    """Around optimizer step ``at``: full weights and this rank's ZeRO optimizer state before and after it;
    every step: the engine's step counter and the LR the next step will use."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.trainer: Any = None
        self.before: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None
        self.result: dict[str, Any] = {"engine_steps": [], "lrs": []}

    def _state(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        engine = self.trainer.model_wrapped
        return full_weights(self.trainer.model), flat_tensors(engine.optimizer.state_dict())

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.trainer.is_deepspeed_enabled:
            return
        if state.global_step + 1 == self.at:
            self.before = self._state()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.trainer.is_deepspeed_enabled:
            return
        engine = self.trainer.model_wrapped
        self.result["engine_steps"].append([state.global_step, engine.global_steps])
        self.result["lrs"].append(engine.optimizer.param_groups[0]["lr"])
        if state.global_step == self.at and self.before is not None:
            weights, optimizer = self._state()
            self.result["weights_unchanged"] = same(self.before[0], weights)
            self.result["optimizer_state_unchanged"] = same(self.before[1], optimizer)
            self.result["optimizer_state_tensors"] = len(optimizer)
            self.result["adam_moments"] = sum("exp_avg" in k for k in optimizer)


class StopAt(TrainerCallback):
    """Stops training after optimizer step ``at`` (the schedule stays the one of the full run)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.at:
            control.should_training_stop = True


def spy_full_grad_norms(callback: StabilityCallback, trainer: Any) -> list[float]:
    """At every boundary, before the guard decides: the norm of the full gradient from ``safe_get_full_grad``."""
    norms: list[float] = []
    decide = callback._decide_in_engine

    def spied(engine: Any) -> None:
        squares = [safe_get_full_grad(p).double().square().sum() for p in trainer.model.parameters()]
        norms.append(math.sqrt(float(sum(squares))))
        decide(engine)

    callback._decide_in_engine = spied  # type: ignore[method-assign]
    return norms


def run(
    model: str,
    out: Path,
    name: str,
    fault: str | None,
    guard: Any,
    deepspeed_config: str | None,
    stock: bool = False,
    **changes: Any,
) -> dict[str, Any]:
    start = time.perf_counter()
    common = {"ddp_backend": "gloo", "ddp_timeout": 120, "deepspeed": deepspeed_config, "max_steps": STEPS, **RUN}
    stock_callback = StabilityCallback(guard=guard) if stock else None
    if stock:  # trl.GRPOTrainer with the callback, attached by hand
        args = GRPOConfig(output_dir=str(out / name), **{**common, **changes})
    else:
        args = GuardedGRPOConfig(output_dir=str(out / name), guard=guard, **{**common, **changes})
    probe = Probe(AT)
    extra = [StopAt(PLAIN_STEPS)] if name == "plain" else []
    callbacks = [probe, *extra, *([stock_callback] if stock_callback else [])]
    trainer = build(GRPOTrainer if stock else GuardedGRPOTrainer, Path(model), args, fault, AT, callbacks=callbacks)
    if stock_callback is not None:
        stock_callback.attach(trainer)
    probe.trainer = trainer
    callback = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, StabilityCallback))
    full_norms = spy_full_grad_norms(callback, trainer) if deepspeed_config else []
    partitioned = all(hasattr(p, "ds_tensor") and p.ds_tensor.numel() < p.ds_numel for p in trainer.model.parameters())
    initial = full_weights(trainer.model)
    trainer.train()
    weights = full_weights(trainer.model)
    finite = all(bool(torch.isfinite(w).all()) for w in weights.values())
    logs = [r for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r]
    result = {
        "actions": [[d.step, a] for d in callback.decisions if (a := decision_action(d)) != "continue"],
        "lr_scales": [d.controls.lr_scale for d in callback.decisions],
        "steps": trainer.state.global_step,
        "finite": finite,
        "weight_abs_max": max(w.abs().max().item() for w in weights.values()) if finite else math.inf,
        "weights_sha256": digest(weights),
        "guard_grad_norms": [s["grad_norm"] for s in callback.observed],
        "guard_lrs": [s["lr"] for s in callback.observed],
        "logged_grad_norms": [r.get("grad_norm") for r in logs],
        "full_grad_norms": full_norms,
        "entropy": [r["entropy"] for r in logs if "entropy" in r],
        "events": [[e.step, e.detector, e.severity] for e in callback.guard.events],  # type: ignore[union-attr]
        "wrapper_restored": type(trainer.accelerator.deepspeed_engine_wrapped).__name__ if deepspeed_config else None,
        "engine": type(trainer.model_wrapped).__name__,
        "deepspeed_enabled": trainer.is_deepspeed_enabled,
    }
    if deepspeed_config:
        engine = trainer.model_wrapped
        result["zero_stage"] = engine.zero_optimization_stage()
        result["partitioned"] = partitioned
        result["optimizer"] = type(engine.optimizer.optimizer).__name__  # the optimizer inside ZeRO's
        result["weights_moved"] = not same(initial, weights)
        result.update(probe.result)
    result["seconds"] = time.perf_counter() - start  # this rank's wall time (not compared between ranks)
    return result


#: the decisions of the ``script`` runs, by optimizer step (the same script as tests/guards/actuation/test_executor.py,
#: without beta: these runs load no reference model)
SCRIPT: dict[int, Decision] = {
    1: Decision(1, snapshot=True),
    2: Decision(2, controls=Controls(lr_scale=0.5, clip_scale=0.5)),
    3: Decision(3, "skip", Controls(lr_scale=0.5, clip_scale=0.5)),
    4: Decision(4, controls=Controls(clip_high_scale=2.0, entropy_coef=0.02)),
    5: Decision(5, "rollback", rollback_to=1),
    6: Decision(6, "halt"),
}


class ScriptedGuard(Guard):
    """A real Guard (monitor preset) whose decision at each step is :data:`SCRIPT`'s."""

    def __init__(self) -> None:
        super().__init__(GuardConfig.preset("monitor"))

    def observe(self, step: int, stats: Any) -> Decision:
        return SCRIPT.get(step, Decision(step))


class Trace(TrainerCallback):
    """After every optimizer step: sums of the full weights (float64), their digest, the objective's controls."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.rows: list[dict[str, Any]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        weights = full_weights(self.trainer.model)
        flat = torch.cat([w.double().reshape(-1) for _, w in sorted(weights.items())])
        objective = self.trainer.rlguard_objective
        self.rows.append(
            {
                "step": state.global_step,
                "digest": digest(weights),
                "sum": float(flat.sum()),
                "sumsq": float(flat.square().sum()),
                "controls": [objective.clip_low, objective.clip_high, objective.entropy_coef],
            }
        )


def scripted(model: str, out: Path, name: str, deepspeed_config: str | None) -> dict[str, Any]:
    """:data:`SCRIPT` through the TRL actuator of this setting (DDP, or ZeRO with ``deepspeed_config``)."""
    start = time.perf_counter()
    args = GuardedGRPOConfig(
        output_dir=str(out / name), ddp_backend="gloo", ddp_timeout=120, deepspeed=deepspeed_config,
        **{**RUN, "max_steps": len(SCRIPT) + 2},
    )  # fmt: skip
    callback, trace = StabilityCallback(guard=ScriptedGuard()), Trace()
    trainer = build(GuardedGRPOTrainer, Path(model), args, None, AT, callbacks=[callback, trace])
    trace.trainer = trainer
    initial = full_weights(trainer.model)
    trainer.train()
    steps = trainer.state.global_step
    return {"initial": digest(initial), "trace": trace.rows, "steps": steps, "seconds": time.perf_counter() - start}


class Kill(TrainerCallback):
    """Raises on every rank after optimizer step ``at``: a killed run."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.at:
            raise KeyboardInterrupt("killed")


def resume(model: str, out: Path, name: str, deepspeed_config: str) -> dict[str, Any]:
    """Poisoned at ``AT``, checkpointed at step 5, killed after step 6, resumed from the checkpoint by a new trainer."""
    start = time.perf_counter()

    def arguments() -> GuardedGRPOConfig:  # new arguments per trainer: they set up accelerate's state afresh
        return GuardedGRPOConfig(
            output_dir=str(out / name), ddp_backend="gloo", ddp_timeout=120, guard=guard_config(),
            deepspeed=deepspeed_config, **{**RUN, "max_steps": STEPS, "save_strategy": "steps", "save_steps": 5},
        )  # fmt: skip

    first = build(GuardedGRPOTrainer, Path(model), arguments(), "poison", AT, callbacks=[Kill(6)])
    try:
        first.train()
        killed = False
    except KeyboardInterrupt:
        killed = True
    saved = json.loads((out / name / "checkpoint-5" / GUARD_STATE_FILE).read_text())
    second = build(GuardedGRPOTrainer, Path(model), arguments(), None, AT)  # a fresh guard, as in a new process
    second.train(resume_from_checkpoint=True)
    callback = next(cb for cb in second.callback_handler.callbacks if isinstance(cb, StabilityCallback))
    state = second.rlguard_guard.state_dict()  # type: ignore[union-attr]
    weights = full_weights(second.model)
    return {
        "killed": killed,
        "saved_last_step": saved["last_step"],
        "saved_event_steps": [e["step"] for e in saved["events"]],
        "event_steps": [e["step"] for e in state["events"]],
        "seen_nonfinite": state["seen"]["nonfinite"],
        "decision_steps": [d.step for d in callback.decisions],
        "engine_global_steps": second.model_wrapped.global_steps,
        "steps": second.state.global_step,
        "finite": all(bool(torch.isfinite(w).all()) for w in weights.values()),
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--configs",
        required=True,
        help="folder of DeepSpeed configs zero<stage>_trainer.json (no optimizer block: the Trainer's optimizer) "
        "and zero<stage>_adamw.json (DeepSpeed's AdamW)",
    )
    parser.add_argument("--runs", required=True, help="comma-separated: plain, or <stage>/<run>, e.g. 2/poison")
    cli = parser.parse_args()
    warnings.simplefilter("ignore")
    out, configs = Path(cli.out), Path(cli.configs)
    halting = guard_config(interventions={"rollback": {"max_consecutive_skips": 1, "max_rollbacks": 0}})
    frozen = guard_config(schedules={"lr_scale": Constant(0.0)})  # every step at LR x 0: SGD moves nothing
    linear = {"lr_scheduler_type": "linear"}
    plans: dict[str, tuple[str | None, Any, str, dict[str, Any]]] = {
        "plain": (None, guard_config(), "", linear),
        "poison": ("poison", guard_config(), "trainer", linear),
        "grad": ("grad", guard_config(), "trainer", {"optim": "sgd", "max_grad_norm": 1.0}),  # the engine clips
        "halt": ("poison", halting, "adamw", linear),  # DeepSpeed's optimizer: the engine steps the scheduler
        "lr": ("lr", guard_config("strict"), "trainer", {}),
        "lrscale": (None, frozen, "trainer", {"optim": "sgd", "max_steps": 2}),
        "stock": ("poison", guard_config(), "trainer", {"stock": True, "max_steps": AT}),
    }
    results = {}
    # "plain" must come first: after a DeepSpeed run, accelerate's process-wide state keeps DeepSpeed on (runs
    # under different ZeRO stages may follow each other: each run's arguments carry its DeepSpeed config)
    for key in cli.runs.split(","):
        stage, _, name = key.rpartition("/")
        if name == "script":
            config = str(configs / f"zero{stage}_trainer.json") if stage else None
            results[key] = scripted(cli.model, out, key.replace("/", "_"), config)
            continue
        if name == "resume":
            results[key] = resume(cli.model, out, key.replace("/", "_"), str(configs / f"zero{stage}_trainer.json"))
            continue
        fault, guard, optimizer, changes = plans[name]
        config = str(configs / f"zero{stage}_{optimizer}.json") if optimizer else None
        results[key] = run(cli.model, out, key.replace("/", "_"), fault, guard, config, **changes)
    rank = torch.distributed.get_rank()
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    from torchrun_exit import shut_down

    main()
    shut_down()
