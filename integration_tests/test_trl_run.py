"""Real ``GuardedGRPOTrainer`` and ``trl.GRPOTrainer`` runs on CPU with the tiny Llama: every objective trains,
the rlguard trainer takes the same optimizer steps as stock TRL, the callback records every step, and the same
holds under ``torchrun --nproc_per_node=2`` (gloo).

Run with ``pytest integration_tests`` (about two minutes on two CPU cores); ``testpaths`` holds the unit tests only.
Facts these runs rely on: ``GRPOConfig`` defaults to ``bf16=True`` and activation checkpointing, both off here;
the default learning rate (1e-6) barely moves the weights, so the runs use 1e-3.
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
import torch

pytest.importorskip("trl")

from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer, StabilityCallback
from rlguard.core_losses.objectives import BUILTIN_OBJECTIVES
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

pytestmark = [
    pytest.mark.slow,
    # transformers deprecated the name; TRL 1.16 still calls it while generating
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

WORKER = Path(__file__).with_name("trl_ddp_worker.py")
TORCHRUN_TIMEOUT_S = 300

RUN: dict[str, Any] = {
    **cpu_training_arguments(),
    "use_vllm": False,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 4,
    "learning_rate": 1e-3,
    "logging_steps": 1,
    "save_strategy": "no",
    "disable_tqdm": True,
    "seed": 0,
}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama and its tokenizer, saved once; TRL loads both (and the reference model) from the folder."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train(
    trainer_cls: type[GRPOTrainer], model_dir: Path, args: GRPOConfig, **kwargs: Any
) -> tuple[GRPOTrainer, dict, dict]:
    trainer = trainer_cls(
        model=str(model_dir), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(64), **kwargs
    )
    before = parameters(trainer.model)
    trainer.train()
    return trainer, before, parameters(trainer.model)


# the loss_type whose aggregation is each objective's own, and TRL's clip settings for it
OBJECTIVE_RUNS = {
    "grpo": {"loss_type": "grpo"},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "dapo": {"loss_type": "dapo", "epsilon_high": 0.28},
    "gspo": {"loss_type": "grpo", "epsilon": 3e-4, "epsilon_high": 4e-4},
    "gspo_token": {"loss_type": "grpo", "epsilon": 3e-4, "epsilon_high": 4e-4},
    "cispo": {"loss_type": "cispo", "epsilon_high": 5.0},
    "sapo": {"loss_type": "sapo"},
    "gmpo": {"loss_type": "grpo"},
    "luspo": {
        "loss_type": "luspo",
        "importance_sampling_level": "sequence",
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
        "use_bias_correction_kl": False,  # TRL weights a sequence-level KL by the sequence ratio (a known difference)
    },
    "vespo": {"loss_type": "vespo"},
    "clip_cov": {"loss_type": "dapo"},
    "kl_cov": {"loss_type": "dapo"},
    "gpg": {"loss_type": "dapo"},
    "dppo_tv": {"loss_type": "dapo"},
    "dppo_kl": {"loss_type": "dapo"},
    "dro": {"loss_type": "dapo"},
}


def test_every_builtin_objective_has_a_run() -> None:
    assert sorted(OBJECTIVE_RUNS) == sorted(cls.name for cls in BUILTIN_OBJECTIVES)


@pytest.mark.parametrize("objective", sorted(OBJECTIVE_RUNS))
def test_guarded_trainer_trains_every_objective(tiny_model_dir: Path, tmp_path: Path, objective: str) -> None:
    args = GuardedGRPOConfig(
        output_dir=str(tmp_path),
        objective=objective,
        beta=0.04,
        num_iterations=2,  # the second pass over a batch is off-policy: ratios differ from 1
        max_steps=4,
        **RUN,
        **OBJECTIVE_RUNS[objective],
    )
    trainer, before, after = train(GuardedGRPOTrainer, tiny_model_dir, args)
    assert trainer.rlguard_mapping.objective == objective
    logs = [r for r in trainer.state.log_history if "rlguard/loss" in r]
    assert len(logs) == 4
    for record in logs:
        assert all(math.isfinite(record[k]) for k in ("loss", "rlguard/loss", "rlguard/kl_ref", "rlguard/entropy"))
        assert record["rlguard/nonfinite"] == 0
    assert any(r["rlguard/ratio_max"] != 1.0 for r in logs), "no off-policy step: ratios never left 1"
    changed = max((after[n] - before[n]).abs().max().item() for n in before)
    assert changed > 1e-4, f"weights did not move: max |delta| = {changed}"


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_guarded_trainer_takes_the_same_steps_as_trl(tiny_model_dir: Path, tmp_path: Path, loss_type: str) -> None:
    """Same seed, same batches: stock TRL and GuardedGRPOTrainer move every weight alike over two optimizer steps
    with gradient accumulation 2 and a generation batch of 4 micro-batches (so GA != steps_per_generation).
    Plain SGD keeps the weight change proportional to the gradient (Adam would amplify rounding noise)."""
    common = {
        **RUN,
        "loss_type": loss_type,
        "beta": 0.04,
        "gradient_accumulation_steps": 2,
        "steps_per_generation": 4,
        "max_steps": 2,
        "optim": "sgd",
        "learning_rate": 0.5,
        "lr_scheduler_type": "constant",
    }
    _, before, stock = train(GRPOTrainer, tiny_model_dir, GRPOConfig(output_dir=str(tmp_path / "trl"), **common))
    _, before2, ours = train(
        GuardedGRPOTrainer, tiny_model_dir, GuardedGRPOConfig(output_dir=str(tmp_path / "ours"), **common)
    )
    deltas = {n: stock[n] - before[n] for n in before}
    scale = max(d.abs().max().item() for d in deltas.values())
    assert scale > 1e-4, "the steps must move the weights"
    for name in before:
        torch.testing.assert_close(before2[name], before[name], rtol=0, atol=0)
        torch.testing.assert_close(ours[name] - before[name], deltas[name], rtol=0, atol=1e-5 * scale)


def test_stability_callback_on_a_stock_trainer(tiny_model_dir: Path, tmp_path: Path) -> None:
    callback = StabilityCallback()
    args = GRPOConfig(
        output_dir=str(tmp_path), **{**RUN, "logging_steps": 10}, max_steps=3, beta=0.04, loss_type="grpo"
    )
    train(GRPOTrainer, tiny_model_dir, args, callbacks=[callback])
    assert [r["step"] for r in callback.history] == [1.0, 2.0, 3.0]  # every step, although logging_steps=10
    expected = {"loss", "entropy", "kl_ref", "clip_frac", "reward_mean", "reward_std", "length_mean", "grad_norm", "lr"}
    for record in callback.history:
        assert expected <= set(record), sorted(expected - set(record))
        assert all(math.isfinite(v) for v in record.values())
    assert callback.last == callback.history[-1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_torchrun_two_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(WORKER), "--model", str(tiny_model_dir), "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish within {TORCHRUN_TIMEOUT_S} s:\n{exc.stderr!s}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    for rank, summary in enumerate(ranks):
        where = f"rank {rank}: {summary}"
        assert summary["num_processes"] == 2, where
        assert summary["tokens"] > 0, where
        assert summary["parity_loss_abs_diff"] <= 1e-9 * max(1.0, abs(summary["parity_loss"])), where
        assert summary["parity_grad_max_abs"] > 1e-6, where
        assert summary["parity_grad_max_abs_diff"] <= 1e-9 * summary["parity_grad_max_abs"], where
        assert summary["weight_change"] > 1e-4, where
        assert summary["rlguard_logged_steps"] == 2 and summary["losses_finite"], where
    assert ranks[0]["tokens"] != ranks[1]["tokens"], "the parity check needs unequal token counts per rank"
    assert ranks[0]["weights_checksum"] == ranks[1]["weights_checksum"]  # DDP kept the replicas identical
    assert ranks[0]["history"] == ranks[1]["history"]  # TRL reduces its metrics: every rank records the same stats
    assert len(ranks[0]["history"]) == 2
