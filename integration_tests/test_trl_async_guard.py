"""The guard in TRL's ``AsyncGRPOTrainer`` on CPU, end to end: a tiny Llama trained against the CPU stand-in server
(``rlguard.adapters.trl.async_stand_in``, a subprocess), faults injected at chosen steps (``trl_async_run.py``).

One run of 9 optimizer steps: an LR back-off (the gradient scaled to 10x a steady norm at step 6, after the
spike detector's baseline of 5 steps), two skips (NaN log-probs at steps 7 and 8), then a rollback (two skips in a
row) whose restored weights the server holds at the end of that step, and the discarded policy's queued samples
dropped. From its checkpoint-9 a new trainer resumes: two more poisoned steps, and the rollback budget of 1, spent
before the resume, makes the guard halt at step 12; the rollout worker is stopped. The checkpoint's guard state is
given a staleness bound of 1 (as ``staleness_remedy`` would hold it): the resumed trainer takes every sample under it,
through TRL's own ``max_staleness`` check. 46 s to 93 s measured on two
shared CPU cores, by their load (two rollout-worker start-ups of about 20 s each).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from trl_async_run import GradSpike, ServerWeightsProbe, build, same_weights, stand_in_server
from trl_guard_faults import guard_config

from rlguard.adapters.trl import GUARD_STATE_FILE, StabilityCallback
from rlguard.adapters.trl.async_queue import DROPPED_DISCARDED_KEY
from rlguard.adapters.trl.async_trainer import STALENESS_BOUND_KEY, GuardedAsyncGRPOConfig
from rlguard.guards.decision import decision_action
from rlguard.metrics import STALENESS_BUCKETS
from rlguard.tasks.hf import cpu_training_arguments, save_tiny_llama

pytestmark = [pytest.mark.slow]

BUCKETS = [name for name, _, _ in STALENESS_BUCKETS]

RUN: dict[str, Any] = {
    **cpu_training_arguments(),
    "token_budget": 0,  # fixed-count micro-batches: the stand-in's max_model_len is not asked for
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 4,
    "learning_rate": 1e-3,
    "max_grad_norm": 0.0,
    "logging_steps": 1,
    "save_strategy": "steps",
    "save_steps": 9,
    "weight_sync_steps": 2,  # TRL publishes after even steps only: the rollback's push at step 6 is the guard's
    "disable_tqdm": True,
    "seed": 0,
    "request_timeout": 60,
}


def callback_of(trainer: Any) -> StabilityCallback:
    return next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, StabilityCallback))


def actions(trainer: Any) -> list[tuple[int, str]]:
    return [(d.step, a) for d in callback_of(trainer).decisions if (a := decision_action(d)) != "continue"]


def test_async_guard_backoff_skip_rollback_resume_halt(tmp_path: Path) -> None:
    model_dir = save_tiny_llama(tmp_path / "model")
    # the clip controller's answers to stale samples depend on the server's timing: off, so that each decision here
    # has one cause (the objective's clip controls are checked in tests/adapters/trl/test_async_trainer.py)
    rollback = {"max_consecutive_skips": 2, "max_rollbacks": 1}
    # staleness_remedy reads the gap by age the loss logs, but is kept from acting here (no correction, no
    # escalation: when it diagnoses depends on the server's timing), so that each decision has one cause; its state
    # is set before the resume, to check that the bound it holds is in force from the resumed run's first sample
    held = {"remedies": ("lower_bound", "drop_stale"), "escalate_on": ()}
    guard = guard_config(interventions={"rollback": rollback, "clip_controller": None, "staleness_remedy": held})
    out = tmp_path / "out"
    with stand_in_server(model_dir) as url:
        args = GuardedAsyncGRPOConfig(output_dir=str(out), vllm_server_base_url=url, guard=guard, max_steps=9, **RUN)
        first = build(model_dir, url, args, poison_at={7, 8}, callbacks=[GradSpike(6)])
        probe = ServerWeightsProbe(first, url, tmp_path)
        first.add_callback(probe)
        first.train()

        assert actions(first) == [(6, "scale_lr"), (7, "skip_step"), (8, "skip_step"), (9, "rollback")]
        logs = {int(r["step"]): r for r in first.state.log_history if "loss" in r}
        assert [logs[s]["rlguard/guard/lr_scale"] for s in (5, 6, 9)] == [1.0, 0.5, 0.5]
        assert logs[9]["rlguard/guard/rollback_to"] == 5  # the last snapshot of a healthy step
        # restored: the weights before step 5's update; the server holds them when the next batch is taken, where
        # TRL alone (weight_sync_steps=2) would still serve those of step 6 (7 and 8 were skipped)
        assert same_weights(probe.own[9], probe.own[4]) and not same_weights(probe.own[4], probe.own[8])
        assert same_weights(probe.served[9], probe.own[4])
        assert same_weights(probe.served[8], probe.own[6])
        # versions published after the snapshot (4 and 5: after steps 6 and 8) are discarded, their samples dropped
        queue = first.rlguard_queue
        assert queue is not None and queue.discarded == [(4, 5)]
        dropped = sum(r.get(DROPPED_DISCARDED_KEY, 0) for r in first.state.log_history if "loss" in r)
        assert dropped <= queue.dropped  # the count of the last step's drops is logged with the next step
        # staleness reaches the guard's stats through the metric table, as TRL logged it
        observed = {int(o["step"]): o for o in callback_of(first).observed}
        assert [observed[s]["staleness_max"] for s in logs] == [logs[s]["sample/staleness_max"] for s in logs]
        assert max(logs[s]["sample/staleness_max"] for s in logs) >= 1
        # the gap by age bucket, logged by the loss, reaches the guard with the same values (NaN where a step's
        # log-probs were poisoned); samples older than the weights they train with are seen
        gaps = {(s, name): logs[s][f"rlguard/{name}"] for s in logs for name in BUCKETS if f"rlguard/{name}" in logs[s]}
        assert {name for _, name in gaps} - {BUCKETS[0]}, gaps
        # step 1 trains on samples of the initial weights with the initial weights: the engine's numerics alone
        assert [name for s, name in gaps if s == 1] == [BUCKETS[0]] and gaps[1, BUCKETS[0]] < 1e-4, gaps
        for (s, name), gap in gaps.items():
            assert observed[s][name] == pytest.approx(gap, rel=1e-9, nan_ok=True), (s, name)
        configured = float(args.max_staleness)
        assert {logs[s][STALENESS_BOUND_KEY] for s in logs} == {configured}  # not lowered: no escalation
        assert {observed[s]["staleness_bound"] for s in logs} == {configured}
        assert first.rollout_worker._process is None  # stopped by TRL's own finally
        saved = json.loads((out / "checkpoint-9" / GUARD_STATE_FILE).read_text())
        assert saved["last_step"] == 9
        remedy = saved["interventions"]["staleness_remedy"]
        remedy.update(_s_stale_step=8, _s_last_switch=8, _s_configured_bound=int(configured), _s_bound=1)
        (out / "checkpoint-9" / GUARD_STATE_FILE).write_text(json.dumps(saved))

        args = GuardedAsyncGRPOConfig(output_dir=str(out), vllm_server_base_url=url, guard=guard, max_steps=20, **RUN)
        second = build(model_dir, url, args, poison_at={10, 11})
        second.train(resume_from_checkpoint=str(out / "checkpoint-9"))
    # the rollback budget of 1 was spent before the resume: two more skips in a row halt the run
    assert actions(second) == [(10, "skip_step"), (11, "skip_step"), (12, "halt")]
    assert second.state.global_step == 12 and second.rollout_worker._process is None
    resumed = {int(r["step"]): r for r in second.state.log_history if "loss" in r and r["step"] > 9}
    assert sorted(resumed) == [10, 11, 12] and {resumed[s][STALENESS_BOUND_KEY] for s in resumed} == {1.0}
    assert max(resumed[s]["sample/staleness_max"] for s in resumed) <= 1  # TRL took no older sample
    assert getattr(second._rollout_dataset, "max_staleness", None) == 1  # TRL types the slot as None
    state = second.rlguard_guard.state_dict()  # type: ignore[union-attr]
    assert [e["step"] for e in state["events"]][: len(saved["events"])] == [e["step"] for e in saved["events"]]
