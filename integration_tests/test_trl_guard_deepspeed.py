"""The guard's decisions under DeepSpeed ZeRO-2 and ZeRO-3 through TRL and accelerate (CPU, 2 processes, gloo).

One ``torchrun --nproc_per_node=2`` launch of ``trl_guard_deepspeed_worker.py`` trains, under ZeRO-2 and then
ZeRO-3, the faults of ``trl_guard_faults.py`` in turn (a poisoned batch, an exploding gradient, a halt, an LR spike
rolled back), an LR scale, the stock trainer with the callback, and first a plain DDP run of the first steps (no
DeepSpeed) for reference. Checked: every rank takes the same actions and
ends with the same finite weights; a skipped step leaves the full weights and this rank's ZeRO optimizer state
(fp32 partitions, Adam's moments and step) bit-identical while the engine's step counter and the LR schedule
advance as without DeepSpeed; the gradient norm the guard judges (ZeRO partitions, one all-reduce) equals the
plain run's, DeepSpeed's per-parameter ``safe_get_full_grad`` and DeepSpeed's own (logged) norm, and is taken
before the engine clips; no process hangs (the launch times out and its process group is killed).

Run with ``pytest integration_tests/test_trl_guard_deepspeed.py`` (select with ``-k "fault or poison or inject or
rollback or resume or halt"``). How DeepSpeed runs on CPU here: see ``test_trl_deepspeed.py``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("deepspeed")

import test_trl_deepspeed as ds_runs  # the CPU DeepSpeed config and the launch helpers (module import: no tests)
from trl_guard_deepspeed_worker import AT, LR, PLAIN_STEPS, STEPS

from rlguard.tasks.hf import save_tiny_llama

pytestmark = [pytest.mark.slow]

WORKER = Path(__file__).with_name("trl_guard_deepspeed_worker.py")
TORCHRUN_TIMEOUT_S = 480  # the launch: about 150 s on two cores at a load average of 10
deepspeed_ops_built = ds_runs.deepspeed_ops_built


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def launch(model_dir: Path, out: Path, runs: str) -> dict[str, Any]:
    """The worker's ``runs`` on 2 processes; both ranks' results must agree."""
    for stage in (2, 3):
        for optimizer, deepspeed_optimizer in (("trainer", False), ("adamw", True)):
            config = ds_runs.deepspeed_config(stage, deepspeed_optimizer=deepspeed_optimizer)
            (out / f"zero{stage}_{optimizer}.json").write_text(json.dumps(config))
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(ds_runs.free_port()),
        str(WORKER), "--model", str(model_dir), "--out", str(out), "--configs", str(out), "--runs", runs,
    ]  # fmt: skip
    ds_runs.run_killing_group(command, TORCHRUN_TIMEOUT_S, "torchrun")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in ranks:
        for run in rank.values():
            run.pop("seconds")  # this rank's wall time
    assert ranks[0] == ranks[1]  # same decisions, same stats, same final weights on both ranks
    return dict(ranks[0])


FAULT_RUNS = ("poison", "grad", "halt", "lr")
#: one launch for both stages (one interpreter start); the stock trainer's path is the same code for both stages
RUNS = ["plain", *(f"{stage}/{name}" for stage in (2, 3) for name in (*FAULT_RUNS, "lrscale")), "2/stock", "2/resume"]


@pytest.fixture(scope="module")
def results(model_dir: Path, tmp_path_factory: pytest.TempPathFactory, deepspeed_ops_built: None) -> dict[str, Any]:
    return launch(model_dir, tmp_path_factory.mktemp("zero"), ",".join(RUNS))


@pytest.fixture(params=[2, 3], ids=["zero2", "zero3"])
def runs(request: pytest.FixtureRequest, results: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """This stage's runs by name, and the plain run."""
    stage = int(request.param)
    prefix = f"{stage}/"
    mine = {key[len(prefix) :]: run for key, run in results.items() if key.startswith(prefix)}
    return stage, {**mine, "plain": results["plain"]}


def close(a: list[float], b: list[float], rel: float) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=rel, abs_tol=1e-12) for x, y in zip(a, b, strict=True))


def test_faults_under_zero_every_rank_acts_alike(runs: tuple[int, dict[str, Any]]) -> None:
    stage, result = runs
    for name in FAULT_RUNS:
        run = result[name]
        assert run["deepspeed_enabled"] and run["zero_stage"] == stage, (name, run["engine"])
        assert run["partitioned"] is (stage == 3), name  # ZeRO-3 holds one shard of every weight per rank
        assert run["finite"], (name, run)
        assert run["wrapper_restored"] == "DeepSpeedEngineWrapper", name  # accelerate's wrapper is back
    assert result["poison"]["actions"] == [[AT, "skip_step"]], result["poison"]
    assert result["grad"]["actions"] == [[AT, "skip_step"]], result["grad"]
    assert result["halt"]["actions"] == [[AT, "skip_step"], [AT + 1, "halt"]], result["halt"]
    assert result["halt"]["steps"] == AT + 1
    assert all(result[name]["steps"] == STEPS for name in ("poison", "grad", "lr"))
    assert result["halt"]["optimizer"] == "AdamW" and result["poison"]["optimizer"] == "AdamW"
    if "stock" in result:  # trl.GRPOTrainer with StabilityCallback(guard=...) and cb.attach(trainer)
        assert result["stock"]["actions"] == [[AT, "skip_step"]] and result["stock"]["finite"], result["stock"]
        assert result["stock"]["weights_unchanged"] and result["stock"]["optimizer_state_unchanged"]


def test_poison_skip_under_zero_leaves_weights_and_optimizer_state_bit_identical(
    runs: tuple[int, dict[str, Any]],
) -> None:
    _, result = runs
    run = result["poison"]
    assert [AT, "nonfinite", "critical"] in run["events"], run["events"]
    assert run["weights_unchanged"] and run["optimizer_state_unchanged"], run
    assert run["adam_moments"] > 0  # the compared state holds Adam's moments (the Trainer's AdamW)
    # the step still counts: the engine's step counter follows the Trainer's, and the linear decay advances
    assert [engine for _, engine in run["engine_steps"]] == list(range(1, STEPS + 1)), run["engine_steps"]
    assert [step for step, _ in run["engine_steps"]] == list(range(1, STEPS + 1))
    expected = [LR * (1 - k / STEPS) for k in range(1, STEPS + 1)]  # LR of the next step, after step k
    assert close(run["lrs"], expected, 1e-9), (run["lrs"], expected)
    assert close(run["guard_lrs"], [LR * (1 - k / STEPS) for k in range(STEPS)], 1e-9), run["guard_lrs"]
    assert result["grad"]["weights_unchanged"] and result["grad"]["optimizer_state_unchanged"]
    # DeepSpeed's AdamW, whose scheduler the engine steps: skipped at AT, halted at AT + 1, schedule intact
    halt = result["halt"]
    assert halt["weights_unchanged"] and halt["optimizer_state_unchanged"] and halt["adam_moments"] > 0, halt
    assert [engine for _, engine in halt["engine_steps"]] == list(range(1, AT + 2)), halt["engine_steps"]
    assert close(halt["lrs"], expected[: AT + 1], 1e-9), (halt["lrs"], expected)


def test_inject_exploding_gradient_under_zero_guard_sees_norm_before_clipping(
    runs: tuple[int, dict[str, Any]],
) -> None:
    """The ``grad`` run clips at 1.0 in the engine (``gradient_clipping`` from ``max_grad_norm``)."""
    _, result = runs
    run = result["grad"]
    norms = run["guard_grad_norms"]
    assert norms[AT - 1] > 1e5 and all(1.0 < n < 100 for i, n in enumerate(norms) if i != AT - 1), norms
    # a lone spike: the live consequence rule skips the step and records the detector's finding as a warning
    assert [AT, "grad_norm_spike", "warn"] in run["events"], run["events"]
    assert [AT, "action:skip_step", "critical"] in run["events"], run["events"]
    assert run["weight_abs_max"] <= 1.2 * result["poison"]["weight_abs_max"], run


def test_fault_runs_grad_norm_under_zero_equals_plain_and_deepspeed_norms(runs: tuple[int, dict[str, Any]]) -> None:
    _, result = runs
    plain, poison = result["plain"], result["poison"]
    assert not plain["deepspeed_enabled"] and plain["engine"] == "DistributedDataParallel", plain
    # the same first steps without DeepSpeed: the same gradients, reduced in another order
    assert close(poison["guard_grad_norms"][:PLAIN_STEPS], plain["guard_grad_norms"], 1e-6), (poison, plain)
    for name in FAULT_RUNS:
        run = result[name]
        # DeepSpeed's public per-parameter full gradients (float64 here) and its own norm, logged by the Trainer
        assert close(run["guard_grad_norms"], run["full_grad_norms"], 1e-6), (name, run)
        assert close(run["guard_grad_norms"], run["logged_grad_norms"], 1e-6), (name, run)


def test_inject_lr_spike_under_zero_is_rolled_back(runs: tuple[int, dict[str, Any]]) -> None:
    """Same run and step as the DDP test: the strict preset rolls back to the engine checkpoint of step 4."""
    _, result = runs
    run, clean = result["lr"], result["poison"]
    assert run["actions"] == [[6, "rollback"]], run["actions"]
    assert [6, "entropy_collapse", "critical"] in run["events"], run["events"]
    assert min(run["entropy"]) < 0.1 * clean["entropy"][0], run["entropy"]  # the spike did collapse the policy
    assert run["entropy"][-1] >= 0.8 * clean["entropy"][-1], (run["entropy"], clean["entropy"])
    assert run["weight_abs_max"] <= 1.2 * clean["weight_abs_max"], (run, clean)


def test_inject_lr_scale_under_zero_applies_to_one_step_only(runs: tuple[int, dict[str, Any]]) -> None:
    """A guard whose ``lr_scale`` is 0 every step: plain SGD moves no weight, and the scheduler's LR stays put
    (the scale is applied inside the engine's optimizer step and undone before the scheduler steps)."""
    _, result = runs
    run = result["lrscale"]
    assert run["lr_scales"] == [0.0, 0.0] and run["actions"] == [], run
    assert run["optimizer"] == "SGD" and not run["weights_moved"], run
    assert result["grad"]["weights_moved"]  # SGD does move them at the unscaled LR
    assert run["guard_lrs"] == [LR, LR] and run["lrs"] == [LR, LR], run  # never compounded


def test_resume_after_kill_under_zero2_keeps_guard_baselines_and_events(results: dict[str, Any]) -> None:
    """Guard state rides with the Trainer's DeepSpeed checkpoint (the same code for every stage)."""
    run = results["2/resume"]
    assert run["killed"] and run["saved_last_step"] == 5 and run["saved_event_steps"] == [AT, AT], run
    assert run["event_steps"] == [AT, AT] and run["seen_nonfinite"] == STEPS, run  # 5 steps before, 2 after
    assert run["decision_steps"] == [6, STEPS] and run["steps"] == STEPS and run["finite"], run
    assert run["engine_global_steps"] == STEPS, run  # the engine resumed its counter with the checkpoint
