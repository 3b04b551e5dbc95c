"""verl's asynchronous trainers guarded, with Ray on CPU, the rollout in its own resource pool fed through the CPU
checkpoint engine (rlguard.verl_cpu.checkpoint_engine), ``loss_mode=rlguard.gspo`` in the workers.

- One-step-off: ``python -m rlguard.adapters.verl.async_one_step_off`` (verl's ``OneStepTaskRunner`` training the
  guarded ``OneStepOffRayTrainer``). The scripted guard (verl_async_guards.py) forces, in sequence: a skip (step 2),
  the clip range narrowed and the LR halved (decided at step 2, in force from step 3), a rollback (step 3, to step
  1's snapshot) whose restored weights reach the rollout before the next batch is generated, a halt (step 4); then
  a resume from the rollback's checkpoint keeps the guard. Two launches, each mostly Ray start-up and imports: 315 s
  + 183 s wall on 2 CPU cores at a load average of about 14 from other jobs, 145 s + 143 s in a second run.
- Fully async: ``python -m rlguard.adapters.verl.fully_async_main`` (verl's ``FullyAsyncTaskRunner`` training the
  guarded ``FullyAsyncTrainer``): the same script at parameter versions 2, 3 and 5 (the rollback at 3 republishes
  version 1's weights as version 4), the samples of the discarded versions dropped, the halt stopping trainer and
  rollouter, a resume from version 4. Two launches: 102 s + 92 s wall at a load average of about 3, 71 s + 68 s
  in a second run.
- verl's own fully async trainer (unguarded) trains ``rlguard.gspo`` through the same CPU checkpoint engine (one
  launch, 266-326 s wall at a load average of about 14).

docs/guides/verl.md, "Asynchronous training", shows what they log.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="needs verl (pip install 'rlguard[verl]')")

from verl_async_guards import LR_SCALE, NARROW, WIDE
from verl_async_run import FULLY_ASYNC, ONE_STEP_OFF
from verl_main_ppo_run import checkpoint_state, launch  # pytest puts this folder on sys.path

from rlguard.adapters.verl.async_trainers import AGE_KEYS, DROPPED_KEY, STEP_AGE_KEYS
from rlguard.adapters.verl.fully_async import BOUND_KEY, STALE_DROPPED_KEY
from rlguard.guards.decision import LOGGED_ACTIONS
from rlguard.guards.events import read_events
from rlguard.guards.state import GUARD_STATE_FILE
from rlguard.verl_cpu.example import write_example

pytestmark = pytest.mark.slow

ENTRY = "rlguard.adapters.verl.async_one_step_off"
GUARDED = [
    *ONE_STEP_OFF,
    "trainer.total_training_steps=6",
    "trainer.save_freq=-1",  # checkpoints only when the guard asks for a snapshot
    "actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo",
    "actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig",
    # one optimizer step per step: the PPO ratio's KL (actor/ppo_kl, against the rollout's log-probs in verl's
    # default bypass mode) is then the gap between the trainer's weights and the weights that generated the batch
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    f"actor_rollout_ref.actor.clip_ratio_low={WIDE[0]}",
    f"actor_rollout_ref.actor.clip_ratio_high={WIDE[1]}",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    "+trainer.rlguard_guard=verl_async_guards:scripted_async_guard",
]
GAP_PREFIX = "rlguard/mismatch_logp_abs_mean_age"
SAMPLES_PER_STEP = 16  # 4 prompts x 4 samples (rlguard.verl_cpu.example)


def _action(name: str) -> float:
    return float(LOGGED_ACTIONS.index(name))


def test_guarded_one_step_off_trainer_and_resume(tmp_path: Path) -> None:
    example = write_example(tmp_path / "example")
    first = launch(example, tmp_path, GUARDED, entry=ENTRY, name="first")
    assert first.returncode == 0, first.log[-8000:]  # the halt ends fit; verl's runner returns and shuts Ray down
    steps = first.steps()
    assert [s["training/global_step"] for s in steps] == [1, 2, 3, 4], first.log[-4000:]
    assert [s["rlguard/guard/action"] for s in steps] == [
        _action(a) for a in ("continue", "skip_step", "rollback", "halt")
    ]
    assert [s["rlguard/guard/halted"] for s in steps] == [0.0, 0.0, 0.0, 1.0]
    # rlguard's objective ran in the workers, with the clip range the guard sent (narrowed at step 2: steps 3-4)
    used = [(s["actor/rlguard/guard/clip_low"], s["actor/rlguard/guard/clip_high"]) for s in steps]
    assert used == [pytest.approx(WIDE)] * 2 + [pytest.approx(NARROW)] * 2, used
    # the LR back-off reached the actor's optimizer through rlguard's DetachActorWorker, and stayed after the
    # rollback loaded step 1's scheduler (saved at x1)
    lrs = [s["actor/lr"] for s in steps]
    assert lrs[0] == lrs[1] > 0 and lrs[2:] == pytest.approx([LR_SCALE * lrs[0]] * 2, rel=1e-9), lrs
    # the rollback at step 3 restored step 1's checkpoint bit for bit (step 2 was skipped: no snapshot there)
    checkpoints = tmp_path / "checkpoints"
    assert steps[2]["rlguard/guard/rollback_to"] == 1.0
    assert sorted(p.name for p in checkpoints.glob("global_step_*")) == ["global_step_1", "global_step_3"]
    restored, healthy = checkpoint_state(checkpoints / "global_step_3"), checkpoint_state(checkpoints / "global_step_1")
    assert restored.keys() == healthy.keys()
    for name in healthy:
        assert all(torch.equal(a, b) for a, b in zip(restored[name], healthy[name], strict=True)), name
    # one-step-off: steps 2-3 train on samples from the weights one update old, far from the trainer's ...
    kls = [s["actor/ppo_kl"] for s in steps]
    assert kls[0] < 1e-5 and min(kls[1:3]) > 1e-2, kls
    # ... and step 4 on samples from the restored weights: the batch in flight at the rollback (from step 2's
    # discarded weights) was dropped and regenerated after the rollback pushed the restored weights to the rollout
    assert kls[3] < 1e-5, kls
    assert [s[DROPPED_KEY] for s in steps] == [0.0, 0.0, 0.0, float(SAMPLES_PER_STEP)]
    # the samples' age in policy versions: on-policy at step 1 and after the drop, one update old in between
    assert [s[AGE_KEYS[0]] for s in steps] == [0.0, 1.0, 1.0, 0.0]
    # bypass mode: the gap by age bucket measured in the workers' loss (rlguard's ppo_loss wrapper, sent through
    # set_loss_fn), every row of a batch in its batch's bucket; at age 0 the samples' weights are the trainer's, so
    # the gap is the engine's numerics alone, and at age 1 it is one update's drift on top of it
    gaps = [{k.removeprefix("rlguard/"): v for k, v in s.items() if k.startswith(GAP_PREFIX)} for s in steps]
    print("gap by age bucket:", gaps)
    assert [sorted(g) for g in gaps] == [[f"mismatch_logp_abs_mean_age{a}"] for a in (0, 1, 1, 0)], gaps
    assert not any("_gap_" in k for s in steps for k in s), steps
    engine = max(gaps[0]["mismatch_logp_abs_mean_age0"], gaps[3]["mismatch_logp_abs_mean_age0"])
    assert engine < 1e-3 and min(g["mismatch_logp_abs_mean_age1"] for g in gaps[1:3]) > engine, gaps
    assert (checkpoints / "global_step_3" / GUARD_STATE_FILE).is_file()
    before = [e.to_dict() for e in read_events(checkpoints / "events.jsonl").events]

    # resume (verl's trainer.resume_mode=auto) from the rollback's step-3 checkpoint: the guard's state comes back;
    # the scripted alarm at step 4 halts again because its one rollback is spent
    resumed = launch(example, tmp_path, GUARDED, entry=ENTRY, name="resumed")
    assert resumed.returncode == 0, resumed.log[-8000:]
    steps = resumed.steps()
    assert [s["training/global_step"] for s in steps] == [4], resumed.log[-4000:]
    assert (steps[0]["actor/rlguard/guard/clip_low"], steps[0]["actor/rlguard/guard/clip_high"]) == pytest.approx(
        NARROW
    )
    assert steps[0]["actor/lr"] == pytest.approx(LR_SCALE * lrs[0], rel=1e-9)
    assert steps[0]["rlguard/guard/action"] == _action("halt")
    assert steps[0][GAP_PREFIX + "0"] < 1e-3  # the resumed workers were sent the measuring loss with the controls
    assert "1 rollbacks did not help" in resumed.log, resumed.log[-4000:]
    after = [e.to_dict() for e in read_events(checkpoints / "events.jsonl").events]
    assert [e for e in after if e["step"] <= 3] == [e for e in before if e["step"] <= 3] and before
    print(f"wall {first.wall_s:.0f} s + {resumed.wall_s:.0f} s")


FULLY_ASYNC_ENTRY = "rlguard.adapters.verl.fully_async_main"
FULLY_ASYNC_GUARDED = [
    *FULLY_ASYNC,
    "rollout.total_rollout_steps=32",  # prompts the rollouter may generate: the halt ends the run before
    "trainer.save_freq=-1",  # checkpoints only when the guard asks for a snapshot
    "actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo",
    "actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig",
    f"actor_rollout_ref.actor.clip_ratio_low={WIDE[0]}",
    f"actor_rollout_ref.actor.clip_ratio_high={WIDE[1]}",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    "+trainer.rlguard_guard=verl_async_guards:scripted_fully_async_guard",
]


def _judged(run: Any) -> list[tuple[int, dict[str, Any]]]:
    """``(parameter version, record)`` of each version the guard judged."""
    return [(r["step"], r["data"]) for r in run.records if "rlguard/guard/action" in r["data"]]


def test_guarded_fully_async_trainer_and_resume(tmp_path: Path) -> None:
    """``python -m rlguard.adapters.verl.fully_async_main``: verl's rollouter and trainer joined by its message queue,
    the guard on the trainer (one record per parameter version, one step per version here), the scripted guard of
    verl_async_guards.py: a skip (version 2), the clip range and LR halved (decided at 2), a rollback at 3 to version
    1 whose restored weights go to the rollouter as version 4, a halt at 5; then a resume from version 4."""
    example = write_example(tmp_path / "example")
    first = launch(example, tmp_path, FULLY_ASYNC_GUARDED, entry=FULLY_ASYNC_ENTRY, name="first")
    assert first.returncode == 0, first.log[-8000:]  # the halt stops trainer and rollouter; the command exits 0
    assert "the guard halted the trainer" in first.log, first.log[-4000:]
    judged = _judged(first)
    assert [v for v, _ in judged] == [1, 2, 3, 5], first.log[-4000:]  # version 4: the restored weights, republished
    steps = [data for _, data in judged]
    # the rollouter is rlguard's (Ray prefixes an actor's output with its class), which takes the staleness bound:
    # staleness_threshold 0.5 keeps samples at most 1 version old
    assert "(_GuardedFullyAsyncRollouter pid=" in first.log, first.log[-4000:]
    assert [s[BOUND_KEY] for s in steps] == [1.0] * 4 and [s[STALE_DROPPED_KEY] for s in steps] == [0.0] * 4
    assert [s["rlguard/guard/action"] for s in steps] == [
        _action(a) for a in ("continue", "skip_step", "rollback", "halt")
    ]
    assert [s["training/global_step"] for s in steps] == [1, 2, 3, 4]  # each record is its own step's
    used = [(s["actor/rlguard/guard/clip_low"], s["actor/rlguard/guard/clip_high"]) for s in steps]
    assert used == [pytest.approx(WIDE)] * 2 + [pytest.approx(NARROW)] * 2, used
    lrs = [s["actor/lr"] for s in steps]
    assert lrs[0] == lrs[1] > 0 and lrs[2:] == pytest.approx([LR_SCALE * lrs[0]] * 2, rel=1e-9), lrs
    # the rollback at version 3 restored version 1 bit for bit and saved it as version 4
    checkpoints = tmp_path / "checkpoints"
    assert steps[2]["rlguard/guard/rollback_to"] == 1.0
    assert sorted(p.name for p in checkpoints.glob("global_step_*")) == ["global_step_1", "global_step_4"]
    restored, healthy = checkpoint_state(checkpoints / "global_step_4"), checkpoint_state(checkpoints / "global_step_1")
    assert restored.keys() == healthy.keys()
    for name in healthy:
        assert all(torch.equal(a, b) for a, b in zip(restored[name], healthy[name], strict=True)), name
    # the samples queued or generated by versions 2-3 (discarded) were dropped, and version 5 trained on samples of
    # the restored weights only: their age is 0 and the PPO ratio's KL against the rollout's log-probs (verl's
    # bypass mode) is round-off, so the rollouter held the restored weights when it generated them
    dropped = [s[DROPPED_KEY] for s in steps]
    assert dropped[:3] == [0.0, 0.0, 0.0] and dropped[3] > 0 and dropped[3] % 4 == 0, dropped
    assert steps[3][AGE_KEYS[1]] == 0.0 and steps[3]["actor/ppo_kl"] < 1e-5, steps[3]
    # before the rollback the pipeline ran asynchronously: some samples were a version old
    assert max(s[AGE_KEYS[1]] for s in steps[1:3]) >= 1.0, [s[AGE_KEYS[1]] for s in steps]
    # one update per version: the ages in optimizer steps are the ages in versions
    assert [s[STEP_AGE_KEYS[1]] for s in steps] == [s[AGE_KEYS[1]] for s in steps]
    # bypass mode: the gap by age bucket measured in the workers' loss (rlguard's ppo_loss wrapper, sent through
    # set_loss_fn), logged on the trainer; at versions 1 and 5 the samples' weights are the trainer's (age 0), so the
    # gap is the engine's numerics alone, and a version-old bucket's is the drift of one update on top of it
    gaps = [{k.removeprefix("rlguard/"): v for k, v in s.items() if k.startswith(GAP_PREFIX)} for s in steps]
    print("gap by age bucket:", gaps)
    assert all(gaps) and not any("_gap_" in k for s in steps for k in s), gaps
    engine = max(gaps[0]["mismatch_logp_abs_mean_age0"], gaps[3]["mismatch_logp_abs_mean_age0"])
    assert engine < 1e-3, gaps
    older = [g["mismatch_logp_abs_mean_age1"] for g in gaps[1:3] if "mismatch_logp_abs_mean_age1" in g]
    assert older and min(older) > engine, gaps
    assert (checkpoints / "global_step_4" / GUARD_STATE_FILE).is_file()
    before = [e.to_dict() for e in read_events(checkpoints / "events.jsonl").events]

    # resume (verl's trainer.resume_mode=auto) from version 4: the guard's state comes back (clip range, LR scale,
    # the spent rollback), and the scripted alarm at version 5 halts again
    resumed = launch(example, tmp_path, FULLY_ASYNC_GUARDED, entry=FULLY_ASYNC_ENTRY, name="resumed")
    assert resumed.returncode == 0, resumed.log[-8000:]
    judged = _judged(resumed)
    assert [v for v, _ in judged] == [5], resumed.log[-4000:]
    step = judged[0][1]
    assert (step["actor/rlguard/guard/clip_low"], step["actor/rlguard/guard/clip_high"]) == pytest.approx(NARROW)
    assert step["actor/lr"] == pytest.approx(LR_SCALE * lrs[0], rel=1e-9)
    assert step["rlguard/guard/action"] == _action("halt")
    assert "1 rollbacks did not help" in resumed.log, resumed.log[-4000:]
    after = [e.to_dict() for e in read_events(checkpoints / "events.jsonl").events]
    assert [e for e in after if e["step"] <= 4] == [e for e in before if e["step"] <= 4] and before
    print(f"wall {first.wall_s:.0f} s + {resumed.wall_s:.0f} s")


def test_stock_fully_async_trainer_trains_an_rlguard_objective(tmp_path: Path) -> None:
    """verl's own ``fully_async_main`` (unguarded: docs/guides/verl.md says why) with ``loss_mode=rlguard.gspo``: the
    objective runs in the trainer's workers and the rollouter receives the trainer's weights through the CPU
    checkpoint engine (its parameter version advances)."""
    overrides = [
        *FULLY_ASYNC,
        "trainer.total_training_steps=2",
        "trainer.save_freq=-1",
        "actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo",
    ]
    run = launch(
        write_example(tmp_path / "example"),
        tmp_path,
        overrides,
        entry="verl.experimental.fully_async_policy.fully_async_main",
    )
    assert run.returncode == 0, run.log[-8000:]
    trained = [r for r in run.records if "actor/pg_loss" in r["data"]]
    assert trained, run.log[-4000:]
    for record in trained:
        step = record["data"]
        assert {"actor/rlguard/seq_ratio_max", "actor/rlguard/clip_frac", "actor/rlguard/kl_old"} <= set(step)
        assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/grad_norm"])
        assert "fully_async/count/staleness_samples" in step  # verl's staleness counters, for the metric table
    # the trainer logs at its parameter version, which advances only once a weight sync to the rollouter has
    # completed (the CPU engine's receiving side waits for the sender: a lost sync would hang, then time out)
    assert max(record["step"] for record in trained) >= 1
    print(f"wall {run.wall_s:.0f} s")
