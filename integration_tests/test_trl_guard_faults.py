"""Faults injected into real TRL runs (tiny Llama, CPU): the guarded run skips or rolls back and stays healthy,
the same run without the guard ends with non-finite or ruined weights; guard state survives a kill and resume;
under ``torchrun --nproc_per_node=2`` (gloo) every rank takes the same action and no process hangs.

Run with ``pytest integration_tests/test_trl_guard_faults.py`` (select with ``-k "fault or poison or inject or
rollback or resume or halt"``). The faults and the short-warm-up guard are in ``trl_guard_faults.py``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from transformers import TrainerCallback
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer
from trl_guard_faults import RUN, build, guard_config, summary

from rlguard.adapters.trl import EVENTS_FILE, GUARD_STATE_FILE, GuardedGRPOConfig, GuardedGRPOTrainer, StabilityCallback
from rlguard.guards.decision import decision_action
from rlguard.guards.events import read_events
from rlguard.guards.interventions.skip_no_signal import NO_SIGNAL
from rlguard.tasks.hf import save_tiny_llama

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

AT, STEPS = 4, 8  # the fault hits optimizer step 4 of 8
WORKER = Path(__file__).with_name("trl_guard_ddp_worker.py")
TORCHRUN_TIMEOUT_S = 400


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def guarded_run(model_dir: Path, out: Path, fault: str | None, guard: Any = None, **changes: Any) -> dict[str, Any]:
    args = GuardedGRPOConfig(output_dir=str(out), guard=guard or guard_config(), max_steps=STEPS, **{**RUN, **changes})
    trainer = build(GuardedGRPOTrainer, model_dir, args, fault, AT)
    trainer.train()
    return {**summary(trainer), "events": [e.to_dict() for e in trainer.rlguard_guard.events]}  # type: ignore[union-attr]


def unguarded_run(model_dir: Path, out: Path, fault: str | None, **changes: Any) -> dict[str, Any]:
    """Stock TRL; a run that has gone non-finite crashes in generation (NaN probabilities): that ends it."""
    trainer = build(
        GRPOTrainer, model_dir, GRPOConfig(output_dir=str(out), max_steps=STEPS, **{**RUN, **changes}), fault, AT
    )
    try:
        trainer.train()
    except RuntimeError as err:
        assert "inf" in str(err) or "nan" in str(err), err
    return summary(trainer)


@pytest.fixture(scope="module")
def clean(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The guarded run without a fault: the reference reward curve; the guard never acts on it."""
    return guarded_run(model_dir, tmp_path_factory.mktemp("clean"), None)


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def assert_like_clean(run: dict[str, Any], clean: dict[str, Any]) -> None:
    assert run["finite"] and run["steps"] == STEPS, run
    assert run["rewards"][: AT - 1] == clean["rewards"][: AT - 1]  # same seed, same steps before the fault
    assert abs(mean(run["rewards"]) - mean(clean["rewards"])) <= 0.1, (run["rewards"], clean["rewards"])
    assert run["weight_abs_max"] <= 1.2 * clean["weight_abs_max"], (run, clean)


def test_clean_run_is_never_touched(clean: dict[str, Any]) -> None:
    assert clean["finite"] and clean["steps"] == STEPS
    assert clean["skipped"] == clean["rolled_back"] == clean["halted"] == [] and clean["events"] == []


def test_poison_batch_is_skipped_by_the_guard(model_dir: Path, tmp_path: Path, clean: dict[str, Any]) -> None:
    guarded = guarded_run(model_dir, tmp_path / "guarded", "poison")
    assert guarded["skipped"] == [AT], guarded
    assert {(e["step"], e["detector"]) for e in guarded["events"]} >= {(AT, "nonfinite"), (AT, "action:skip_step")}
    assert_like_clean(guarded, clean)
    events = [json.loads(line) for line in (tmp_path / "guarded" / EVENTS_FILE).read_text().splitlines()]
    assert events == guarded["events"]

    unguarded = unguarded_run(model_dir, tmp_path / "unguarded", "poison")
    assert not unguarded["finite"], unguarded


def test_inject_exploding_gradient_is_skipped(model_dir: Path, tmp_path: Path) -> None:
    sgd = {"optim": "sgd"}  # plain SGD: the 1e6 gradient reaches the weights (Adam would normalise it away)
    reference = guarded_run(model_dir, tmp_path / "clean", None, **sgd)
    guarded = guarded_run(model_dir, tmp_path / "guarded", "grad", **sgd)
    assert guarded["skipped"] == [AT], guarded
    assert guarded["finite"] and guarded["weight_abs_max"] <= 1.2 * reference["weight_abs_max"], (guarded, reference)
    unguarded = unguarded_run(model_dir, tmp_path / "unguarded", "grad", **sgd)
    assert not unguarded["finite"] or unguarded["weight_abs_max"] > 100 * reference["weight_abs_max"], unguarded


def test_inject_lr_spike_is_rolled_back(model_dir: Path, tmp_path: Path, clean: dict[str, Any]) -> None:
    """A x1000 LR at step 4 collapses the policy's entropy; the strict preset rolls back to the last snapshot."""
    guarded = guarded_run(model_dir, tmp_path / "guarded", "lr", guard=guard_config("strict"))
    assert len(guarded["rolled_back"]) == 1 and guarded["rolled_back"][0] > AT, guarded
    assert any(e["detector"] == "entropy_collapse" and e["severity"] == "critical" for e in guarded["events"])
    assert guarded["finite"] and guarded["weight_abs_max"] <= 1.2 * clean["weight_abs_max"], (guarded, clean)
    assert guarded["entropy"][-1] >= 0.8 * clean["entropy"][-1], (guarded["entropy"], clean["entropy"])

    unguarded = unguarded_run(model_dir, tmp_path / "unguarded", "lr")
    assert unguarded["weight_abs_max"] >= 1.5 * clean["weight_abs_max"], (unguarded, clean)
    assert unguarded["entropy"][-1] <= 0.5 * clean["entropy"][-1], (unguarded["entropy"], clean["entropy"])


class _Kill(TrainerCallback):
    """Raises after optimizer step ``at`` (the checkpoint of step ``at - 1`` is on disk): a killed run."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.at:
            raise KeyboardInterrupt("killed")


def test_resume_after_kill_keeps_guard_baselines_and_events(model_dir: Path, tmp_path: Path) -> None:
    changes = {"save_strategy": "steps", "save_steps": 5}
    args = GuardedGRPOConfig(output_dir=str(tmp_path), guard=guard_config(), max_steps=STEPS, **{**RUN, **changes})
    first = build(GuardedGRPOTrainer, model_dir, args, "poison", AT, callbacks=[_Kill(6)])
    with pytest.raises(KeyboardInterrupt):
        first.train()
    saved = json.loads((tmp_path / "checkpoint-5" / GUARD_STATE_FILE).read_text())
    assert saved["last_step"] == 5 and [e["step"] for e in saved["events"]] == [AT, AT]

    second = build(GuardedGRPOTrainer, model_dir, args, None, AT)  # a new process: a fresh guard
    second.train(resume_from_checkpoint=True)
    guard = second.rlguard_guard
    assert guard is not None
    state = guard.state_dict()
    assert [e["step"] for e in state["events"]] == [AT, AT], state["events"]  # events from before the kill
    assert state["seen"]["nonfinite"] == STEPS  # baselines continue: 5 steps before the kill, 3 after
    # the events file continues the first run's: each event once, none from a repeated stretch
    assert [e.to_dict() for e in read_events(tmp_path / "events.jsonl").events] == state["events"]
    window = saved["detectors"]["grad_norm_spike"]["_s_window"]
    assert state["detectors"]["grad_norm_spike"]["_s_window"][: len(window)] == window
    callback = next(cb for cb in second.callback_handler.callbacks if isinstance(cb, StabilityCallback))
    assert [d.step for d in callback.decisions] == [6, 7, 8]
    assert summary(second)["finite"]


def test_halt_when_rollback_is_not_allowed(model_dir: Path, tmp_path: Path) -> None:
    """Skip at the poisoned step; the next step sees a skip in a row, may not roll back, so it halts."""
    config = guard_config(interventions={"rollback": {"max_consecutive_skips": 1, "max_rollbacks": 0}})
    run = guarded_run(model_dir, tmp_path, "poison", guard=config)
    assert run["skipped"] == [AT] and run["halted"] == [AT + 1] and run["steps"] == AT + 1, run
    assert run["finite"]


def test_poison_on_a_stock_trainer_with_the_callback(model_dir: Path, tmp_path: Path) -> None:
    callback = StabilityCallback(guard=guard_config())
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=STEPS - 2, **RUN)
    trainer = build(GRPOTrainer, model_dir, args, "poison", AT, callbacks=[callback])
    callback.attach(trainer)
    trainer.train()
    actions = [(d.step, a) for d in callback.decisions if (a := decision_action(d)) != "continue"]
    assert actions == [(AT, "skip_step")]
    assert summary(trainer)["finite"]
    stats = {"reward_mean", "length_mean", "entropy", "grad_norm", "lr"}
    assert stats <= set(callback.history[0]), callback.history[0]
    assert args.max_grad_norm == RUN["max_grad_norm"]  # restored after training


def test_a_batch_without_signal_is_skipped_on_a_stock_trainer(model_dir: Path, tmp_path: Path) -> None:
    """``skip_no_signal`` end to end: the steps whose every group has all-equal rewards (TRL's
    ``frac_reward_zero_std`` 1) are skipped, no other step is, and no rollback follows however many there are."""
    callback = StabilityCallback(guard=guard_config(no_signal_skips=True))
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=STEPS - 2, **RUN)
    trainer = build(GRPOTrainer, model_dir, args, None, AT, callbacks=[callback])
    callback.attach(trainer)
    trainer.train()
    rows = [r for r in trainer.state.log_history if "frac_reward_zero_std" in r]
    without = [int(r["step"]) for r in rows if float(r["frac_reward_zero_std"]) >= 1.0]
    assert without, "no step without signal: the test needs one (another seed or fewer generations)"
    skipped = [d.step for d in callback.decisions if d.outcome == "skip"]
    assert skipped == without and all(d.reason.startswith(NO_SIGNAL) for d in callback.decisions if d.outcome == "skip")
    assert not [d for d in callback.decisions if d.outcome in ("rollback", "halt")]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_faults_under_torchrun_ddp_every_rank_acts_alike(model_dir: Path, tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(WORKER), "--model", str(model_dir), "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish within {TORCHRUN_TIMEOUT_S} s (a rank hung?):\n{exc.stderr!s}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]  # same decisions, same weights, on both ranks
    runs = ranks[0]
    assert runs["poison"]["actions"] == [[AT, "skip_step"]] and runs["poison"]["finite"], runs["poison"]
    assert [AT, "skip_step"] in runs["grad"]["actions"] and runs["grad"]["finite"], runs["grad"]
    assert runs["halt"]["actions"][-1] == [AT + 1, "halt"] and runs["halt"]["steps"] == AT + 1, runs["halt"]
    assert [a for a in runs["lr"]["actions"] if a[1] == "rollback"][:1] == [[6, "rollback"]], runs["lr"]
    assert all(r["finite"] and math.isfinite(float(r["weights_checksum"])) for r in runs.values())
