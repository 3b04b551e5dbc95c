"""One rank of ``test_trl_run.py::test_torchrun_two_processes`` (run by ``torchrun --nproc_per_node=2``).

Trains a GuardedGRPOTrainer for two optimizer steps with DDP over gloo, then compares, on this rank's own float64
batch (ranks hold different token counts), stock TRL's ``_compute_loss`` with rlguard's: with two processes
TRL's dapo normaliser divides the global token count by the number of processes. Writes ``rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from trl.trainer.grpo_trainer import GRPOTrainer

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer, StabilityCallback
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments


def parity(trainer: GuardedGRPOTrainer, rank: int) -> dict[str, float]:
    """Stock TRL vs rlguard loss and gradient on a float64 batch whose token count depends on the rank."""
    g = torch.Generator().manual_seed(100 + rank)
    B, T = 4, 5
    theta = torch.randn(B, T, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([5, 2, 0, 3]) if rank == 0 else torch.tensor([5, 5, 4, 1])
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
    local = mask.sum()
    total = local.clone()
    torch.distributed.all_reduce(total)  # TRL gathers the generation batch's token count over processes
    inputs: dict[str, Any] = {
        "prompt_ids": torch.randint(3, 15, (B, 2), generator=g),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.randint(3, 15, (B, T), generator=g),
        "completion_mask": mask,
        "advantages": torch.randn(B, generator=g, dtype=torch.float64),
        "num_items_in_batch": total * trainer.args.steps_per_generation,
        "old_per_token_logps": -F.softplus(theta.detach()) + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "ref_per_token_logps": -F.softplus(theta.detach()) + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64),
    }

    def stub(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, None]:
        return -F.softplus(theta), torch.sigmoid(theta), None

    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    trainer._get_per_token_logps_and_entropies = stub
    results = []
    for fn in (GRPOTrainer._compute_loss, GuardedGRPOTrainer._compute_loss):
        loss = fn(trainer, trainer.model, inputs)
        results.append((loss.detach(), torch.autograd.grad(loss, theta)[0]))
    del trainer._get_per_token_logps_and_entropies
    (trl_loss, trl_grad), (ours_loss, ours_grad) = results
    return {
        "tokens": float(local),
        "parity_loss": trl_loss.item(),
        "parity_loss_abs_diff": (ours_loss - trl_loss).abs().item(),
        "parity_grad_max_abs": trl_grad.abs().max().item(),
        "parity_grad_max_abs_diff": (ours_grad - trl_grad).abs().max().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    cli = parser.parse_args()
    warnings.simplefilter("ignore")
    out = Path(cli.out)
    args = GuardedGRPOConfig(
        output_dir=str(out / "run"),
        ddp_backend="gloo",
        **cpu_training_arguments(),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        max_steps=2,
        learning_rate=1e-3,
        beta=0.04,
        loss_type="dapo",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    callback = StabilityCallback()
    trainer = GuardedGRPOTrainer(
        model=cli.model,
        reward_funcs=addition_reward,
        args=args,
        train_dataset=addition_dataset(64),
        callbacks=[callback],
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    rank = trainer.accelerator.process_index
    logs = [r for r in trainer.state.log_history if "rlguard/loss" in r]
    summary = {
        "num_processes": trainer.accelerator.num_processes,
        "weight_change": max((after[n] - before[n]).abs().max().item() for n in before),
        "weights_checksum": repr(sum(p.double().sum().item() for p in after.values())),
        "rlguard_logged_steps": len(logs),
        "losses_finite": all(math.isfinite(r["loss"]) and math.isfinite(r["rlguard/loss"]) for r in logs),
        "history": callback.history,
        **parity(trainer, rank),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    from torchrun_exit import shut_down

    main()
    shut_down()
