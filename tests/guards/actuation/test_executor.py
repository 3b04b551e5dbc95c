"""The same scripted decisions through every actuator (``rlguard.guards.actuation``): weights, optimizer state, LR
and objective controls after each step, against a reference written out step by step with plain torch.

Actuators here: the plain-torch loop (:class:`TorchActuator`), transformers' ``Trainer`` under DDP
(``StabilityCallback`` driven through the callback events, in the trainer's order), verl's driver (stand-in trainer
of ``tests/helpers/verl_stand_in.py``, whose workers are verl's stock ones; declared gaps: no ``drop_update``, and no
``lr_scale`` without rlguard's actor worker, see ``tests/adapters/verl/test_worker.py``). TRL under DeepSpeed ZeRO-2/3:
``integration_tests/test_actuators_zero.py`` (two processes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rlguard.core_losses import Objective, get_objective
from rlguard.guards import Controls, Decision, Event, Guard, GuardConfig
from rlguard.guards.actuation import CAPABILITIES, TorchActuator, apply_decision, bind_guard, check_capabilities
from rlguard.guards.decision import decision_action
from tests.helpers.guards import ScriptedGuard

LR = 0.1
#: the script: snapshot, half LR and clip range, a skip (the LR scale stays), clip-higher with beta and entropy
#: coefficient, a rollback to the snapshot, a halt; two steps with events (for the tracker's keys)
SCRIPT: tuple[Decision, ...] = (
    Decision(1, snapshot=True),
    Decision(
        2, controls=Controls(lr_scale=0.5, clip_scale=0.5), events=(Event(2, "action:scale_lr", "warn", 0.5, "LR"),)
    ),
    Decision(
        3, "skip", Controls(lr_scale=0.5, clip_scale=0.5), events=(Event(3, "nonfinite", "critical", 1.0, "NaN"),)
    ),
    Decision(4, controls=Controls(clip_high_scale=2.0, beta=0.01, entropy_coef=0.02)),
    Decision(5, "rollback", rollback_to=1),
    Decision(6, "halt"),
)
Record = dict[str, Any]


def base_objective() -> Objective:
    return get_objective("grpo", beta=0.04)  # clip range (0.2, 0.2)


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def backward(model: torch.nn.Module, step: int) -> None:
    x = torch.arange(12, dtype=torch.float64).reshape(4, 3) / (step + 1)
    model(x).pow(2).sum().backward()


def record(model: torch.nn.Module, optimizer: torch.optim.Optimizer, lrs: list[float], objective: Objective) -> Record:
    state = optimizer.state_dict()["state"]
    return {
        "weights": [p.detach().clone() for p in model.parameters()],
        "adam": {k: {n: v.clone() for n, v in s.items()} for k, s in state.items()},
        "lrs": list(lrs),
        "controls": (objective.clip_low, objective.clip_high, objective.beta, objective.entropy_coef),  # type: ignore[attr-defined]
    }


def watch_lr(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[float]:
    """The LR of every optimizer step that updates something (an update dropped to no gradient is not one)."""
    lrs: list[float] = []

    def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if any(p.grad is not None for p in model.parameters()):
            lrs.append(opt.param_groups[0]["lr"])

    optimizer.register_step_pre_hook(hook)
    return lrs


def reference() -> list[Record]:
    """What the script means, step by step, with no rlguard code on the optimizer's side."""
    model, optimizer = make_model()
    lrs = watch_lr(model, optimizer)
    base, records = base_objective(), []
    snapshot: tuple[dict[str, Any], dict[str, Any]] | None = None

    def update(lr: float) -> None:
        optimizer.param_groups[0]["lr"] = lr
        optimizer.step()
        optimizer.param_groups[0]["lr"] = LR

    for d in SCRIPT:
        backward(model, d.step)
        if d.step == 1:
            snapshot = ({k: v.clone() for k, v in model.state_dict().items()}, _copy(optimizer.state_dict()))
            update(LR)
            controls = (0.2, 0.2, 0.04, 0.0)
        elif d.step == 2:
            update(LR * 0.5)
            controls = (0.1, 0.1, 0.04, 0.0)
        elif d.step == 3:
            controls = (0.1, 0.1, 0.04, 0.0)  # skipped: no update
        elif d.step == 4:
            update(LR)
            controls = (0.2, 0.4, 0.01, 0.02)
        elif d.step == 5:
            assert snapshot is not None
            model.load_state_dict(snapshot[0])
            optimizer.load_state_dict(snapshot[1])
            controls = (0.2, 0.2, 0.04, 0.0)
        else:
            controls = (0.2, 0.2, 0.04, 0.0)  # halted: no update
        model.zero_grad()
        rec = record(model, optimizer, lrs, base)
        rec["controls"] = controls
        records.append(rec)
    return records


def _copy(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return {k: _copy(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_copy(v) for v in state]
    return state


def torch_loop() -> tuple[list[Record], bool]:
    """The benchmarks' plain loop: the actuator owns the optimizer step."""
    model, optimizer = make_model()
    lrs = watch_lr(model, optimizer)
    actuator = TorchActuator(model, optimizer, objective=base_objective())
    records = []
    for d in SCRIPT:
        backward(model, d.step)
        apply_decision(d, actuator)
        model.zero_grad()
        records.append(record(model, optimizer, lrs, actuator.objective_in_use))
    return records, actuator.stopped


def trainer_stand_in(guarded_trainer: type[Any]) -> type:
    """A stand-in trainer carrying GuardedGRPOTrainer's real ``rlguard_set_controls`` and TRL's metric store."""

    class StandIn:
        rlguard_set_controls = guarded_trainer.rlguard_set_controls

        def __init__(self) -> None:
            self.rlguard_configured_objective = self.rlguard_objective = base_objective()
            self._metrics: dict[str, defaultdict[str, list[float]]] = {"train": defaultdict(list)}
            self._entropy_bonus_enabled = False  # TRL's entropy bonus off, no adaptive entropy controller
            self._rlguard_adaptive_entropy = None

    return StandIn


def trl_ddp_loop(tmp_path: Path, logged: list[dict[str, float]] | None = None) -> tuple[list[Record], bool]:
    """transformers' Trainer without DeepSpeed: StabilityCallback's events in the trainer's order; the trainer
    runs ``optimizer.step()`` itself. The trainer is a stand-in carrying GuardedGRPOTrainer's real
    ``rlguard_set_controls``. Each step's record in TRL's metrics (one value per key) goes to ``logged``, as TRL's
    log after every step would take it."""
    pytest.importorskip("trl")
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from rlguard.adapters.trl import GuardedGRPOTrainer, StabilityCallback

    StandIn = trainer_stand_in(GuardedGRPOTrainer)
    model, optimizer = make_model()
    lrs = watch_lr(model, optimizer)
    trainer = StandIn()
    callback = StabilityCallback(guard=ScriptedGuard({d.step: d for d in SCRIPT}))
    callback.attach(trainer)
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", max_grad_norm=0.0, logging_steps=1
    )
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control, model=model, optimizer=optimizer)
    records, stopped = [], False
    for d in SCRIPT:
        backward(model, d.step)
        kw: dict[str, Any] = {"model": model, "optimizer": optimizer, "lr_scheduler": None}
        callback.on_pre_optimizer_step(args, state, control, **kw)
        optimizer.step()
        callback.on_optimizer_step(args, state, control, **kw)
        model.zero_grad()
        state.global_step += 1
        stopped = stopped or control.should_training_stop
        records.append(record(model, optimizer, lrs, trainer.rlguard_objective))
        if logged is not None:
            metrics = trainer._metrics["train"]
            logged.append({key: value for key, (value,) in metrics.items()})
            metrics.clear()
    return records, stopped


def assert_same(actual: list[Record], expected: list[Record]) -> None:
    for step, (a, e) in enumerate(zip(actual, expected, strict=True), start=1):
        for x, y in zip(a["weights"], e["weights"], strict=True):
            assert torch.equal(x, y), f"weights differ after step {step}"
        assert a["adam"].keys() == e["adam"].keys(), step
        for k in e["adam"]:
            for name, value in e["adam"][k].items():
                assert torch.equal(a["adam"][k][name], value), f"Adam {name} differs after step {step}"
        assert a["lrs"] == pytest.approx(e["lrs"], rel=0, abs=0), step
        assert a["controls"] == pytest.approx(e["controls"], rel=1e-15), step


@pytest.mark.parametrize("loop", ["torch", "trl_ddp"])
def test_every_actuator_carries_out_the_script_like_the_reference(loop: str, tmp_path: Path) -> None:
    runs: dict[str, Callable[[], tuple[list[Record], bool]]] = {
        "torch": torch_loop,
        "trl_ddp": lambda: trl_ddp_loop(tmp_path),
    }
    records, stopped = runs[loop]()
    expected = reference()
    assert expected[0]["lrs"] == [LR] and expected[-1]["lrs"] == [LR, LR * 0.5, LR]  # the reference is not vacuous
    assert_same(records, expected)
    assert stopped


def verl_driver(tmp_path: Path) -> tuple[Any, Any]:
    """verl's driver on the stand-in trainer of ``test_verl_guard.py`` (verl's stock workers), guarded by the
    script; with the KL loss and an entropy coefficient, so that ``beta`` and ``entropy_coef`` reach verl."""
    pytest.importorskip("verl")
    from rlguard.adapters.verl import VerlGuardDriver
    from tests.helpers.verl_stand_in import FakeTrainer, trainer_config

    config = trainer_config(tmp_path)
    config.actor_rollout_ref.actor.use_kl_loss = True
    config.actor_rollout_ref.actor.kl_loss_coef = 0.04
    config.actor_rollout_ref.actor.entropy_coeff = 0.001
    trainer = FakeTrainer(config, [])
    return VerlGuardDriver(trainer, ScriptedGuard({d.step: d for d in SCRIPT})), trainer


def verl_step(driver: Any, trainer: Any, decision: Decision) -> dict[str, float]:
    """The driver judges ``decision``'s step after its update, as verl's ``fit`` logs it; returns what it logs."""
    trainer.global_steps = decision.step
    trainer.actor_rollout_wg.version = decision.step
    return driver.on_log({"training/global_step": decision.step}, decision.step)  # type: ignore[no-any-return]


def test_verl_driver_carries_out_the_script_within_its_declared_capabilities(tmp_path: Path) -> None:
    """verl's driver with verl's stock workers: no drop_update and no lr_scale (declared); snapshot is a verl
    checkpoint, rollback loads the newest one at or before ``rollback_to``, halt ends fit; the controls reach the
    workers' config."""
    driver, trainer = verl_driver(tmp_path)
    # rollout_correction: verl's algorithm.rollout_correction, set by the driver (verl's yaml returns the engine's
    # log-probs; tests/adapters/verl/test_rollout_correction.py); not rollout_mask (verl has no exact geometric mask)
    assert driver.capabilities == CAPABILITIES - {
        "drop_update",
        "lr_scale",
        "update_ratio",
        "rollout_mask",
        "off_policy_mask",
        "staleness_bound",  # the synchronous trainer has no asynchronous pipeline to bound
        "drop_stale",
    }
    applied = []
    for d in SCRIPT:
        verl_step(driver, trainer, d)
        applied.append(driver.halted is not None)
        sent = trainer.actor_rollout_wg.loss_fns[-1].keywords["config"] if trainer.actor_rollout_wg.loss_fns else None
        if d.step == 2:
            assert sent is not None and sent.policy_loss.controls["clip_scale"] == 0.5
        if d.step == 4:
            sent_controls = sent.policy_loss.controls if sent is not None else {}
            assert (sent_controls["clip_scale"], sent_controls["clip_high_scale"]) == (1.0, 2.0)
            assert (sent.kl_loss_coef, sent.entropy_coeff) == (0.01, 0.02)  # type: ignore[union-attr]
        if d.step == 5:  # back to step 1's checkpoint
            assert trainer.actor_rollout_wg.version == 1
            assert (sent.kl_loss_coef, sent.entropy_coeff) == (0.04, 0.001)  # type: ignore[union-attr]
    assert applied == [False] * 5 + [True]


def test_trl_and_verl_log_the_script_under_the_same_keys(tmp_path: Path) -> None:
    """Both adapters log a decision through ``tracker_metrics``: the same keys at every step of the script, the
    same values, but where the actuator carried out less than decided (verl judges a step after its update, so
    its skip is recorded only: ``skipped`` 0, and ``action`` says what was decided)."""
    pytest.importorskip("trl")
    trl: list[dict[str, float]] = []
    trl_ddp_loop(tmp_path / "trl", trl)
    driver, trainer = verl_driver(tmp_path / "verl")
    verl = [verl_step(driver, trainer, d) for d in SCRIPT]
    assert [sorted(record) for record in trl] == [sorted(record) for record in verl]
    assert [record["rlguard/guard/action"] for record in trl] == [0.0, 2.0, 3.0, 0.0, 4.0, 5.0]
    assert [record["rlguard/guard/skipped"] for record in trl] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert [record["rlguard/guard/skipped"] for record in verl] == [0.0] * 6
    assert [record["rlguard/guard/halted"] for record in verl] == [0.0] * 5 + [1.0]
    assert trl[4]["rlguard/guard/rollback_to"] == 1.0 and trl[2]["rlguard/event/nonfinite"] == 2.0
    assert [record.get("rlguard/guard/rollback_to") for record in verl] == [None] * 4 + [1.0, None]
    for step, (t, v) in enumerate(zip(trl, verl, strict=True), start=1):
        assert {**t, "rlguard/guard/skipped": 0.0} == v, step


def test_the_executor_calls_only_what_an_actuator_declares() -> None:
    calls: list[str] = []

    class Recording:
        capabilities = frozenset({"snapshot", "clip"})

        def __getattr__(self, name: str) -> Callable[..., Any]:
            def method(*args: Any) -> Any:
                calls.append(name)
                return False

            return method

    decision = Decision(3, "skip", Controls(lr_scale=0.5, clip_scale=0.5, beta=0.1), snapshot=True)
    applied = apply_decision(decision, Recording())
    assert calls == ["snapshot", "apply_update", "set_controls"]
    assert applied.outcome == "skip" and set(applied.record_only) == {"lr_scale", "drop_update", "beta"}
    rollback = apply_decision(Decision(4, "rollback"), Recording())
    assert rollback.outcome == "halt" and {"restore", "stop"} <= set(rollback.record_only)  # cannot restore: halt


def test_a_schedule_the_actuator_cannot_carry_out_is_refused_at_start_up() -> None:
    from rlguard.guards import Constant

    config = GuardConfig(schedules={"beta": Constant(0.01)})
    with pytest.raises(ValueError, match=r"schedules \['beta'\] cannot be carried out by the test loop"):
        check_capabilities(config, {"clip", "lr_scale"}, where="the test loop")
    assert check_capabilities(config, CAPABILITIES, where="x") == frozenset()


def test_an_intervention_the_actuator_cannot_carry_out_is_recorded_as_record_only() -> None:
    model, optimizer = make_model()

    class NoSkip(TorchActuator):
        @property
        def capabilities(self) -> frozenset[str]:
            return super().capabilities - {"drop_update"}

    guard = Guard(GuardConfig.preset("default"))
    bind_guard(guard, NoSkip(model, optimizer), where="a loop that cannot skip")
    decision = guard.observe(1, {"nonfinite": 3.0, "loss": 0.1})
    assert decision_action(decision) == "skip_step"
    (event,) = [e for e in decision.events if e.detector == "action:skip_step"]
    assert event.message.endswith("[record-only: a loop that cannot skip cannot drop_update]")


def test_an_lr_backoff_that_loses_to_a_skip_still_has_its_event() -> None:
    """Controls apply whatever the outcome, so the LR halving that a skip outranks is an event too."""
    interventions: dict[str, dict[str, Any] | None] = {
        "skip_step": {"on": ("nonfinite",)},
        "lr_backoff": {"on": ("nonfinite",), "severity": "critical"},
    }
    guard = Guard(GuardConfig.preset("default", interventions=interventions))
    decision = guard.observe(1, {"nonfinite": 1.0, "loss": 0.1})
    assert decision_action(decision) == "skip_step" and decision.controls.lr_scale == 0.5
    backoff = [e for e in decision.events if e.detector == "action:scale_lr"]
    assert len(backoff) == 1 and backoff[0].value == 0.5 and "with skip_step" in backoff[0].message


def test_objective_with_controls_scales_the_configured_or_scheduled_range() -> None:
    base = get_objective("dapo")  # clip (0.2, 0.28)
    tightened = base.with_controls(Controls(clip_scale=0.5, clip_high_scale=2.0))
    assert (tightened.clip_low, tightened.clip_high) == pytest.approx((0.1, 0.28))  # type: ignore[attr-defined]
    scheduled = base.with_controls(Controls(clip_high=0.3))
    assert (scheduled.clip_low, scheduled.clip_high) == (0.2, 0.3)  # type: ignore[attr-defined]
    assert base.with_controls(Controls()) is base
    with pytest.raises(ValueError, match="configured with beta=0"):
        base.with_controls(Controls(beta=0.01))


def test_torch_actuator_measures_the_relative_update_size() -> None:
    model, optimizer = make_model()
    actuator = TorchActuator(model, optimizer, measure_update=True)
    before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    backward(model, 1)
    apply_decision(Decision(1), actuator)
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    expected = float(torch.linalg.vector_norm(after - before) / torch.linalg.vector_norm(before))
    assert "update_ratio" in actuator.capabilities
    assert actuator.take_update_ratio() == pytest.approx(expected, rel=1e-12) and expected > 0
    assert actuator.take_update_ratio() is None  # taken once


def test_the_trl_callback_reports_the_last_update_size_in_the_next_steps_stats(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from rlguard.adapters.trl import GuardedGRPOTrainer, StabilityCallback

    model, optimizer = make_model()
    guard = ScriptedGuard({})
    seen: list[dict[str, float]] = []
    observe = guard.observe
    guard.observe = lambda step, stats: (seen.append(dict(stats)), observe(step, stats))[1]  # type: ignore[method-assign,func-returns-value]
    callback = StabilityCallback(guard=guard, measure_update=True)
    callback.attach(trainer_stand_in(GuardedGRPOTrainer)())
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", max_grad_norm=0.0, logging_steps=1
    )
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control, model=model, optimizer=optimizer)
    sizes = []
    for step in (1, 2):
        backward(model, step)
        before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
        kw: dict[str, Any] = {"model": model, "optimizer": optimizer, "lr_scheduler": None}
        callback.on_pre_optimizer_step(args, state, control, **kw)
        optimizer.step()
        callback.on_optimizer_step(args, state, control, **kw)
        after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        sizes.append(float(torch.linalg.vector_norm(after - before) / torch.linalg.vector_norm(before)))
        model.zero_grad()
        state.global_step += 1
    assert "update_ratio" not in seen[0]  # nothing measured before the first update
    assert seen[1]["update_ratio"] == pytest.approx(sizes[0], rel=1e-12) and sizes[0] > 0
