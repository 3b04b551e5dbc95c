"""``GuardedGRPOTrainer`` under DeepSpeed ZeRO-2 and ZeRO-3 on CPU with 2 processes (``torchrun``, gloo).

Per stage, one ``torchrun --nproc_per_node=2`` launch of ``trl_deepspeed_worker.py`` trains three runs of the tiny
Llama: GSPO with a reference model (``beta > 0``, which TRL wraps in a DeepSpeed inference engine of its own) and
two passes over each batch, using DeepSpeed's AdamW; then stock ``trl.GRPOTrainer`` and ``GuardedGRPOTrainer`` with
``objective="grpo"`` under the same seed, with gradient accumulation 2 over a generation batch of 4 micro-batches
(DeepSpeed, not the Trainer, accumulates) and plain SGD (Adam's first steps are ``lr * sign(g)``, which turns
rounding noise in near-zero gradients into full-size differences; SGD keeps the update proportional to the
gradient). The two trainers must log the same losses and take the same optimizer steps; ZeRO reduces the same
gradients in the same order for both, so the updates agree to float32 rounding of the loss.

Facts these runs rely on (TRL 1.16, transformers 5, accelerate 1.15, deepspeed 0.19.8, torch 2.13 CPU):

- ``DS_ACCELERATOR=cpu``, the gloo backend and ``use_cpu=True`` with ``ddp_backend="gloo"``;
- DeepSpeed's own optimizer as ``{"type": "AdamW", "params": {"torch_adam": true}}`` (no cpu_adam build); without an
  ``optimizer`` block the Trainer builds its own (here SGD) and sets ``zero_allow_untested_optimizer``;
- no ``train_batch_size`` key in the DeepSpeed config: with ``use_cpu=True`` accelerate initialises
  ``torch.distributed`` but not ``deepspeed.comm``, so the ``zero.Init`` that ``from_pretrained`` enters under
  ZeRO-3 reads the config with a world size of 1 and fails its batch-size check against the filled-in
  ``train_batch_size`` (8 != 4 * 1 * 1); DeepSpeed derives the value itself when the key is absent;
- ``stage3_param_persistence_threshold: 0``: ZeRO-3 keeps parameters below the threshold (by default 1e5 elements,
  which is every tensor of the tiny model) whole on every rank; 0 partitions them all;
- every process that initialises ``deepspeed.comm`` loads DeepSpeed's CPU shared-memory communication op (used
  only by inference all-reduce), compiling it with the system C++ compiler on first use: about 2.5 CPU-minutes,
  cached in ``~/.cache/torch_extensions`` (``TORCH_EXTENSIONS_DIR``). A fixture builds it first, under its own
  timeout, so that the runs' timeouts only have to cover training.

Run with ``pytest integration_tests/test_trl_deepspeed.py`` (skipped where deepspeed is not installed).
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("deepspeed")

from rlguard.tasks.hf import save_tiny_llama

pytestmark = [pytest.mark.slow]

WORKER = Path(__file__).with_name("trl_deepspeed_worker.py")
# one launch per stage: about 50 s (ZeRO-2) and 90 s (ZeRO-3) on two busy cores
TORCHRUN_TIMEOUT_S = 360
BUILD_TIMEOUT_S = 600
ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}

GSPO = {
    "objective": "gspo",
    "loss_type": "grpo",
    "epsilon": 3e-4,
    "epsilon_high": 4e-4,
    "beta": 0.04,
    "num_iterations": 2,  # the second pass over a batch is off-policy: ratios leave 1, the clip acts
    "max_steps": 4,
}
GSPO_STEPS = 4
PARITY = {
    "loss_type": "grpo",
    "beta": 0.04,
    "gradient_accumulation_steps": 2,
    "steps_per_generation": 4,
    "max_steps": 3,
    "optim": "sgd",
    "learning_rate": 0.5,
    "lr_scheduler_type": "constant",
}
PARITY_STEPS = 3


def deepspeed_config(stage: int, *, deepspeed_optimizer: bool) -> dict[str, Any]:
    """A ZeRO config for CPU; ``"auto"`` values are filled in by the Trainer from its arguments."""
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero.update(
            {
                "stage3_param_persistence_threshold": 0,  # partition every tensor, small ones too
                "stage3_prefetch_bucket_size": 0,
                "reduce_bucket_size": 100_000,
            }
        )
    config: dict[str, Any] = {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        # no "train_batch_size": see the module docstring
        "gradient_clipping": "auto",
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
    }
    if deepspeed_optimizer:
        params = {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto", "torch_adam": True}
        config["optimizer"] = {"type": "AdamW", "params": params}
    return config


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama and its tokenizer, saved once; TRL loads both (and the reference model) from the folder."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def run_killing_group(command: list[str], timeout_s: float, what: str) -> str:
    """Run ``command`` in a new session; on timeout kill its whole process group (torchrun and both ranks)."""
    proc = subprocess.Popen(
        command,
        env={**os.environ, **ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{what} did not finish within {timeout_s} s:\n{stdout[-3000:]}\n{stderr[-6000:]}")
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{stdout[-3000:]}\n{stderr[-6000:]}"
    return stdout


@pytest.fixture(scope="module")
def deepspeed_ops_built() -> None:
    """DeepSpeed's shared-memory op, built (or found in the cache) exactly as ``deepspeed.comm`` does it."""
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    run_killing_group([sys.executable, "-c", code], BUILD_TIMEOUT_S, "building DeepSpeed's shared-memory op")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(plan: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """Run the worker on 2 processes; return each rank's results."""
    plan_path = out / "plan.json"
    plan_path.write_text(json.dumps(plan))
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(WORKER), "--plan", str(plan_path), "--out", str(out),
    ]  # fmt: skip
    run_killing_group(command, TORCHRUN_TIMEOUT_S, "torchrun")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.usefixtures("deepspeed_ops_built")
@pytest.mark.parametrize("stage", [2, 3])
def test_guarded_trainer_under_zero(tiny_model_dir: Path, tmp_path: Path, stage: int) -> None:
    paths = {}
    for name, deepspeed_optimizer in (("adamw", True), ("client", False)):
        paths[name] = tmp_path / f"zero{stage}_{name}.json"
        paths[name].write_text(json.dumps(deepspeed_config(stage, deepspeed_optimizer=deepspeed_optimizer)))
    adamw, client = str(paths["adamw"]), str(paths["client"])
    runs = [
        {"name": "gspo", "trainer": "guarded", "deepspeed": adamw, "config": GSPO},
        {"name": "stock", "trainer": "stock", "deepspeed": client, "config": PARITY},
        {"name": "grpo", "trainer": "guarded", "deepspeed": client, "config": {**PARITY, "objective": "grpo"}},
    ]
    plan = {"model": str(tiny_model_dir), "runs": runs, "compare": [["stock", "grpo"]]}
    ranks = launch(plan, tmp_path)
    optimizers = {2: "DeepSpeedZeroOptimizer", 3: "DeepSpeedZeroOptimizer_Stage3"}

    for rank, result in enumerate(ranks):
        for name, steps in (("gspo", GSPO_STEPS), ("stock", PARITY_STEPS), ("grpo", PARITY_STEPS)):
            run = result["runs"][name]
            where = f"rank {rank}, run {name}: { {k: v for k, v in run.items() if k not in ('logs', 'history')} }"
            assert run["num_processes"] == 2, where
            assert run["zero_stage"] == stage and run["optimizer"] == optimizers[stage], where
            assert run["partitioned"] is (stage == 3), where
            assert run["loaded_as_saved"] == 0.0, where  # the gathered weights are the saved model's, in full
            assert run["losses_finite"] and len(run["logs"]) == steps, where
            assert run["weight_change"] > 1e-4, where
            assert [r["step"] for r in run["history"]] == [float(s) for s in range(1, steps + 1)], where
            if name == "stock":
                continue
            for record in run["logs"]:
                finite = ("rlguard/loss", "rlguard/kl_ref", "rlguard/entropy", "rlguard/clip_frac", "grad_norm")
                assert all(math.isfinite(record[k]) for k in finite), record
                assert record["rlguard/nonfinite"] == 0, record
                assert math.isclose(record["rlguard/loss"], record["loss"], rel_tol=1e-5, abs_tol=1e-7), record
            assert {"loss", "kl_ref", "entropy", "clip_frac", "ratio_max", "grad_norm"} <= set(run["history"][0])
        gspo = result["runs"]["gspo"]["logs"]
        assert any(r["rlguard/ratio_max"] != 1.0 for r in gspo), "no off-policy step: ratios never left 1"
        assert any(r["rlguard/seq_ratio_max"] != 1.0 for r in gspo)

    # every rank ends with the same weights and logs the same (reduced) metrics
    for name in ("gspo", "stock", "grpo"):
        first, second = ranks[0]["runs"][name], ranks[1]["runs"][name]
        assert first["weights_sha256"] == second["weights_sha256"], name
        assert first["logs"] == second["logs"], name
        assert first["history"] == second["history"], name

    # stock TRL and the rlguard trainer: same losses, same gradient norms, same weight updates
    stock, ours = ranks[0]["runs"]["stock"]["logs"], ranks[0]["runs"]["grpo"]["logs"]
    for a, b in zip(stock, ours, strict=True):
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-6, abs_tol=1e-9), (a, b)
        assert math.isclose(a["grad_norm"], b["grad_norm"], rel_tol=1e-6), (a, b)
        assert math.isclose(a["kl"], b["kl"], rel_tol=1e-6, abs_tol=1e-9), (a, b)
        for key in ("reward", "completions/mean_length"):  # logged on steps that generated
            assert a.get(key) == b.get(key), (key, a, b)
    assert math.isclose(stock[0]["loss"], ours[0]["loss"], rel_tol=1e-7), "the first step's loss must be exact"
    compared = ranks[0]["compared"]["stock/grpo"]
    assert compared["scale"] > 1e-3, compared
    assert compared["max_abs_diff"] <= 1e-5 * compared["scale"], compared
