"""A ``GuardedGRPOTrainer`` on the tiny Llama at a temperature, with token batches and TRL loss inputs, for the
tests of the log-probs from hidden states and of the fused objective in TRL (``tests/adapters/trl/test_logprobs.py``,
``test_fused.py``). Imports TRL: import it after ``pytest.importorskip("trl")``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, make_tokenizer

B, P, T = 5, 4, 6
TEMPERATURE = 0.7


def tiny_config(out: Path, **overrides: Any) -> GuardedGRPOConfig:
    return GuardedGRPOConfig(
        output_dir=str(out),
        **cpu_training_arguments(),
        use_vllm=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=T,
        temperature=TEMPERATURE,
        save_strategy="no",
        disable_tqdm=True,
        **overrides,
    )


def tiny_trainer(model: Any, out: Path, **overrides: Any) -> GuardedGRPOTrainer:
    trainer = GuardedGRPOTrainer(
        model=model,
        processing_class=make_tokenizer(),
        reward_funcs=addition_reward,
        args=tiny_config(out, **overrides),
        train_dataset=addition_dataset(8),
    )
    trainer.model.train()  # type: ignore[union-attr]
    return trainer


def token_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``(B, P + T)``: left-padded prompts, completions padded on the right, one
    row with no completion token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 15, (B, P + T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding of the prompt
    mask[1, P + 3 :] = 0  # a short completion
    mask[2, P:] = 0  # no completion token
    return ids, mask


def policy_inputs(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    ids, mask = token_batch(seed)
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    return {
        "prompt_ids": ids[:, :P],
        "prompt_mask": mask[:, :P],
        "completion_ids": ids[:, P:],
        "completion_mask": mask[:, P:],
        "advantages": signs * (0.5 + torch.rand(B, generator=g)),
        "old_per_token_logps": -2.5 + 0.3 * torch.randn(B, T, generator=g),
        "ref_per_token_logps": -2.5 + 0.3 * torch.randn(B, T, generator=g),
        "num_items_in_batch": mask[:, P:].sum() * 2,
    }
