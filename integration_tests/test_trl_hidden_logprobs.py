"""A real ``GuardedGRPOTrainer`` run with ``logprobs_from_hidden=True`` takes the same optimizer steps as one with
TRL's fused LM head: the same logged losses, entropies and final weights, to float32 precision.

Both runs start from the same saved tiny Llama with the same seed, so they sample the same completions as long as
their weights agree (they differ by float32 rounding of two chunked log-softmax implementations).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, make_tiny_llama, save_tiny_llama

pytestmark = [
    pytest.mark.slow,
    # transformers deprecated the name; TRL 1.16 still calls it while generating
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

STEPS = 4
RUN: dict[str, Any] = {
    **cpu_training_arguments(),
    "use_vllm": False,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 6,
    "learning_rate": 1e-3,
    "temperature": 0.8,
    "beta": 0.04,
    "loss_type": "dapo",
    "max_steps": STEPS,
    "logging_steps": 1,
    "save_strategy": "no",
    "disable_tqdm": True,
    "seed": 0,
}


def train(model_dir: Path, out: Path, flag: bool) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    args = GuardedGRPOConfig(output_dir=str(out), logprobs_from_hidden=flag, guard="monitor", **RUN)
    trainer = GuardedGRPOTrainer(
        model=str(model_dir), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(32)
    )
    trainer.train()
    logs = [r for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r]
    return logs, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_training_with_the_flag_equals_training_with_trl_kernel(tmp_path: Path) -> None:
    model_dir = save_tiny_llama(tmp_path / "model")
    trl_logs, trl_weights = train(model_dir, tmp_path / "trl", flag=False)
    logs, weights = train(model_dir, tmp_path / "rlguard", flag=True)
    assert len(logs) == len(trl_logs) == STEPS
    for ours, theirs in zip(logs, trl_logs, strict=True):
        assert ours["completions/mean_length"] == theirs["completions/mean_length"]  # same samples
        for key in ("loss", "entropy", "kl", "rlguard/ratio_max", "grad_norm"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    initial = make_tiny_llama().state_dict()  # the weights save_tiny_llama wrote
    assert weights.keys() == trl_weights.keys() == initial.keys()
    for key, value in weights.items():
        torch.testing.assert_close(value, trl_weights[key], rtol=1e-4, atol=1e-5)
    moved = float((trl_weights["lm_head.weight"] - initial["lm_head.weight"]).abs().max())
    assert moved > 1e-3  # training moved the weights far beyond the tolerance
