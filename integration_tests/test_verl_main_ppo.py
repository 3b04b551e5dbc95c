"""Stock ``python -m verl.trainer.main_ppo`` with Ray on CPU (rlguard.verl_cpu): GRPO with
``loss_mode=rlguard.gspo`` trains 3 steps on the tiny example, with the V1 trainer (verl's default) and the legacy
trainer (``trainer.use_v1=false``), and the workers' ``rlguard/*`` metrics reach verl's file logger; a plugin
objective installed through its entry point (the plugin guide's, docs/examples/plugin) trains as ``rlguard.band_pg``.

Each run starts a local Ray cluster with the driver, the task runner, one FSDP actor worker, one HF rollout replica,
an agent-loop worker and a reward worker: most of its time is process start-up and imports.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl", reason="needs verl (pip install 'rlguard[verl]')")
pytest.importorskip("transfer_queue", reason="needs TransferQueue (pip install 'rlguard[verl]')")

from verl_main_ppo_guards import LR_SCALE, NARROW, WIDE
from verl_main_ppo_run import Run, checkpoint_state, launch  # pytest puts this folder on sys.path

from rlguard.guards.decision import LOGGED_ACTIONS
from rlguard.guards.events import read_events
from rlguard.guards.state import GUARD_STATE_FILE
from rlguard.verl_cpu.example import write_example
from tests.helpers.plugin_install import BAND_PG_SOURCE, install_plugin

pytestmark = pytest.mark.slow

GSPO = [
    "trainer.total_training_steps=3",
    "actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 2 optimizer steps per step: the 2nd is off-policy
    "actor_rollout_ref.actor.clip_ratio_low=3e-4",
    "actor_rollout_ref.actor.clip_ratio_high=4e-4",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_example(tmp_path_factory.mktemp("verl_example"))


def check_trained(run: Run) -> None:
    assert run.returncode == 0, run.log[-8000:]
    steps = run.steps()
    assert [s["training/global_step"] for s in steps] == [1, 2, 3], run.log[-4000:]
    for s in steps:
        # rlguard's objective ran in the worker: its canonical metrics arrive as actor/rlguard/<name>
        assert {"actor/rlguard/seq_ratio_max", "actor/rlguard/clip_frac", "actor/rlguard/kl_old"} <= set(s)
        assert math.isfinite(s["actor/pg_loss"]) and math.isfinite(s["actor/grad_norm"])
        # the rollout samples from the weights being trained: verl's trainer-vs-rollout gap stays at float32
        # round-off (without the weight push the tiny model's gap reaches ~0.2 in 3 steps)
        assert s["training/rollout_probs_diff_max"] < 1e-4
    assert max(s["actor/grad_norm"] for s in steps) > 0  # rewards varied within some group: the policy moved
    # the second mini-batch of a step is off-policy: GSPO's sequence ratio moves off 1 and its clip acts
    assert max(s["actor/rlguard/seq_ratio_max"] for s in steps) > 1.0
    assert max(s["actor/pg_clipfrac"] for s in steps) > 0.0
    print(f"wall {run.wall_s:.0f} s; step times {[round(s['timing_s/step'], 1) for s in steps]} s")


def test_stock_main_ppo_v1_trains_with_rlguard_gspo(example: Path, tmp_path: Path) -> None:
    check_trained(launch(example, tmp_path, GSPO))


def test_stock_main_ppo_legacy_trainer(example: Path, tmp_path: Path) -> None:
    check_trained(launch(example, tmp_path, [*GSPO, "trainer.use_v1=false"]))


def _plugin_env(folder: Path) -> dict[str, str]:
    """The environment of a run with the plugin guide's objective installed as a distribution with an rlguard entry
    point (tests/helpers/plugin_install.py): every process verl starts loads it through rlguard's plugin manager."""
    return install_plugin(folder, "rlguard_band_pg", BAND_PG_SOURCE)


def test_stock_main_ppo_trains_a_plugin_objective(example: Path, tmp_path: Path) -> None:
    """verl registers the plugin's objective in every process (its loss runs in the actor worker) from the plugin's
    own declaration: the band is verl's clip_ratio_low/high, so the off-policy second mini-batch clips."""
    band = [o.replace("rlguard.gspo", "rlguard.band_pg") for o in GSPO if "total_training_steps" not in o]
    run = launch(example, tmp_path, ["trainer.total_training_steps=2", *band], env=_plugin_env(tmp_path / "plugin"))
    assert run.returncode == 0, run.log[-8000:]
    steps = run.steps()
    assert [s["training/global_step"] for s in steps] == [1, 2], run.log[-4000:]
    for s in steps:
        assert {"actor/rlguard/clip_frac", "actor/rlguard/kl_old"} <= set(s)
        assert math.isfinite(s["actor/pg_loss"]) and math.isfinite(s["actor/grad_norm"])
    assert max(s["actor/pg_clipfrac"] for s in steps) > 0.0  # the band (1 - 3e-4, 1 + 4e-4) binds off-policy
    print(f"wall {run.wall_s:.0f} s")


# -- the guarded trainers through the real driver: python -m rlguard.adapters.verl.main_ppo -----------------------

GUARDED_ENTRY = "rlguard.adapters.verl.main_ppo"
GUARDED = [
    "trainer.total_training_steps=6",
    "trainer.save_freq=-1",  # checkpoints only when the guard asks for a snapshot (one per healthy step here)
    "actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo",
    "actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    f"actor_rollout_ref.actor.clip_ratio_low={WIDE[0]}",
    f"actor_rollout_ref.actor.clip_ratio_high={WIDE[1]}",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    "+trainer.rlguard_guard=verl_main_ppo_guards:scripted_guard",
]


def check_guarded_run(run: Run, out: Path) -> None:
    """What the scripted guard (integration_tests/verl_main_ppo_guards.py) must have made verl do."""
    assert run.returncode == 0, run.log[-8000:]  # the halt ends fit cleanly: verl's runner returns
    steps = run.steps()
    # the guard saw every step, once; it halted at step 4 of 6
    assert [s["training/global_step"] for s in steps] == [1, 2, 3, 4], run.log[-4000:]
    codes = [float(LOGGED_ACTIONS.index(a)) for a in ("continue", "continue", "rollback", "halt")]
    assert [s["rlguard/guard/action"] for s in steps] == codes
    assert [s["rlguard/guard/halted"] for s in steps] == [0.0, 0.0, 0.0, 1.0]
    # no sequence clipped within the wide range [0.01, 11] of steps 1-2
    assert [s["actor/rlguard/clip_frac"] for s in steps[:2]] == [0.0, 0.0]
    # the schedule's narrowed range (1 +- 1e-6, decided at step 2) reached the workers through set_loss_fn and was
    # the range their loss used at steps 3-4, as the workers themselves report it (whether a sequence then counts
    # as clipped depends on the sampled advantages: a mini-batch whose groups all have zero advantage clips none)
    used = [(s["actor/rlguard/guard/clip_low"], s["actor/rlguard/guard/clip_high"]) for s in steps]
    assert used == [pytest.approx(WIDE)] * 2 + [pytest.approx(NARROW)] * 2, used
    # the LR schedule's x0.5 (decided at step 2) reached the actor's optimizer through rlguard's actor worker: the LR
    # verl's worker reports after each step's scheduler step (constant schedule) halves at steps 3-4, and stays
    # halved after the rollback at step 3 loaded step 2's scheduler (saved at x1): the driver sent the scale again
    lrs = [s["actor/lr"] for s in steps]
    assert lrs[0] == lrs[1] > 0 and lrs[2:] == pytest.approx([LR_SCALE * lrs[0]] * 2, rel=1e-9), lrs
    # the rollback at step 3 restored step 2's checkpoint bit for bit (saved again as step 3's)
    checkpoints = out / "checkpoints"
    assert steps[2]["rlguard/guard/rollback_to"] == 2.0
    restored, healthy = checkpoint_state(checkpoints / "global_step_3"), checkpoint_state(checkpoints / "global_step_2")
    assert restored.keys() == healthy.keys()
    for name in healthy:
        assert len(restored[name]) == len(healthy[name]) > 0
        assert all(torch.equal(a, b) for a, b in zip(restored[name], healthy[name], strict=True)), name
    assert not all(
        torch.equal(a, b)
        for a, b in zip(
            checkpoint_state(checkpoints / "global_step_1")["model_world_size_1_rank_0.pt"],
            healthy["model_world_size_1_rank_0.pt"],
            strict=True,
        )
    )  # the weights did move between healthy steps: the comparison above can fail
    # ... and the rollout sampled step 4 from the restored weights (trainer vs rollout log-probs agree)
    assert steps[3]["training/rollout_probs_diff_max"] < 1e-4
    # verl ran its synchronous trainer: no TransferQueue state in the checkpoints (asynchronous modes save one)
    assert not (checkpoints / "global_step_2" / "transfer_queue").exists()
    assert (checkpoints / "global_step_3" / GUARD_STATE_FILE).is_file()


def test_guarded_v1_trainer_through_the_real_driver_and_resume(example: Path, tmp_path: Path) -> None:
    first = launch(example, tmp_path, GUARDED, entry=GUARDED_ENTRY, name="first")
    check_guarded_run(first, tmp_path)
    events = tmp_path / "checkpoints" / "events.jsonl"
    before = [e.to_dict() for e in read_events(events).events]
    # resume (verl's trainer.resume_mode=auto) from the restored step-3 checkpoint: the guard's state comes back with
    # it. The scripted alarm at step 4 halts again because its one rollback is spent; a fresh guard would have
    # no healthy snapshot and halt for that reason instead.
    resumed = launch(example, tmp_path, GUARDED, entry=GUARDED_ENTRY, name="resumed")
    assert resumed.returncode == 0, resumed.log[-8000:]
    steps = resumed.steps()
    assert [s["training/global_step"] for s in steps] == [4]
    # the restored guard state sent its controls to the fresh workers before step 4 trained
    assert (steps[0]["actor/rlguard/guard/clip_low"], steps[0]["actor/rlguard/guard/clip_high"]) == pytest.approx(
        NARROW
    )
    # ... and the LR scale: step 3's checkpoint holds step 2's scheduler (x1); the saved guard state sent x0.5
    assert steps[0]["actor/lr"] == pytest.approx(LR_SCALE * first.steps()[0]["actor/lr"], rel=1e-9)
    assert steps[0]["rlguard/guard/action"] == LOGGED_ACTIONS.index("halt")
    assert "1 rollbacks did not help" in resumed.log, resumed.log[-4000:]
    assert GUARD_STATE_FILE in {p.name for p in (tmp_path / "checkpoints" / "global_step_3").iterdir()}
    # the events file continues the first run's up to the resumed step, and the repeated step 4 is in it once
    after = [e.to_dict() for e in read_events(events).events]
    assert [e for e in after if e["step"] <= 3] == [e for e in before if e["step"] <= 3] and before
    keys = [(e["step"], e["detector"]) for e in after]
    assert len(keys) == len(set(keys)) and any(step == 4 for step, _ in keys), after


def test_guarded_legacy_trainer_through_the_real_driver(example: Path, tmp_path: Path) -> None:
    check_guarded_run(launch(example, tmp_path, [*GUARDED, "trainer.use_v1=false"], entry=GUARDED_ENTRY), tmp_path)
