"""``rlguard.adapters.trl.callback``: each decision applied by ``StabilityCallback`` to a real model and Adam optimizer
through the callback events transformers' ``Trainer`` calls, in its order; checkpoint round trip of guard state.
Whole TRL runs with injected faults are in ``integration_tests/test_trl_guard_faults.py``."""

from __future__ import annotations

import importlib
import json
import re
import warnings
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

from transformers import TrainerControl, TrainerState, TrainingArguments

from rlguard.adapters.trl import GUARD_STATE_FILE, GuardedGRPOConfig, StabilityCallback, canonical_stats, make_guard
from rlguard.guards import Controls, Decision, Guard, GuardConfig
from tests.helpers.guards import ScriptedGuard
from tests.helpers.trl_loop import Loop


def test_skip_step_leaves_weights_and_optimizer_state(tmp_path: Path) -> None:
    guard = ScriptedGuard({2: Decision(2, "skip")})
    loop = Loop(StabilityCallback(guard=guard), tmp_path)
    loop.step()
    before, steps = loop.weights(), loop.adam_steps()
    loop.step(scale=float("nan"))  # a poisoned step
    assert all(torch.equal(a, b) for a, b in zip(before, loop.weights(), strict=True))
    assert loop.adam_steps() == steps == [1.0, 1.0]
    assert guard.seen[1]["nonfinite"] > 0 and guard.seen[0]["nonfinite"] == 0
    loop.step()
    assert loop.adam_steps() == [2.0, 2.0]


def test_stats_hold_the_norm_before_clipping_and_the_grads_are_clipped(tmp_path: Path) -> None:
    guard = ScriptedGuard({})
    loop = Loop(StabilityCallback(guard=guard), tmp_path, max_grad_norm=1.0)
    assert loop.args.max_grad_norm == 0.0  # the callback clips
    loop.model(torch.ones(4, 3)).pow(2).sum().backward()
    expected = torch.nn.utils.get_total_norm([p.grad for p in loop.model.parameters()]).item()  # type: ignore[misc]
    loop.model.zero_grad()
    loop.step()
    assert guard.seen[0]["grad_norm"] == pytest.approx(expected) and expected > 1.0
    assert guard.seen[0]["lr"] == 0.1
    loop.callback.on_train_end(loop.args, loop.state, loop.control)
    assert loop.args.max_grad_norm == 1.0


def test_lr_scale_applies_to_the_step_only(tmp_path: Path) -> None:
    loop = Loop(StabilityCallback(guard=ScriptedGuard({1: Decision(1, controls=Controls(lr_scale=0.25))})), tmp_path)
    loop.step()
    assert loop.lr_used == [0.025]
    assert [g["lr"] for g in loop.optimizer.param_groups] == [0.1]  # the scheduler's value, restored
    loop.step()
    assert loop.lr_used == [0.1]


def test_rollback_restores_the_snapshot(tmp_path: Path) -> None:
    script = {1: Decision(1, snapshot=True), 4: Decision(4, "rollback", rollback_to=1)}
    loop = Loop(StabilityCallback(guard=ScriptedGuard(script), snapshot_dir=str(tmp_path / "snap")), tmp_path)
    initial = loop.weights()
    for _ in range(3):
        loop.step()
    assert not torch.equal(initial[0], loop.weights()[0])
    loop.step()  # step 4 rolls back to the weights before step 1's update
    assert all(torch.equal(a, b) for a, b in zip(initial, loop.weights(), strict=True))
    assert loop.adam_steps() == [] and loop.callback.snapshot_step == 1


def test_rollback_without_snapshot_halts(tmp_path: Path) -> None:
    loop = Loop(StabilityCallback(guard=ScriptedGuard({1: Decision(1, "rollback", rollback_to=0)})), tmp_path)
    loop.step()
    assert loop.control.should_training_stop and loop.adam_steps() == []


def test_halt_stops_training(tmp_path: Path) -> None:
    loop = Loop(StabilityCallback(guard=ScriptedGuard({2: Decision(2, "halt")})), tmp_path)
    loop.step()
    assert not loop.control.should_training_stop
    loop.step()
    assert loop.control.should_training_stop and loop.adam_steps() == [1.0, 1.0]


def test_guard_state_resumes_from_the_checkpoint_folder(tmp_path: Path) -> None:
    callback = StabilityCallback(guard=GuardConfig.preset("default"))
    loop = Loop(callback, tmp_path)
    for _ in range(3):
        loop.step()
    (tmp_path / "checkpoint-3").mkdir()
    callback.on_save(loop.args, loop.state, loop.control)
    saved = json.loads((tmp_path / "checkpoint-3" / GUARD_STATE_FILE).read_text())
    assert saved["last_step"] == 3

    resumed = StabilityCallback(guard="default")
    resumed.attach(SimpleNamespace(_metrics={"train": defaultdict(list)}))
    state = TrainerState()
    state.global_step = 3
    resumed.on_train_begin(loop.args, state, TrainerControl(), model=loop.model, optimizer=loop.optimizer)
    assert resumed.guard is not None and resumed.guard.state_dict() == saved
    assert resumed.guard.events_log is not None and resumed.guard.events_log.path == tmp_path / "events.jsonl"


def test_make_guard_and_config_validate() -> None:
    assert make_guard("strict").config.snapshot_interval == 5
    with pytest.raises(ValueError, match="unknown guard preset 'loud'"):
        make_guard("loud")
    with pytest.raises(ValueError, match="guard must be a preset name"):
        make_guard(3)  # type: ignore[arg-type]
    args = GuardedGRPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", guard="monitor")
    assert args.guard == "monitor"
    strict = GuardConfig.preset("strict")
    args = GuardedGRPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", guard=strict)
    assert json.loads(args.to_json_string())["guard"] == repr(strict)  # report_to integrations log the config


def test_guard_from_spec_is_a_deprecated_name_of_parse_guard_flag() -> None:
    from rlguard.adapters.trl.config import parse_guard_flag

    for module in ("config", "trainer"):  # defined in config, exported by trainer too
        with pytest.warns(
            DeprecationWarning, match=rf"trl\.{module}\.guard_from_spec is deprecated: use .*\.parse_guard_flag"
        ):
            old = importlib.import_module(f"rlguard.adapters.trl.{module}").guard_from_spec
        assert old is parse_guard_flag
    assert parse_guard_flag('{"preset": "strict"}') == GuardConfig.preset("strict")


def test_guard_keys_are_not_stats() -> None:
    logs = {"rlguard/ratio_max": 1.5, "rlguard/guard/lr_scale": 0.5, "rlguard/event/nonfinite": 2.0, "reward": 0.1}
    assert canonical_stats(logs) == {"ratio_max": 1.5, "reward_mean": 0.1}


def test_guarded_trainer_masks_nonfinite_and_sets_the_clip_range(tmp_path: Path) -> None:
    from rlguard.adapters.trl import GuardedGRPOTrainer
    from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

    model_dir = save_tiny_llama(tmp_path / "model")
    args = GuardedGRPOConfig(
        output_dir=str(tmp_path / "out"), **cpu_training_arguments(), per_device_train_batch_size=4,
        num_generations=4, max_completion_length=4, loss_type="dapo", epsilon_high=0.28, guard="default",
    )  # fmt: skip
    trainer = GuardedGRPOTrainer(
        model=str(model_dir), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(8)
    )
    objective = trainer.rlguard_objective
    assert objective.on_nonfinite == "mask"
    callbacks = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, StabilityCallback)]
    assert len(callbacks) == 1 and callbacks[0].guard is trainer.rlguard_guard is not None
    trainer.rlguard_set_controls(Controls(clip_scale=0.5))
    assert (trainer.rlguard_objective.clip_low, trainer.rlguard_objective.clip_high) == (0.1, 0.14)  # type: ignore[attr-defined]
    trainer.rlguard_set_controls(Controls(clip_high=0.2))  # a scheduled value replaces the configured one
    assert (trainer.rlguard_objective.clip_low, trainer.rlguard_objective.clip_high) == (0.2, 0.2)  # type: ignore[attr-defined]
    trainer.rlguard_set_controls(Controls())
    assert trainer.rlguard_objective is objective or trainer.rlguard_objective == objective
    trainer.rlguard_set_controls(Controls(entropy_coef=0.01, beta=0.0))  # scheduled entropy bonus and KL weight
    assert (trainer.rlguard_objective.entropy_coef, trainer.rlguard_objective.beta) == (0.01, 0.0)
    with pytest.raises(ValueError, match="configured with beta=0"):
        trainer.rlguard_set_controls(Controls(beta=0.04))  # TRL loaded no reference model


def test_a_guard_under_deepspeed_needs_the_trainer_and_refuses_what_it_cannot_act_on(tmp_path: Path) -> None:
    """Under DeepSpeed the guard decides inside accelerator.backward: it needs the attached trainer, and refuses
    (before changing anything) an engine without ZeRO partitions or with the optimizer offloaded to the CPU."""
    callback = StabilityCallback(guard=Guard(GuardConfig.preset("default")))
    args = SimpleNamespace(
        deepspeed={"zero_optimization": {"stage": 2}},
        output_dir=str(tmp_path),
        process_index=0,
        logging_strategy="steps",
        logging_steps=1,
    )
    state, control = SimpleNamespace(global_step=0), SimpleNamespace()
    with pytest.raises(ValueError, match=r"cb\.attach\(trainer\)"):
        callback.on_train_begin(args, state, control)  # type: ignore[arg-type]

    def trainer(stage: int, **optimizer: Any) -> SimpleNamespace:
        engine = SimpleNamespace(optimizer=SimpleNamespace(**optimizer), zero_optimization_stage=lambda: stage)
        accelerate_wrapper = SimpleNamespace(engine=engine)
        return SimpleNamespace(accelerator=SimpleNamespace(deepspeed_engine_wrapped=accelerate_wrapper))

    for stock, match in (
        (trainer(0), "ZeRO stages 1-3 only; got stage 0"),
        (trainer(2, averaged_gradients={}, cpu_offload=True), "ZeRO-Offload"),
        (trainer(3, averaged_gradients={}, offload_optimizer=True), "ZeRO-Offload"),
    ):
        callback.attach(stock)
        with pytest.raises(NotImplementedError, match=match):
            callback.on_train_begin(args, state, control)  # type: ignore[arg-type]
        assert stock.accelerator.deepspeed_engine_wrapped.engine is not None  # accelerate's wrapper is untouched
        assert not hasattr(stock.accelerator.deepspeed_engine_wrapped, "callback")


def test_a_stock_trainer_with_a_guard_and_no_attach_refuses_at_train_start(tmp_path: Path) -> None:
    """``GRPOTrainer(callbacks=[StabilityCallback(guard=...)])`` ran with a guard blind to TRL's metrics and no
    ``rlguard/*`` logs; it now refuses before the first step, naming the fix, and runs once attached."""
    from trl import GRPOConfig, GRPOTrainer

    from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

    model_dir = save_tiny_llama(tmp_path / "model")
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), **cpu_training_arguments(), per_device_train_batch_size=4,
        num_generations=4, max_completion_length=4, max_steps=1, logging_steps=1, save_strategy="no",
        disable_tqdm=True,
    )  # fmt: skip
    callback = StabilityCallback(guard="default")
    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(8),  # type: ignore[arg-type]
        callbacks=[callback],
    )  # fmt: skip
    weights = [p.detach().clone() for p in trainer.model.parameters()]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"Call cb\.attach\(trainer\) before trainer\.train\(\), or use GuardedGRPO"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(w, p) for w, p in zip(weights, trainer.model.parameters(), strict=True))  # type: ignore[union-attr]
    callback.attach(trainer)
    trainer.train()
    assert trainer.state.global_step == 1 and len(callback.decisions) == 1
    logged = trainer.state.log_history[0]
    assert "rlguard/guard/lr_scale" in logged and callback.observed[0]["reward_mean"] == logged["reward"]


def test_forced_logging_is_warned_about_once(tmp_path: Path) -> None:
    """A StabilityCallback logs every step whatever ``logging_steps`` says, and says so once."""
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", logging_steps=10)
    for callback, expected in (
        (StabilityCallback(), "overriding logging_strategy='steps', logging_steps=10.*every_step=False"),
        (StabilityCallback(every_step=False), None),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            callback.on_train_begin(args, TrainerState(), TrainerControl())
            for _ in range(3):
                callback.on_step_end(args, TrainerState(), TrainerControl())
        messages = [str(w.message) for w in caught]
        if expected is None:
            assert messages == []
        else:
            assert len(messages) == 1 and re.search(expected, messages[0]), messages
    args.logging_steps = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StabilityCallback().on_train_begin(args, TrainerState(), TrainerControl())  # as configured: silent


def test_a_beta_schedule_without_a_reference_model_is_refused_at_start_up(tmp_path: Path) -> None:
    from rlguard.adapters.trl import GuardedGRPOTrainer
    from rlguard.guards import Constant
    from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

    args = GuardedGRPOConfig(
        output_dir=str(tmp_path / "out"), **cpu_training_arguments(), per_device_train_batch_size=4,
        num_generations=4, max_completion_length=4, beta=0.0, guard=GuardConfig(schedules={"beta": Constant(0.01)}),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"schedules beta, but GuardedGRPOConfig\(beta=0.0\)"):
        GuardedGRPOTrainer(
            model=str(save_tiny_llama(tmp_path / "model")), reward_funcs=addition_reward, args=args,
            train_dataset=addition_dataset(8),
        )  # fmt: skip


def test_the_guard_judges_the_objective_metrics_the_trainer_logs(tmp_path: Path) -> None:
    """The guard's share of each micro-batch comes from the one transfer that logs the objective's metrics: with
    one micro-batch per step the stats it judged are the logged ``rlguard/*`` values (means, extremes, counts)."""
    from rlguard.adapters.trl import GuardedGRPOTrainer
    from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

    args = GuardedGRPOConfig(
        output_dir=str(tmp_path / "out"), **cpu_training_arguments(), per_device_train_batch_size=4,
        num_generations=4, max_completion_length=4, max_steps=2, logging_steps=1, save_strategy="no",
        disable_tqdm=True, learning_rate=1e-3, guard="monitor",
    )  # fmt: skip
    trainer = GuardedGRPOTrainer(
        model=str(save_tiny_llama(tmp_path / "model")), reward_funcs=addition_reward, args=args,
        train_dataset=addition_dataset(8),
    )  # fmt: skip
    trainer.train()
    (callback,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, StabilityCallback)]
    assert len(callback.observed) == 2
    for observed, logged in zip(callback.observed, trainer.state.log_history, strict=False):
        for name in ("loss", "entropy", "kl_old", "ratio_mean", "ratio_max", "seq_ratio_min", "clip_frac"):
            assert observed[name] == pytest.approx(logged[f"rlguard/{name}"], rel=1e-12, abs=1e-15), name
        assert observed["nonfinite"] == 0.0


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_started_twice_in_one_folder_shows_the_second_runs_events_only(tmp_path: Path) -> None:
    first = Loop(StabilityCallback(guard="default"), tmp_path)
    for scale in (1.0, 1.0, float("nan"), 1.0):  # a poisoned step: a critical event and a skip
        first.step(scale)
    assert first.callback.guard is not None and first.callback.guard.events
    assert _events(tmp_path / "events.jsonl") == [e.to_dict() for e in first.callback.guard.events]

    second = Loop(StabilityCallback(guard="default"), tmp_path)  # a new run, not a resume, in the same folder
    for _ in range(4):
        second.step()
    assert (tmp_path / "events.jsonl").read_text() == ""  # a healthy run: not the first run's critical event
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("events.jsonl.")]
    assert _events(old) == [e.to_dict() for e in first.callback.guard.events]  # kept beside it


def test_a_killed_and_resumed_run_loses_no_event_and_no_guard_state(tmp_path: Path) -> None:
    """A run checkpointed at step 4 and killed after step 6, resumed from checkpoint-4, ends with the events file and
    the guard state of the same run uninterrupted: the stretch it repeats is not written twice."""
    scales = [1.0, 1.0, float("nan"), 1.0, 1.0, float("nan"), 1.0, 1.0]  # poisoned at steps 3 and 6
    whole = Loop(StabilityCallback(guard="default"), tmp_path / "whole")
    for scale in scales:
        whole.step(scale)
    assert whole.callback.guard is not None and {e.step for e in whole.callback.guard.events} == {3, 6}

    run = tmp_path / "run"
    killed = Loop(StabilityCallback(guard="default"), run)
    for scale in scales[:4]:
        killed.step(scale)
    (run / "checkpoint-4").mkdir()
    killed.callback.on_save(killed.args, killed.state, killed.control)
    weights = {k: v.clone() for k, v in killed.model.state_dict().items()}
    optimizer = killed.optimizer.state_dict()
    optimizer = {**optimizer, "state": {k: {n: t.clone() for n, t in s.items()} for k, s in optimizer["state"].items()}}
    for scale in scales[4:6]:  # steps 5 and 6 after the checkpoint, then the process dies
        killed.step(scale)
    assert {e["step"] for e in _events(run / "events.jsonl")} == {3, 6}

    # the resume: the trainer loads checkpoint-4's weights and optimizer, then calls on_train_begin at step 4
    callback = StabilityCallback(guard="default")
    callback.attach(SimpleNamespace(_metrics={"train": defaultdict(list)}))
    resumed = Loop.__new__(Loop)
    resumed.model, resumed.optimizer = torch.nn.Linear(3, 2), None  # type: ignore[assignment]
    resumed.model.load_state_dict(weights)
    resumed.optimizer = torch.optim.Adam(resumed.model.parameters(), lr=0.1)
    resumed.optimizer.load_state_dict(optimizer)
    resumed.args = TrainingArguments(output_dir=str(run), use_cpu=True, report_to="none", logging_steps=1)
    resumed.args.max_grad_norm = 1.0  # a new process: the killed callback's arguments are gone
    resumed.control, resumed.callback = TrainerControl(), callback
    resumed.state = TrainerState()
    resumed.state.global_step = 4
    callback.on_train_begin(
        resumed.args, resumed.state, resumed.control, model=resumed.model, optimizer=resumed.optimizer
    )
    for scale in scales[4:]:
        resumed.step(scale)
    assert callback.guard is not None
    assert _events(run / "events.jsonl") == _events(tmp_path / "whole" / "events.jsonl")  # each event once
    assert callback.guard.state_dict() == whole.callback.guard.state_dict()  # baselines, counters, alarms, events
    assert all(torch.equal(a, b) for a, b in zip(resumed.weights(), whole.weights(), strict=True))
